"""Compiled code kept between cells and jobs: DeepSpeed's native ops and Inductor's kernels, one cache per user.

DeepSpeed compiles its ops at first use (``deepspeed_shm_comm`` when a CPU process group starts, ``cpu_adam`` for
optimizer offload) through torch.utils.cpp_extension, which writes a ninja file into
``$TORCH_EXTENSIONS_DIR/<op>/`` and lets ninja rebuild whenever a compile command differs from the last one it ran
there. The command holds absolute paths: DeepSpeed's sources and include directory, torch's and Python's headers,
all spelt as the modules were imported (``os.path.abspath``, which keeps symbolic links). A virtual environment
reached through two spellings (a symlinked ``.venv`` in one checkout, the real directory in another, or a job
started with another ``sys.executable``) gives two commands for one op, and runs that alternate between them rebuild
it every time, each writer replacing the other's object files. The compiler (``$CXX``) is the other part of the
command that differs between environments (a module loaded by a cluster's ``setup`` lines). The CPU is the third:
DeepSpeed builds its CPU ops with ``-march=native`` and the SIMD width it finds, so an op built on a node with
AVX-512 dies of SIGILL on one without it, and a cluster of mixed node types would rebuild it back and forth.

So, before torch is imported, the probe:

* resolves every ``sys.path`` entry to its real path, so that torch and DeepSpeed are imported, and their paths
  spelt, the same way however Python was started;
* sets ``TORCH_EXTENSIONS_DIR`` (unless the user set it) to a fixed per-user folder named after the Python and torch
  versions, the environment (the real paths of the Python, torch and DeepSpeed whose paths the compile command
  holds), the CPU's instruction set (its architecture and the SIMD and crypto extensions /proc/cpuinfo lists)
  and, when ``$CXX`` is set, the compiler's real path, so that two environments, two compilers or two node types
  never share a build: each keeps its own, and none rebuilds the op another's last run replaced;
* sets ``TORCHINDUCTOR_CACHE_DIR`` (unless set) to a fixed per-user folder, so that compiled kernels and graphs
  (Inductor's FX-graph and AOTAutograd caches) serve every later cell and job of this user, not only this
  machine's ``/tmp``.

The root is ``$GPUDAYS_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpudays``, else ``~/.cache/gpudays``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path

CACHE_DIR_ENV = "GPUDAYS_CACHE_DIR"


def cache_root(environ: MutableMapping[str, str] | None = None) -> Path:
    """The per-user folder under which compiled code is kept."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV]).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpudays"


ISA_FLAG_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "bmi", "aes", "sha", "asimd", "sve", "bf16", "i8mm")
"""The /proc/cpuinfo flags a ``-march=native`` build may use (x86's SIMD and crypto extensions, Arm's ``Features``);
the others (``hypervisor``, ``constant_tsc``, microcode and bug flags) differ between nodes of one type."""


def cpu_isa(cpuinfo: str | None = None) -> str:
    """``x86_64-<hash>`` of the CPU's instruction-set extensions (from /proc/cpuinfo), or the architecture alone
    where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(f for f in value.split() if f.startswith(ISA_FLAG_PREFIXES))
            break
    arch = platform.machine() or "cpu"
    return f"{arch}-{hashlib.sha256(' '.join(sorted(flags)).encode()).hexdigest()[:8]}" if flags else arch


def environment_id(locations: Sequence[str] | None = None) -> str:
    """``env<hash>`` of the real paths of Python's installation and of the torch and DeepSpeed packages (found, not
    imported): the compile command spells them, so two environments never build one op in one folder."""
    if locations is None:
        found = []
        for package in ("torch", "deepspeed"):
            try:
                spec = importlib.util.find_spec(package)
            except (ImportError, ValueError):
                spec = None
            found.append(spec.origin if spec is not None and spec.origin else "-")
        locations = [sys.base_prefix, *found]
    real = [os.path.realpath(p) if p != "-" else p for p in locations]
    return "env" + hashlib.sha256("\n".join(real).encode()).hexdigest()[:8]


def extensions_dir_name(
    environ: MutableMapping[str, str] | None = None, cpuinfo: str | None = None, locations: Sequence[str] | None = None
) -> str:
    """``py311-torch2.13.0+cpu-env<hash>-x86_64-<isa hash>`` (:func:`environment_id` of ``locations``, by default
    this environment's), and ``-cxx<hash>`` of the compiler's real path when ``$CXX`` names one."""
    env = os.environ if environ is None else environ
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "unknown"
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    name = f"{python}-torch{torch_version}-{environment_id(locations)}-{cpu_isa(cpuinfo)}"
    cxx = env.get("CXX")
    if cxx:
        found = shutil.which(cxx.split()[0]) if cxx.split() else None
        compiler = os.path.realpath(found) if found else cxx
        name += "-cxx" + hashlib.sha256(compiler.encode()).hexdigest()[:8]
    return name


def canonical_sys_path(path: list[str]) -> list[str]:
    """``path`` with each existing folder resolved to its real path (links followed), order and the rest kept."""
    return [os.path.realpath(p) if p and os.path.isdir(p) else p for p in path]


def pin_build_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Pin what the op and kernel builds depend on (see the module docstring); returns the settings, for the record.

    Call before torch is imported: once it is, its paths are spelt and resolving ``sys.path`` changes nothing.
    """
    env = os.environ if environ is None else environ
    if "torch" not in sys.modules:
        sys.path[:] = canonical_sys_path(sys.path)
    root = cache_root(env)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(root / "torch_extensions" / extensions_dir_name(env)))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    return {key: env[key] for key in ("TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR")}
