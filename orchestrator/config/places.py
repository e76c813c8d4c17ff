"""Where gpudays' own files are: the Hydra config groups (``conf/``) and the sbatch preamble templates
(``sbatch_templates/``), beside the packages."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
"""The config groups (model, gpu, method, cluster, probe, experiment)."""
SBATCH_TEMPLATES_DIR = ROOT / "sbatch_templates"
"""The package's own sbatch templates; a ``-cd`` folder's ``sbatch_templates/`` is searched first."""
