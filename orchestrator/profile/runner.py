"""Starting the ranks of a profile and putting its figures together.

On one machine (``profile_here``) the ranks are this machine's processes, started by ``torch.multiprocessing``
(see :data:`START_METHOD`) and joined through a file store in a temporary folder. In a job that starts the ranks
itself, ``srun`` or ``torchrun`` across nodes (``profile_in_job``), each rank joins through ``RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. Rank 0 returns the profile.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.profile import attention, collectives, matmul, memory
from orchestrator.profile.attention import AttentionShape
from orchestrator.profile.collectives import Layout
from orchestrator.profile.identity import this_machine
from orchestrator.profile.matmul import LinearShape
from orchestrator.profile.record import OPS, Profile, profile_from_json

if TYPE_CHECKING:
    import torch

KIB, MIB = 1024, 1024 * 1024
START_METHOD = "forkserver"
"""How the ranks on one machine start: forked from a server process that has loaded torch and nothing else. A
fork of this process could hang (a rank's OpenMP threads after this process used its own) or break CUDA; a
spawn loads torch once per rank."""
JOB_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Set by a launcher that starts the ranks itself: then this process is one rank of the profile."""


@dataclass(frozen=True)
class Plan:
    """What one profile measures, and how long it dwells on each figure."""

    linear: tuple[LinearShape, ...]
    attention: tuple[AttentionShape, ...]
    dtypes: tuple[str, ...]
    message_bytes: tuple[int, ...]
    memory_bytes: int
    ops: tuple[str, ...] = OPS
    min_run_s: float = 0.05
    """Least time spent calling each product, attention or memory stream (``Timer.blocked_autorange``)."""
    collective_s: float = 0.02
    """Time spent repeating each collective at each size."""

    def figures(self) -> tuple[int, int]:
        """How many figures the plan times: (products, attention and memory ones; collective ones on one link)."""
        local = len(self.dtypes) * (3 * len(self.linear) + 2 * len(self.attention)) + 2
        return local, len(self.ops) * len(self.message_bytes)


def message_sizes(smallest: int, largest: int) -> tuple[int, ...]:
    """``smallest``, four times it, and so on up to ``largest`` (4 KiB to 64 MiB: eight sizes)."""
    if not 0 < smallest <= largest:
        raise ValueError(f"message sizes {smallest} to {largest} bytes: give 0 < smallest <= largest")
    sizes = [smallest]
    while sizes[-1] * 4 <= largest:
        sizes.append(sizes[-1] * 4)
    return tuple(sizes)


class ProfileFailed(RuntimeError):
    """A rank of the profile failed; the message is its error's last line."""


def _threads(per_node: int, device: torch.device) -> int:
    """CPU threads of each rank: the cores this process may use, shared among the node's ranks."""
    if device.type == "cuda":
        return 1
    return max(1, len(os.sched_getaffinity(0)) // per_node)


def measure_rank(plan: Plan, layout: Layout, device: torch.device, backend: str) -> Profile | None:
    """Every figure of ``plan`` on this rank of an initialised process group; the profile on rank 0, else None."""
    import torch

    threads = _threads(layout.per_node, device)
    torch.set_num_threads(threads)
    torch.manual_seed(layout.rank)
    started = time.perf_counter()
    products = matmul.measure(list(plan.linear), list(plan.dtypes), device, plan.min_run_s, threads)
    heads = attention.measure(list(plan.attention), list(plan.dtypes), device, plan.min_run_s, threads)
    streams = memory.measure(plan.memory_bytes, device, plan.min_run_s, threads)
    links = collectives.measure(layout, list(plan.message_bytes), list(plan.ops), device, plan.collective_s)
    if layout.rank != 0:
        return None
    identity = this_machine(backend, layout.per_node, layout.nodes)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    wall = time.perf_counter() - started
    return Profile(identity, when, wall, tuple(products), tuple(heads), tuple(streams), tuple(links))


def _device(backend: str, local_rank: int) -> torch.device:
    import torch

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _local_rank(rank: int, plan: Plan, world: int, store: str, result: str, backend: str) -> None:
    """One rank started by :func:`profile_here`: rank 0 writes the profile's JSON to ``result``."""
    import torch.distributed as dist

    device = _device(backend, rank)
    bound = device if backend == "nccl" else None
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world, device_id=bound)
    try:
        profile = measure_rank(plan, Layout(rank, world, world), device, backend)
        if profile is not None:
            Path(result).write_text(json.dumps(profile.to_json()))
    finally:
        dist.destroy_process_group()


def profile_here(plan: Plan, ranks: int, backend: str) -> Profile:
    """A profile of this machine over ``ranks`` processes (``gloo`` on the CPU, ``nccl`` on its GPUs)."""
    import torch
    from torch.multiprocessing.spawn import ProcessException, start_processes

    if ranks < 1:
        raise ValueError(f"{ranks} ranks: give 1 or more")
    if backend == "nccl" and ranks > torch.cuda.device_count():
        raise ValueError(f"{ranks} ranks over NCCL, but this machine shows {torch.cuda.device_count()} GPU(s)")
    with tempfile.TemporaryDirectory(prefix="gpudays-profile-") as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "profile.json")
        multiprocessing.get_context(START_METHOD).set_forkserver_preload(["torch", "torch.distributed", __name__])
        try:
            arguments = (plan, ranks, store, result, backend)
            start_processes(_local_rank, arguments, ranks, start_method=START_METHOD)  # type: ignore[no-untyped-call]
        except ProcessException as e:
            lines = [line for line in str(e).splitlines() if line.strip()]
            raise ProfileFailed(f"a rank of the profile failed: {lines[-1] if lines else e}") from e
        return profile_from_json(json.loads(Path(result).read_text()), "the profile just measured")


def in_job() -> bool:
    """Whether a launcher started this process as one rank of several (see :data:`JOB_ENV`)."""
    return all(os.environ.get(name) for name in JOB_ENV)


def profile_in_job(plan: Plan, backend: str) -> Profile | None:
    """This process as one rank of a profile its launcher started; the profile on rank 0, else None."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or world)
    if world % per_node:
        raise ValueError(f"WORLD_SIZE {world} is not a whole number of nodes of {per_node} ranks (LOCAL_WORLD_SIZE)")
    device = _device(backend, int(os.environ.get("LOCAL_RANK", rank % per_node)))
    bound = device if backend == "nccl" else None
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, device_id=bound)
    try:
        return measure_rank(plan, Layout(rank, world, per_node), device, backend)
    finally:
        dist.destroy_process_group()
