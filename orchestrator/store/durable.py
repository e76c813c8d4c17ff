"""Writing files so that a crash, a kill or a full disk never leaves half of one.

Every file gpudays writes goes through here. A whole file is written to a temporary file in the same folder,
flushed to disk (fsync) and renamed over the target, so a reader sees the old file or the whole new one; the folder
is fsynced where the rename itself must survive a power cut. A line appended to a log (``attempts.jsonl``) starts
on a line of its own even after a line a crash cut short, and is flushed before the caller goes on. A write that
fails (no space left, a quota, a read-only file system) removes its temporary file, keeps the old file, and raises
:class:`WriteFailed` naming the file, which the command line turns into its own exit code.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

FULL_OR_BROKEN = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})
"""Errors of a write that no other folder would have avoided (a full disk, a quota, a failing or read-only file
system): the command line's exit 5. A folder that cannot be written for its own sake (a file in the way, no
permission, a name too long) is bad input."""


class WriteFailed(OSError):
    """A file could not be written; the old one, if any, is as it was. ``str()`` names the file and the cause."""

    def __init__(self, path: Path, cause: OSError, kept: str = "the old file, if any, is kept") -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.path = path
        self.kept = kept

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.strerror}; {self.kept}"


def refused_write(error: BaseException, where: Path, kept: str) -> BaseException:
    """``error`` as WriteFailed (naming its file, else ``where``) when it is a write a full or broken file system
    refused, such as one a library made for gpudays; else ``error`` itself."""
    if isinstance(error, OSError) and not isinstance(error, WriteFailed) and error.errno in FULL_OR_BROKEN:
        return WriteFailed(Path(error.filename or where), error, kept)
    return error


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename or a new file in it) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: Path) -> tuple[IO[bytes], Path]:
    """An open temporary file beside ``path``, with the mode ``path`` has (or a new file would get)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        mode = 0o666 & ~mask
    os.fchmod(fd, mode)
    return os.fdopen(fd, "wb"), Path(tmp)


def write_with(path: Path, fill: Callable[[IO[bytes]], None], durable: bool = True) -> None:
    """Write ``path`` atomically from ``fill`` (which writes into the open temporary file); see the module doc.

    ``durable=False`` skips the fsyncs (still atomic for readers, not across a power cut): for folders made up to be
    read, such as the synthetic sweeps of benchmarks and tests.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f, tmp = _temporary(path)
    except OSError as e:
        raise WriteFailed(path, e) from e
    try:
        with f:
            fill(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, WriteFailed):
            raise WriteFailed(path, e) from e
        raise


def write_bytes_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`write_with`)."""
    write_with(path, lambda f: _write_all(f, data), durable)


def _write_all(f: IO[bytes], data: bytes) -> None:
    f.write(data)


def write_text_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`write_with`)."""
    write_bytes_atomic(path, text.encode(), durable)


def write_json_atomic(path: Path, payload: Any, durable: bool = True) -> None:
    """Write JSON so that a reader sees the old file or the whole new one, never half of it."""
    text = json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"
    write_text_atomic(path, text, durable)


def append_line(path: Path, line: str, durable: bool = True) -> int:
    """Append ``line`` (a newline is added) on a line of its own, even after a line a crash cut short; returns the
    file's size before, for :func:`truncate_to`. A failed append is cut back off and raises WriteFailed."""
    data = line.rstrip("\n").encode() + b"\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        raise WriteFailed(path, e) from e
    size = 0
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(28, "No space left on device (the line was written in part)")
        if durable:
            os.fsync(fd)
            if created:
                fsync_dir(path.parent)
    except OSError as e:
        try:
            os.ftruncate(fd, size)
            if created:  # an empty file would say a cell has a submission log, with nothing in it
                path.unlink()
        except OSError:
            pass  # a reader skips a line cut short
        raise WriteFailed(path, e, "the line was not added") from e
    finally:
        os.close(fd)
    return size


def truncate_to(path: Path, size: int) -> None:
    """Undo appends: cut ``path`` back to ``size`` bytes (remove it where it was created, ``size`` 0)."""
    try:
        if size == 0:
            path.unlink(missing_ok=True)
        else:
            os.truncate(path, size)
    except OSError:
        pass  # best effort: a reader skips what it cannot use


def append_jsonl(path: Path, payload: Any, durable: bool = True) -> None:
    """Add one JSON line to a small log (``sweep.json``, ``skipped.jsonl``) by writing the whole file anew, so a
    full disk leaves the old file as it was, never an empty or half-written one."""
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    except OSError as e:
        raise WriteFailed(path, e) from e
    if old and not old.endswith(b"\n"):
        old += b"\n"
    line = json.dumps(payload, sort_keys=True, default=str).encode() + b"\n"
    write_bytes_atomic(path, old + line, durable)


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """Write a set of files into ``target`` all or nothing: the block writes them into the new folder it is given
    (beside ``target``'s files, under a hidden name); when it ends without an error each file is flushed and renamed
    into ``target``, else the new folder is removed and the old files stay as they were. A failed write raises
    WriteFailed naming the file (as it would be in ``target``)."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        new = Path(tempfile.mkdtemp(prefix=".writing.", dir=target))
    except OSError as e:
        raise WriteFailed(target, e) from e
    failing: Path | None = None
    try:
        yield new
        names = sorted(p.name for p in new.iterdir())
        for name in names:
            failing = new / name
            with open(failing, "rb+") as f:
                os.fsync(f.fileno())
        for name in names:
            failing = new / name
            os.replace(failing, target / name)
        failing = None
        fsync_dir(target)
    except BaseException as e:
        if isinstance(e, OSError) and not isinstance(e, WriteFailed):
            if failing is None:
                failing = Path(e.filename) if e.filename else _newest(new)
            raise WriteFailed(target / (failing.name if failing else ""), e, "the old files are kept") from e
        raise
    finally:
        shutil.rmtree(new, ignore_errors=True)


def _newest(folder: Path) -> Path | None:
    """The file written last in ``folder`` (the one a write without a file name failed on)."""
    try:
        return max(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns, default=None)
    except OSError:
        return None
