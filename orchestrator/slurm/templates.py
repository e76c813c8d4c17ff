"""Where a cluster's sbatch preamble template is found: a ``-cd`` folder's ``sbatch_templates/`` first, then the
package's own ``sbatch_templates/``.

A site's template lives with its cluster file (``my-conf/cluster/my-site.yaml`` beside
``my-conf/sbatch_templates/my-site.sh.j2``), not inside the installed package. Planning turns a name found in a
``-cd`` folder into that file's absolute path in the cell's config, so that ``--dry-run``, the submission and a
later ``resume`` (which has no ``-cd``) all render the same file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from orchestrator.config.schema import Config

FOLDER = "sbatch_templates"
"""The folder of a ``-cd`` folder that holds its templates."""


def find(name: str, search_dirs: Sequence[Path]) -> Path | None:
    """The template ``name`` in a ``-cd`` folder's ``sbatch_templates/`` (the first that has it), else None."""
    if Path(name).is_absolute():
        return None
    for folder in search_dirs:
        candidate = Path(folder) / FOLDER / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def resolved(cell: Config, search_dirs: Sequence[Path]) -> Config:
    """The cell with ``cluster.template`` as an absolute path where a ``-cd`` folder holds it; else as it was."""
    found = find(cell.cluster.template, search_dirs)
    if found is None:
        return cell
    return replace(cell, cluster=replace(cell.cluster, template=str(found)))
