#!/bin/bash

# Parameters
#SBATCH --account=mylab
#SBATCH --cpus-per-task=8
#SBATCH --error=/sweeps/demo/jobs/%j/%j_0_log.err
#SBATCH --gres=gpu:a100_80gb:4
#SBATCH --hold
#SBATCH --job-name=gpudays
#SBATCH --mem=256GB
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=/sweeps/demo/jobs/%j/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --qos=normal
#SBATCH --requeue
#SBATCH --signal=USR2@90
#SBATCH --time=17

# setup
# gpudays: environment for the probe
export SRUN_CPUS_PER_TASK=8
export OMP_NUM_THREADS=8
export NCCL_DEBUG=WARN
export NCCL_IB_DISABLE=0
module load cuda/12.4
source "$HOME/miniconda3/etc/profile.d/conda.sh"
conda activate gpudays
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
case "${SLURM_EXPORT_ENV:-}" in [Nn][Oo][Nn][Ee]*) echo "gpudays: this job was submitted with --export=$SLURM_EXPORT_ENV; its ranks are started with srun --export=ALL (this script's environment)" >&2;; esac

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /sweeps/demo/jobs/%j/%j_%t_log.out --error /sweeps/demo/jobs/%j/%j_%t_log.err --cpus-per-task=8 --kill-on-bad-exit=1 --export=ALL python -u -m submitit.core._submit /sweeps/demo/jobs/%j
