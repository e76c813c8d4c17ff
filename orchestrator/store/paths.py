"""Every path inside a sweep folder, owned by one object.

A sweep folder looks like this::

    SWEEP_DIR/
      sweep.json                  what was asked: command line, overrides, when (one entry per `sweep` call)
      skipped.jsonl               cells refused before submission, with the reason (one JSON object a line)
      cells/<cell_id>/cell.yaml   the cell's resolved config (written before submission)
      cells/<cell_id>/record.json the probe's record (written atomically by rank 0 inside the job)
      cells/<cell_id>/record.attempt<N>.json  the record of attempt N, kept when a resume replaced it
      cells/<cell_id>/attempts.jsonl  one line per submission of the cell: job id, attempt, time
      adaptive.json               an adaptive sweep's goal, rounds and why it stopped (orchestrator/store/adaptive_state.py)
      adaptive-grid.jsonl         an adaptive sweep's every cell, measured or not (a cell gets cells/<id>/ once chosen)
      jobs/<job_id>/              submitit's files for one job: pickles, stdout/stderr of each task
      profiles/<identity>.json    the machine's measured rates, one per hardware identity (orchestrator/profile/)
      cells.csv, ...              the report's tables (see analysis/)

Nothing else in the toolkit builds a path into a sweep folder by hand.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

RECORD_NAME = "record.json"
CELL_CONFIG_NAME = "cell.yaml"


@dataclass(frozen=True)
class SweepPaths:
    """The layout of one sweep folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).absolute())

    @property
    def sweep_log(self) -> Path:
        return self.root / "sweep.json"

    @property
    def skipped(self) -> Path:
        return self.root / "skipped.jsonl"

    @property
    def adaptive_state(self) -> Path:
        return self.root / "adaptive.json"

    @property
    def adaptive_grid(self) -> Path:
        return self.root / "adaptive-grid.jsonl"

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def lock(self) -> Path:
        return self.root / ".submit.lock"

    @property
    def profiles_dir(self) -> Path:
        return self.root / "profiles"

    def profile(self, key: str) -> Path:
        """The profile of the hardware whose identity has ``key`` (``orchestrator.profile.identity``)."""
        return self.profiles_dir / f"{key}.json"

    def cell_dir(self, cell_id: str) -> Path:
        return self.cells_dir / cell_id

    def cell_config(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / CELL_CONFIG_NAME

    def record(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / RECORD_NAME

    def archived_record(self, cell_id: str, attempt: int, corrupt: bool = False) -> Path:
        """Where the record of an earlier attempt is kept when a new attempt replaces it (never overwritten)."""
        kind = "corrupt-attempt" if corrupt else "attempt"
        target = self.cell_dir(cell_id) / f"record.{kind}{attempt}.json"
        n = 1
        while target.exists():
            n += 1
            target = self.cell_dir(cell_id) / f"record.{kind}{attempt}.{n}.json"
        return target

    def attempts(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "attempts.jsonl"

    def submitit_folder(self) -> Path:
        """Folder pattern handed to submitit; ``%j`` becomes the job id (``ARRAYID_TASK`` for arrays)."""
        return self.jobs_dir / "%j"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def cell_ids(self) -> list[str]:
        """Ids of every cell written into this sweep, sorted: the real folders under ``cells/`` that hold a
        ``cell.yaml`` (a link is never followed into another cell; see :meth:`damaged_cells`)."""
        if not self.cells_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.cells_dir.iterdir() if not p.is_symlink() and (p / CELL_CONFIG_NAME).is_file()
        )

    @staticmethod
    def named(cell_ids: list[str], name: str) -> list[str]:
        """The cells a name on the command line means: the cell of that id, else every cell whose id starts with it
        (one match names a cell; none or several is the caller's to refuse)."""
        return [c for c in cell_ids if c == name] or [c for c in cell_ids if c.startswith(name)]

    def sweeps_inside_hint(self, most: int = 5) -> str:
        """``; the sweep folders inside it: ...`` (shell-quoted, the last ``most`` by name: ``sweeps/demo`` holds
        one per date), or an empty string where this folder holds none."""
        try:
            found = sorted(p for p in self.root.iterdir() if p.is_dir() and SweepPaths(p).cell_ids())[-most:]
        except OSError:
            return ""
        return f"; the sweep folders inside it: {shlex.join(str(p) for p in found)}" if found else ""

    def damaged_cells(self) -> list[str]:
        """Why each entry under ``cells/`` that is not a cell is not one (a link, a file, a folder without
        ``cell.yaml``, one that cannot be read), one line each, sorted; ``status``, ``show`` and ``resume`` say
        these, so no cell drops out of a sweep silently."""
        try:
            entries = sorted(os.scandir(self.cells_dir), key=lambda e: e.name)  # type info without a stat each
        except FileNotFoundError:
            return []
        except OSError as e:
            return [f"{self.cells_dir}: cannot be read ({e.strerror or type(e).__name__})"]
        out = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            where = f"cells/{entry.name}"
            if entry.is_symlink():
                out.append(f"{where} is a link (to {os.readlink(entry.path)}), not a cell folder; it is not followed")
            elif not entry.is_dir(follow_symlinks=False):
                out.append(f"{where} is a file, not a cell folder")
            elif not os.path.isfile(os.path.join(entry.path, CELL_CONFIG_NAME)):
                try:
                    held = ", ".join(sorted(os.listdir(entry.path))[:5]) or "nothing"
                except OSError as e:
                    out.append(f"{where} cannot be read ({e.strerror or type(e).__name__})")
                    continue
                out.append(f"{where} has no {CELL_CONFIG_NAME} (it holds {held}); its cell cannot be shown or rerun")
        return out

    def output(self, name: str) -> Path:
        return self.root / name

    def check_not_loose(self) -> None:
        """Raise LooseSweepFolder where anyone on the machine may write the sweep folder, or its ``jobs/`` or
        ``cells/`` (world-writable without the sticky bit): the jobs load the pickles and configs in them, so
        whoever can replace those runs code as the user (as ssh refuses a loose ``~/.ssh``). Group-writable is
        fine: a shared project folder is a choice."""
        for folder in (self.root, self.jobs_dir, self.cells_dir):
            try:
                mode = os.stat(folder).st_mode
            except OSError:
                continue  # not there yet: created with the user's umask
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                raise LooseSweepFolder(folder, stat.S_IMODE(mode))


class LooseSweepFolder(PermissionError):
    """A sweep folder anyone on the machine may write: refused before anything is submitted or run (exit 2)."""

    def __init__(self, folder: Path, mode: int) -> None:
        super().__init__(
            errno.EPERM,
            f"anyone on this machine may write it (mode {mode:o}: world-writable, not sticky), and its jobs load "
            f"the pickles and configs in it; nothing was submitted. Fix it with: chmod o-w {shlex.quote(str(folder))}",
            str(folder),
        )


MAX_READ_BYTES = 64 * 2**20
"""The most a record or cell config is read of: a larger file is damaged, not a record."""


def read_regular_file(path: Path, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular file at ``path``: anything else (a FIFO, a device, a socket) raises OSError without
    being waited on, and so does a file larger than ``max_bytes``; FileNotFoundError where there is nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once without a writer; reading would block
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
            raise OSError(errno.EINVAL, f"it is {kind}, not a regular file")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"it holds {st.st_size} bytes, more than any record ({max_bytes})")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > max_bytes:
                raise OSError(errno.EFBIG, f"it grew past {max_bytes} bytes while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)
