"""One rank of a probe and how the ranks agree: device and process group set-up, the exchanges that keep every rank
on the same path (step times, trial outcomes, failures), and whether a piece of work fitted in memory.

Every decision is taken on numbers all ranks hold, after an all-reduce of a few numbers; the failures themselves
(reason, traceback) are gathered only when there is one. What no exchange can rescue is a rank that fails inside a
collective (an OOM on one rank only, in the middle of a gradient reduction): its peers wait until
``GPUDAYS_DIST_TIMEOUT_S`` (default 600) and the cell ends as ``comm_error``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from orchestrator.config.schema import Config
from orchestrator.engines.base import Engine, create_engine
from orchestrator.job.failures import CellFailed, Ending, Failure, classify_failure, failure_from
from orchestrator.job.metering import GIB, MemoryMeter, over_limit
from orchestrator.job.timing import PhaseTimes
from orchestrator.models import family_module

if TYPE_CHECKING:
    import torch

P = ParamSpec("P")
T = TypeVar("T")

DIST_TIMEOUT_ENV = "GPUDAYS_DIST_TIMEOUT_S"
DEFAULT_DIST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Outcome:
    """Whether a piece of work fitted in memory, as every rank agreed."""

    oom_reason: str | None
    """None when it fitted."""
    traceback: str | None
    """Of a real out-of-memory error; None for a peak over the imposed limit."""
    peak_bytes: float | None
    """Largest peak over ranks (see MemoryPeak.limited); None after a real OOM."""


class RankGroup:
    """This rank's device, engine and memory meter, and the exchanges with the other ranks."""

    def __init__(self, cell: Config, rank: int, world_size: int, local_rank: int) -> None:
        self.config = cell
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.num_gpus = self.config.num_gpus
        self.use_cuda = self.config.gpu.accelerator == "cuda"
        self.started = time.perf_counter()
        self.environment: dict[str, object] = {}
        """Library versions, the device and the engine's settings, in torch's and the engine's own words."""
        self.phases = PhaseTimes()
        self.engine: Engine = None  # type: ignore[assignment]  # set by setup
        self.device: torch.device | None = None
        self.memory: MemoryMeter | None = None
        self.dist_ready = False
        limit = self.config.probe.memory_limit_gib
        self.memory_limit_bytes = None if limit is None else float(limit) * GIB

    def failure_from(self, exc: BaseException) -> Failure:
        return failure_from(exc, self.rank)

    def agree(self, values: Sequence[float], failure: Failure | None) -> list[float]:
        """Max of ``values`` over ranks; raises CellFailed on every rank if any rank failed."""
        if self.world_size == 1 or not self.dist_ready:
            if failure is not None:
                raise CellFailed(failure)
            return list(values)
        import torch
        import torch.distributed as dist

        flags = torch.tensor([*values, 1.0 if failure else 0.0], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[-1].item() > 0:
            first = self._first_of(failure)
            raise CellFailed(Failure(first.ending, f"rank {first.rank}: {first.reason}", first.traceback, first.rank))
        return [float(v) for v in flags[:-1].tolist()]

    def _first_of(self, mine: Failure | None) -> Failure:
        """The failure of the lowest rank that had one (every rank calls this together)."""
        if self.world_size == 1 or not self.dist_ready:
            assert mine is not None
            return mine
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        return cast(Failure, next(f for f in gathered if f is not None))

    def guarded(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one phase on this rank, then agree with the other ranks on whether every rank succeeded."""
        failure = None
        try:
            result = fn(*args, **kwargs)
        except CellFailed:
            raise
        except Exception as exc:
            failure = self.failure_from(exc)
        self.agree([], failure)  # raises on every rank if any rank failed, so ``result`` is this rank's
        return result

    def _comm_device(self) -> torch.device:
        import torch

        return self.device if self.use_cuda and self.device is not None else torch.device("cpu")

    def attempt(self, work: Callable[[], None], micro: int | None, where: str) -> Outcome:
        """Run ``work`` and decide on every rank whether it ran out of memory; any other exception fails the cell
        on every rank. A real OOM on any rank, or a peak over ``probe.memory_limit_gib`` on any rank, is an OOM
        everywhere; the reason is built from numbers every rank holds, so every rank records the same. ``micro``:
        the micro-batch the reason names, None for work of no micro-batch (the build)."""
        assert self.memory is not None
        oom: Failure | None = None
        failure: Failure | None = None
        peak_bytes = 0.0
        try:
            self.memory.reset()
            work()
            peak_bytes = float(self.memory.peak().limited)
        except Exception as exc:
            if classify_failure(exc) is Ending.OUT_OF_MEMORY:
                oom = self.failure_from(exc)
            else:
                failure = self.failure_from(exc)
        oom_flag, peak_bytes = self.agree([1.0 if oom else 0.0, peak_bytes], failure)
        at = where if micro is None else f"micro-batch {micro}, {where}"
        if oom_flag:
            first = self._first_of(oom)
            tb = first.traceback or ""
            return Outcome(f"{at}: rank {first.rank}: {first.reason}", tb, None)
        return Outcome(over_limit(peak_bytes, self.memory_limit_bytes, micro, where), None, peak_bytes)

    def capacity_bytes(self) -> tuple[float, bool]:
        """Memory a trial's peak may reach, and whether that is an imposed limit (exceeding it raises nothing)."""
        if self.memory_limit_bytes is not None:
            return self.memory_limit_bytes, True
        return self.device_memory_gib() * GIB, not self.use_cuda

    def device_memory_gib(self) -> float:
        """Memory a rank may use: the imposed limit, else the device's (or, on the CPU, the GPU config's)."""
        if self.memory_limit_bytes is not None:
            return self.memory_limit_bytes / GIB
        if self.use_cuda:
            import torch

            return float(torch.cuda.get_device_properties(self.device).total_memory) / GIB
        return float(self.config.gpu.memory_gib)

    def setup(self) -> None:
        """Threads, device, TF32, the engine and its process group; the environment part of the record."""
        gpu = self.config.gpu
        if gpu.accelerator == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            if "OMP_NUM_THREADS" not in os.environ:
                # Ranks sharing a host split its cores; oversubscribed cores would time the scheduler, not the step.
                local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or max(
                    1, math.ceil(self.world_size / max(1, self.config.num_nodes))
                )
                os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // local_world))
        import torch

        if gpu.accelerator == "cpu":
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
            self.device = torch.device("cpu")
            if (onednn := cpu_onednn(self.config.model.family)) is not None:
                self.environment["cpu_onednn"] = onednn
        else:
            if not torch.cuda.is_available():
                raise RuntimeError(f"gpu.accelerator=cuda for gpu={gpu.name}, but no CUDA device is visible")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            # TF32 only changes fp32 matrix products; bf16/fp16 cells are unaffected either way.
            tf32 = self.config.method.tf32 and gpu.supports_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        self.engine = create_engine(self.config, self.device, self.rank)
        self.engine.init_distributed(timedelta(seconds=float(os.environ.get(DIST_TIMEOUT_ENV, DEFAULT_DIST_TIMEOUT_S))))
        self.dist_ready = True
        self.engine.preload()
        builder = getattr(family_module(self.config.model.family), "BUILDER", None)
        if builder is not None:
            builder.preload()
        # What is imported by now lives as long as the process: frozen out of the collector, so that each later
        # collection (every build's, release's and memory region's) walks the probe's own objects only, not the
        # millions of torch's, transformers' and the engine's (a full collection over them took 0.2 s each).
        gc.collect()
        gc.freeze()
        self.memory = MemoryMeter(self.device)
        self.environment.update(environment(self.device))
        self.environment.update(
            {"world_size": self.world_size, "rank": self.rank, "torch_threads": torch.get_num_threads()}
        )

    def close(self, ending: Ending) -> None:
        """Leave the process group cleanly unless a peer may be stuck in a collective (after a comm error)."""
        if not self.dist_ready or ending is Ending.COMM_ERROR:
            return
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def cpu_onednn(family: str) -> str | None:
    """Turn oneDNN off for the CPU matrix products of a family that says it must not use it (``CPU_ONEDNN =
    False``: a mixture of experts, whose per-shape kernel cache would count as its memory, see
    ``orchestrator.models.moe.CPU_ONEDNN``); what the record says of it, None where nothing changed."""
    if getattr(family_module(family), "CPU_ONEDNN", True):
        return None
    import torch

    torch.backends.mkldnn.set_flags(False)  # type: ignore[no-untyped-call]
    return "off: the family's GEMM shapes change every step (orchestrator.models.moe.CPU_ONEDNN)"


def environment(device: torch.device) -> dict[str, object]:
    """Library versions and the device, for the record (the engine adds its own)."""
    import torch
    import transformers

    info: dict[str, object] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "accelerator": getattr(device, "type", str(device)),
    }
    if getattr(device, "type", "") == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        with contextlib.suppress(Exception):  # NCCL may be missing from a CUDA build
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        info["device_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        info["device_name"] = _cpu_model() or platform.processor() or platform.machine()
        info["cpu_count"] = os.cpu_count()
    return info


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None
