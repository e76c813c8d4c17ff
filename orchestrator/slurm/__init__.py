"""Everything said to or read from SLURM: commands, the site's limits, errors, options and sbatch templates."""
