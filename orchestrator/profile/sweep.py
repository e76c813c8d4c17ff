"""A sweep's own profiles: which hardware its cells run on, whether its folder holds a profile of each, the runs
that measured them, and the profiles its predictions use.

A sweep needs one profile per GPU type (the cells' ``gpu.name``) and node layout: as many GPUs a node as its
widest cell of that type, on one node, or on two where a cell of that type spans several (so that the
inter-node link is measured). A profile fits a need where it holds that GPU type, layout and backend; on this
machine, where its whole identity is this machine's (CPU model and torch build too).

A profile's identity names the GPU as torch does (``NVIDIA H100 80GB HBM3``); the sweep knows it by its config
name (``h100-80gb``). ``profiles/gpus.jsonl`` keeps which config name each profile of the folder was measured for;
a profile not named there is known by its identity's GPU name (``cpu`` for both). ``profiles/runs.jsonl`` keeps
each profile the sweep started (on this machine or as a SLURM job) and how it ended, so that one is never
measured twice, ``gpudays status`` can show it, and an adaptive sweep's budget counts its GPU time.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.config.schema import Config
from orchestrator.profile.identity import Identity
from orchestrator.profile.record import BadProfile, Profile, profiles_in, read_profile, write_profile
from orchestrator.store.durable import append_jsonl
from orchestrator.store.paths import SweepPaths

BUDGET_S = 120.0
"""The most a profile spends measuring (two GPU-minutes on each of its GPUs)."""
MEASURING = "deepspeed"
"""The probe kind that measures (``probe.kind``): a sweep whose cells only sleep or fail needs no profile."""
GPU_NAMES = "gpus.jsonl"
"""Beside the profiles (a ``.json`` there is a profile): which config GPU name each was measured for."""
START_S = 120.0
"""What a profile's job adds to that (start-up, imports); a job's limit is BUDGET_S + START_S, rounded up."""


@dataclass(frozen=True)
class Need:
    """A GPU type and node layout some of a sweep's cells run on."""

    gpu: str
    """The cells' ``gpu.name``."""
    gpus_per_node: int
    nodes: int
    backend: str
    """``nccl`` on GPUs, ``gloo`` where host cores stand in."""
    cluster: str
    """``local`` or ``slurm``: where the cells, and so the profile, run."""

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def describe(self) -> str:
        nodes = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.gpus_per_node} x {self.gpu}{nodes}"


@dataclass(frozen=True)
class Decision:
    """What a sweep does about one need: ``measure``, ``reuse`` (``found``), ``off`` (``probe.profile`` false, or
    no cell of it measures: ``probe.kind`` sleep or fail), or
    ``started`` (a run of it is already recorded: measured, under way, or failed; never started again)."""

    need: Need
    action: str
    found: Path | None = None


class RefusedProfile(ValueError):
    """``--profile-from`` named a sweep whose profiles are of other hardware; the message names what differs."""


def needs(configs: Iterable[Config]) -> dict[Need, list[Config]]:
    """The hardware the cells run on, each with its cells (``probe.profile`` is read from them)."""
    by_gpu: dict[tuple[str, str], list[Config]] = {}
    for cfg in configs:
        by_gpu.setdefault((cfg.gpu.name, cfg.cluster.backend), []).append(cfg)
    out: dict[Need, list[Config]] = {}
    for (gpu, cluster), cells in by_gpu.items():
        per_node = max(c.num_gpus // c.num_nodes for c in cells)
        nodes = 2 if any(c.num_nodes > 1 for c in cells) else 1
        backend = "nccl" if cells[0].gpu.accelerator == "cuda" else "gloo"
        out[Need(gpu, per_node, nodes, backend, cluster)] = cells
    return out


def gpu_names(paths: SweepPaths) -> dict[str, str]:
    """``profiles/gpus.jsonl``: the config GPU name each profile file (by stem) was measured for (the latest line
    of a file wins; a line cut short by a crash is passed over)."""
    where = paths.profiles_dir / GPU_NAMES
    try:
        lines = where.read_text().splitlines()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise BadProfile(f"{where}: cannot be read ({e.strerror or e})") from None
    out = {}
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not (isinstance(row, dict) and isinstance(row.get("file"), str) and isinstance(row.get("gpu"), str)):
            raise BadProfile(f'{where}: line {number}: expected {{"file": profile file name, "gpu": GPU config name}}')
        out[row["file"]] = row["gpu"]
    return out


def keep(paths: SweepPaths, profile: Profile, gpu: str) -> Path:
    """Write ``profile`` into the folder as measured for the config GPU ``gpu``."""
    where = write_profile(paths, profile)
    append_jsonl(paths.profiles_dir / GPU_NAMES, {"file": where.stem, "gpu": gpu})
    return where


def _gpu_of(path: Path, profile: Profile, names: Mapping[str, str]) -> str:
    return names.get(path.stem, profile.identity.gpu_name)


def fits(need: Need, gpu: str, identity: Identity, here: Identity | None) -> bool:
    """Whether a profile (``identity``, measured for config GPU ``gpu``) is one of ``need``'s hardware; ``here``:
    this machine's identity, where the need's cells run on it (then the whole identity must be equal)."""
    if here is not None:
        return identity == here and gpu == need.gpu
    same = (identity.gpus_per_node, identity.nodes, identity.backend) == (need.gpus_per_node, need.nodes, need.backend)
    return same and gpu == need.gpu


def _found(paths: SweepPaths, need: Need, here: Identity | None) -> list[tuple[Path, Profile, str]]:
    names = gpu_names(paths)
    found = [(p, read_profile(p)) for p in profiles_in(paths)]
    return [
        (p, prof, _gpu_of(p, prof, names))
        for p, prof in found
        if fits(need, _gpu_of(p, prof, names), prof.identity, here)
    ]


def _wanted(need: Need, here: Identity | None) -> dict[str, object]:
    fields = {"gpu": need.gpu, "gpus_per_node": need.gpus_per_node, "nodes": need.nodes, "backend": need.backend}
    return {**fields, **({"cpu_model": here.cpu_model, "torch_version": here.torch_version} if here else {})}


def refusal(old: SweepPaths, need: Need, here: Identity | None) -> str:
    """Why no profile of ``old`` fits ``need``: each profile there, with the fields that differ."""
    names = gpu_names(old)
    wanted = _wanted(need, here)
    said = []
    for p in profiles_in(old):
        prof = read_profile(p)
        theirs = {**asdict(prof.identity), "gpu": _gpu_of(p, prof, names)}
        differ = [f"{k}: {theirs[k]!r} != {v!r}" for k, v in wanted.items() if theirs[k] != v]
        said.append(f"{p.name} ({'; '.join(differ)})")
    kept = "; ".join(said) if said else "it holds no profile"
    return f"--profile-from {old.root}: no profile of {need.describe()} ({need.backend}) there: {kept}"


def runs(paths: SweepPaths) -> list[dict[str, object]]:
    """``profiles/runs.jsonl``: each profile run started (``"event": "started"``) and each ending (``"ended"``)."""
    where = paths.profiles_dir / "runs.jsonl"
    try:
        lines = where.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(row, dict):
            out.append(row)
    return out


def need_of(row: Mapping[str, object]) -> Need | None:
    try:
        return Need(str(row["gpu"]), int(str(row["gpus_per_node"])), int(str(row["nodes"])), str(row["backend"]),
                    str(row["cluster"]))  # fmt: skip
    except (KeyError, ValueError):
        return None


def log_run(paths: SweepPaths, need: Need, event: str, **more: object) -> None:
    """A line of ``profiles/runs.jsonl``: ``need``, the event, when (UTC), and ``more``."""
    paths.profiles_dir.mkdir(parents=True, exist_ok=True)
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
    append_jsonl(paths.profiles_dir / "runs.jsonl", {**asdict(need), "event": event, "at": at, **more})


def measuring(cells: Sequence[Config]) -> bool:
    """Whether a profile is wanted for these cells: ``probe.profile`` is on for one that measures (a sweep of
    sleep or fail probes only checks the plumbing)."""
    return any(c.probe.profile and c.probe.kind == MEASURING for c in cells)


def decide(
    paths: SweepPaths, need: Need, cells: Sequence[Config], here: Identity | None, older: Sequence[SweepPaths] = ()
) -> Decision:
    """What the sweep does about ``need`` (see :class:`Decision`). ``older``: ``--profile-from`` folders, whose
    newest fitting profile is copied in; RefusedProfile where none of them holds one. BadProfile: a damaged file."""
    if mine := _found(paths, need, here):
        return Decision(need, "reuse", max(mine, key=lambda f: f[1].measured_at)[0])
    if older:
        theirs = [found for old in older for found in _found(old, need, here)]
        if not theirs:
            raise RefusedProfile("; ".join(refusal(old, need, here) for old in older))
        _, profile, _ = max(theirs, key=lambda f: f[1].measured_at)
        return Decision(need, "reuse", keep(paths, profile, need.gpu))
    if not measuring(cells):
        return Decision(need, "off")
    if any(need_of(r) == need for r in runs(paths)):
        return Decision(need, "started")
    return Decision(need, "measure")


def profiles_for(sweep_dir: Path | str) -> dict[str, Profile]:
    """The profiles a sweep's predictions use, by the cells' GPU name: of each GPU type, the profile over the most
    nodes (it measured the link between them too), then the most GPUs, then the newest. BadProfile where a file
    of the folder is damaged (it names the file)."""
    paths = SweepPaths(Path(sweep_dir))
    names = gpu_names(paths)
    best: dict[str, Profile] = {}
    for p in profiles_in(paths):
        prof = read_profile(p)
        gpu = _gpu_of(p, prof, names)
        rank = (prof.identity.nodes, prof.identity.gpus_per_node, prof.measured_at)
        kept = best.get(gpu)
        if kept is None or rank > (kept.identity.nodes, kept.identity.gpus_per_node, kept.measured_at):
            best[gpu] = prof
    return best


def spent_gpu_s(paths: SweepPaths) -> float:
    """GPU-seconds the sweep's profiles took: each run's measuring time where it ended (``wall_s``), else its whole
    budget (under way, or ended without saying), times its GPUs. A run started counts once."""
    total = 0.0
    rows = runs(paths)
    for i, row in enumerate(rows):
        need = need_of(row)
        if need is None or row.get("event") != "started":
            continue
        ended = next((r for r in rows[i + 1 :] if r.get("event") == "ended" and need_of(r) == need), None)
        wall = ended.get("wall_s") if ended is not None else None
        seconds = float(wall) if isinstance(wall, int | float) else BUDGET_S + START_S
        total += seconds * need.gpus
    return total


def profiles_of(sweep_dirs: Iterable[Path | str]) -> tuple[dict[str, Profile], list[str]]:
    """:func:`profiles_for` of every folder (where two hold one GPU type's, the first folder's), and a line for
    each folder whose profiles could not be read (its predictions then use the cited defaults)."""
    found: dict[str, Profile] = {}
    problems: list[str] = []
    for folder in sweep_dirs:
        try:
            mine = profiles_for(folder)
        except BadProfile as e:
            problems.append(f"{e}: the predictions use the cited links instead")
            continue
        for gpu, prof in mine.items():
            found.setdefault(gpu, prof)
    return found, problems
