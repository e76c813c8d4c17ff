"""The probe: measure one cell (a model, a GPU type and count, a method) with a short real DeepSpeed run.

It runs inside one job, one process per rank, and returns the measured part of the cell's record::

    build  GPT-NeoX (transformers, random weights) -> DeepSpeed engine with the method's settings
    search the largest micro-batch that fits (``method.micro_batch_size: auto``): start from a memory estimate,
           one shortened optimizer step per size, up while it fits, down after an OOM (freed and rebuilt in the
           same process); a size whose warm-up then runs out of memory is refused too and the search goes on
    warm   ``probe.warmup_steps`` whole optimizer steps, not timed (compilation, allocator, optimizer states)
    time   whole optimizer steps (a full gradient-accumulation cycle each, gradients reduced once per step),
           device-synchronised, until the 95% CI of the mean is under ``probe.target_ci_pct`` % or the budget ends

Every rank takes the same decisions: step times, trial outcomes and failures are exchanged after each step,
trial and phase (an all-reduce of a few numbers), so no rank is left waiting in a collective another rank has
left. What no exchange can rescue is a rank that fails inside a collective (an OOM on one rank only, in the middle
of a gradient reduction): its peers wait until ``GPUDAYS_DIST_TIMEOUT_S`` and the cell ends as ``comm_error``.

Memory. On a GPU, peak memory is the CUDA caching allocator's peak (allocated, and reserved: what the process took
from the device); ``probe.memory_limit_gib`` is compared with the reserved peak of a trial step and of the
warm-up. On the CPU
(``gpu.accelerator: cpu``) there is no device allocator, so "device memory" is the growth of the process's resident
set: the kernel's high-water mark (``VmHWM`` in /proc/self/status, reset before each trial by writing 5 to
/proc/self/clear_refs, after returning freed heap to the kernel with ``malloc_trim``) minus the resident set before
the model was built. That is real memory the step needed, which is what a limit on a CPU-only test should bound.

An OOM that is not a trial of the search (status ``oom``), a communication error, a compile error (torch.compile,
or a DeepSpeed op that cannot be built) and any other exception each become the record's status, with a one-line
reason and the traceback; nothing is retried or replaced silently. ``GPUDAYS_DIST_TIMEOUT_S`` (default 600)
bounds how long a rank waits for a peer in any collective.

The metrics, beyond their names: ``step_time_s`` is the median of the timed steps (``step_times_s``, each the
slowest rank's), ``step_cpu_time_s`` the median host CPU time of a step (this process, all threads);
``startup_s`` covers the process group and, for a fixed micro-batch, building the engine; ``search_s`` every
trial of the search, engine builds included; ``warmup_s`` the warm-up steps (and compilation); ``timed_s`` the
timed steps with their exchanges. ``search_tried`` lists each trial: micro-batch, ok/oom, peak, reason.

Run one rank by hand on a resolved cell config: ``python -m orchestrator.probe CELL.yaml [--out record.json]``
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment when set, else a world of one).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import logging
import math
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator.ds_config import (
    BatchPlan,
    build_ds_config,
    divisors,
    per_gpu_batch_size,
    plan_batch,
)
from orchestrator.engines.deepspeed.memory import GIB, estimate_micro_batch_size
from orchestrator.models import enable_activation_checkpointing, family_module, throughput_metrics
from orchestrator.schema import to_config
from orchestrator.timing import StepTimer, StoppingRule, summarize

STATUSES = ("ok", "does_not_fit", "oom", "comm_error", "compile_error", "failed")
DIST_TIMEOUT_ENV = "GPUDAYS_DIST_TIMEOUT_S"
DEFAULT_DIST_TIMEOUT_S = 600.0
MAX_REASON_CHARS = 500
MAX_TRACEBACK_CHARS = 32_000
"""A compiler's output can run to 100 kB of warnings; the record keeps the start and the end."""
DATA_BATCHES = 2
"""Distinct synthetic micro-batches cycled through, so no step reuses the previous step's input tensor."""

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------------
# Pure parts: failure classification


_OOM_MARKERS = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed", "failed to allocate")
_COMM_MARKERS = (
    "nccl",
    "gloo",
    "processgroup",
    "connection closed by peer",
    "connection reset by peer",
    "socket timeout",
    "timed out",
    "rendezvous",
)
_COMPILE_MARKERS = ("error building extension", "inductor", "dynamo", "backendcompilerfailed", "ninja")


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during, innermost last, without cycles."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_BUILD_FRAMES = ("torch/utils/cpp_extension.py", "deepspeed/ops/op_builder/")
"""Code that compiles native ops (DeepSpeed's cpu_adam, fused_adam, shm comm): a failure inside is a compile error."""


def _in_op_build(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if any(marker in tb.tb_frame.f_code.co_filename.replace(os.sep, "/") for marker in _BUILD_FRAMES):
            return True
        tb = tb.tb_next
    return False


def _type_names(exc: BaseException) -> list[str]:
    return [f"{klass.__module__}.{klass.__name__}".lower() for klass in type(exc).__mro__]


def classify_failure(exc: BaseException) -> str:
    """The record status of an exception: oom, comm_error, compile_error or failed.

    Decided by the exception types along the cause chain (torch.OutOfMemoryError, MemoryError,
    torch.distributed.DistError, TimeoutError; torch._dynamo / torch._inductor errors), by where it was raised
    (inside the building of a native op), and by the message, since DeepSpeed and the collective libraries often
    re-raise as RuntimeError. OOM wins over the others: an NCCL call that could not allocate is an OOM.
    """
    chain = _chain(exc)
    names = [name for e in chain for name in _type_names(e)]
    messages = " | ".join(f"{type(e).__name__}: {e}" for e in chain).lower()
    if any(n.endswith(("outofmemoryerror", ".memoryerror")) for n in names) or any(m in messages for m in _OOM_MARKERS):
        return "oom"
    if (
        any(n.startswith(("torch._dynamo", "torch._inductor")) for n in names)
        or any(m in messages for m in _COMPILE_MARKERS)
        or any(_in_op_build(e) for e in chain)
    ):
        return "compile_error"
    if any(n.startswith("torch.distributed") or n.endswith(".timeouterror") for n in names) or any(
        m in messages for m in _COMM_MARKERS
    ):
        return "comm_error"
    return "failed"


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, short enough for a table cell.

    A compiler's output (a C++ or op build failure) starts with warnings; its first ``error:`` line is what a user
    needs, so it is appended.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    line = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    compiler_error = next((entry for entry in lines[1:] if " error: " in f" {entry} "), None)
    if compiler_error:
        line = f"{line} ({compiler_error})"
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


def short_traceback(text: str) -> str:
    """A traceback capped at MAX_TRACEBACK_CHARS: its start (where it was called) and its end (what failed)."""
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    head = MAX_TRACEBACK_CHARS // 4
    tail = MAX_TRACEBACK_CHARS - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters left out ...]\n{text[-tail:]}"


# --------------------------------------------------------------------------------------------------------------
# Memory


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status in bytes (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rss_bytes() -> int:
    value = _proc_status_bytes("VmRSS")
    if value is not None:
        return value
    import psutil

    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class MemoryPeak:
    """Peak memory over a region, in bytes (see the module docstring for what each means on CPU and GPU)."""

    allocated: int
    reserved: int | None
    host_rss: int

    @property
    def limited(self) -> int:
        """The figure ``probe.memory_limit_gib`` is compared with: reserved on a GPU, allocated on the CPU."""
        return self.reserved if self.reserved is not None else self.allocated


class MemoryMeter:
    """Peak device memory (CUDA allocator) or peak resident-set growth (CPU) between ``reset`` and ``peak``."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.use_cuda = getattr(device, "type", "cpu") == "cuda"
        self._libc: Any = None
        with contextlib.suppress(OSError):
            self._libc = ctypes.CDLL("libc.so.6")
        self.baseline_rss = 0
        self.rebase()

    def rebase(self) -> None:
        """Take the resident set now, before a model is built, as the CPU's zero of "device memory"."""
        gc.collect()
        if self._libc is not None:
            self._libc.malloc_trim(0)
        self.baseline_rss = _rss_bytes()

    def reset(self) -> None:
        gc.collect()
        if self.use_cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._libc is not None:
            # Freed heap stays resident until trimmed; without this a trial would inherit the previous one's peak.
            self._libc.malloc_trim(0)
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)

    def peak(self) -> MemoryPeak:
        high_water = _proc_status_bytes("VmHWM") or _rss_bytes()
        if self.use_cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return MemoryPeak(
                allocated=int(torch.cuda.max_memory_allocated(self.device)),
                reserved=int(torch.cuda.max_memory_reserved(self.device)),
                host_rss=high_water,
            )
        return MemoryPeak(allocated=max(0, high_water - self.baseline_rss), reserved=None, host_rss=high_water)


def _gib(value: float | None) -> float | None:
    return None if value is None else value / GIB


# --------------------------------------------------------------------------------------------------------------
# The measurement


@dataclass
class Failure:
    """A failure of the cell on one rank, as it goes into the record."""

    status: str
    reason: str
    traceback: str
    rank: int


class CellFailed(Exception):
    """A failure every rank has agreed on; ends the probe with the failure's status."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


@dataclass(frozen=True)
class Outcome:
    """Whether a piece of work fitted in memory, as every rank agreed."""

    oom_reason: str | None
    """None when it fitted."""
    traceback: str | None
    """Of a real out-of-memory error; None for a peak over the imposed limit."""
    peak_bytes: float | None
    """Largest peak over ranks (see MemoryPeak.limited); None after a real OOM."""


@dataclass
class Trial:
    """One micro-batch size tried by the search."""

    micro_batch_size: int
    outcome: str
    """``ok`` or ``oom``."""
    peak_memory_gib: float | None
    reason: str | None = None


class _Probe:
    """State of one probe on one rank; ``run`` does the work, phases raise CellFailed once all ranks agree."""

    def __init__(self, cell: Mapping[str, Any], rank: int, world_size: int, local_rank: int) -> None:
        self.cell = cell
        self.config = to_config(cell)
        self.model_cfg: Mapping[str, Any] = cell["model"]
        self.method: Mapping[str, Any] = cell["method"]
        self.gpu: Mapping[str, Any] = cell["gpu"]
        self.probe_cfg: Mapping[str, Any] = cell["probe"]
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.num_gpus = int(cell["num_gpus"])
        self.use_cuda = self.gpu["accelerator"] == "cuda"
        self.started = time.perf_counter()
        self.metrics: dict[str, Any] = {}
        self.environment: dict[str, Any] = {}
        self.phase_s = {"startup_s": 0.0, "search_s": 0.0, "warmup_s": 0.0, "timed_s": 0.0}
        self.engine: Any = None
        self.batches: list[Any] = []
        self.device: Any = None
        self.memory: MemoryMeter | None = None
        self.dist_ready = False
        limit = self.probe_cfg.get("memory_limit_gib")
        self.memory_limit_bytes = None if limit is None else float(limit) * GIB

    # ---- distributed plumbing ------------------------------------------------------------------------------

    def failure_from(self, exc: BaseException) -> Failure:
        return Failure(
            classify_failure(exc), one_line(exc), short_traceback("".join(traceback.format_exception(exc))), self.rank
        )

    def agree(self, values: Sequence[float], failure: Failure | None) -> list[float]:
        """Max of ``values`` over ranks; raises CellFailed on every rank if any rank failed.

        One all-reduce in the common case; the failures themselves (reason, traceback) are gathered only when
        there is one, so that rank 0's record carries the reason of the rank that failed first.
        """
        if self.world_size == 1 or not self.dist_ready:
            if failure is not None:
                raise CellFailed(failure)
            return list(values)
        import torch
        import torch.distributed as dist

        flags = torch.tensor([*values, 1.0 if failure else 0.0], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[-1].item() > 0:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, failure)
            first = next(f for f in gathered if f is not None)
            raise CellFailed(Failure(first.status, f"rank {first.rank}: {first.reason}", first.traceback, first.rank))
        return [float(v) for v in flags[:-1].tolist()]

    def guarded(self, fn: Any, *args: Any) -> Any:
        """Run one phase on this rank, then agree with the other ranks on whether every rank succeeded."""
        result, failure = None, None
        try:
            result = fn(*args)
        except CellFailed:
            raise
        except Exception as exc:
            failure = self.failure_from(exc)
        self.agree([], failure)
        return result

    def _comm_device(self) -> Any:
        import torch

        return self.device if self.use_cuda else torch.device("cpu")

    # ---- phases --------------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Threads, device, process group, TF32; the environment part of the record."""
        if self.gpu["accelerator"] == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            if "OMP_NUM_THREADS" not in os.environ:
                # Ranks sharing a host split its cores; oversubscribed cores would time the scheduler, not the step.
                local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or max(
                    1, math.ceil(self.world_size / max(1, int(self.cell.get("num_nodes", 1))))
                )
                os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // local_world))
        import torch

        if self.gpu["accelerator"] == "cpu":
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        accelerator = get_accelerator().device_name()
        if self.use_cuda:
            if not torch.cuda.is_available() or accelerator != "cuda":
                raise RuntimeError(
                    f"gpu.accelerator=cuda for gpu={self.gpu['name']}, but no CUDA device is visible "
                    f"(torch.cuda.is_available()={torch.cuda.is_available()}, DeepSpeed accelerator={accelerator})"
                )
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            # TF32 only changes fp32 matrix products; bf16/fp16 cells are unaffected either way.
            tf32 = bool(self.method["tf32"]) and bool(self.gpu.get("supports_tf32"))
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        else:
            if accelerator != "cpu":
                raise RuntimeError(
                    f"gpu.accelerator=cpu, but DeepSpeed chose accelerator {accelerator!r}: DS_ACCELERATOR=cpu must "
                    "be set before deepspeed is first imported"
                )
            self.device = torch.device("cpu")
        timeout_s = float(os.environ.get(DIST_TIMEOUT_ENV, DEFAULT_DIST_TIMEOUT_S))
        deepspeed.init_distributed(
            dist_backend="nccl" if self.use_cuda else "gloo",
            auto_mpi_discovery=False,
            timeout=timedelta(seconds=timeout_s),
            verbose=False,
        )
        self.dist_ready = True
        # Import now what building an engine would import later, so that no trial's memory counts a module.
        import deepspeed.runtime.engine  # noqa: F401
        import deepspeed.runtime.zero.stage3  # noqa: F401
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
        import transformers.models.gpt_neox.modeling_gpt_neox  # noqa: F401

        self.memory = MemoryMeter(self.device)
        self.environment.update(environment(self.device))
        self.environment.update(
            {"world_size": self.world_size, "rank": self.rank, "torch_threads": torch.get_num_threads()}
        )

    def build(self, plan: BatchPlan) -> None:
        """Model, engine and synthetic data for ``plan``'s micro-batch, replacing any previous engine."""
        import deepspeed
        import torch

        self.release()
        if self.memory is not None:
            self.memory.rebase()
        ds_config = build_ds_config(self.method, plan, float(self.model_cfg["lr"]), self.gpu["accelerator"])
        self.environment["ds_config"] = ds_config
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.method["precision"]]
        seed = int(self.probe_cfg.get("seed", 0))
        torch.manual_seed(seed)  # the same initial weights on every rank
        zero3_init = None
        if int(self.method["zero_stage"]) == 3:
            # Parameters go where the config's offload_param says (the host when offloading).
            zero3_init = deepspeed.zero.Init(config_dict_or_path=ds_config)
        module = family_module(self.config.model.family).build_model(
            self.config.model, self.config.method.attention, dtype, self.device, zero3_init
        )
        if self.method["activation_checkpointing"]:
            enable_activation_checkpointing(module)
        module.train()
        self.metrics["num_parameters"] = sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())
        engine, _, _, _ = deepspeed.initialize(
            model=module, model_parameters=[p for p in module.parameters() if p.requires_grad], config=ds_config
        )
        self.engine = engine
        if self.method["compile"]:
            engine.compile()  # compiled lazily, at the first forward: inside the search or the warm-up
        self.environment["compiled"] = bool(getattr(engine, "is_compiled", False))
        generator = torch.Generator().manual_seed(seed * 1000 + self.rank + 1)  # different data on each rank
        vocab, seq = int(self.model_cfg["vocab_size"]), int(self.model_cfg["seq_length"])
        self.batches = [
            torch.randint(0, vocab, (plan.micro_batch_size, seq), generator=generator).to(self.device)
            for _ in range(DATA_BATCHES)
        ]

    def release(self) -> None:
        """Drop the engine, its optimizer states and the data, and give the memory back."""
        engine, self.engine, self.batches = self.engine, None, []
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.destroy()
            del engine
        gc.collect()
        if self.use_cuda:
            import torch

            torch.cuda.empty_cache()

    def micro_step(self, index: int, boundary: bool) -> Any:
        """Forward, backward and (at the accumulation boundary) the optimizer step, on one micro-batch."""
        engine = self.engine
        engine.set_gradient_accumulation_boundary(boundary)
        batch = self.batches[index % len(self.batches)]
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        return loss

    def optimizer_step(self, plan: BatchPlan) -> Any:
        """One whole optimizer step: ``grad_accum_steps`` micro-batches, gradients reduced once, at the last."""
        loss = None
        for i in range(plan.grad_accum_steps):
            loss = self.micro_step(i, i == plan.grad_accum_steps - 1)
        return loss

    def attempt(self, work: Any, micro: int, where: str) -> Outcome:
        """Run ``work`` and decide on every rank whether it ran out of memory. Any other exception fails the
        cell on every rank.

        A real OOM on any rank, or a peak over ``probe.memory_limit_gib`` on any rank, is an OOM everywhere;
        the reason is built from numbers every rank holds, so every rank records the same.
        """
        assert self.memory is not None
        oom: Failure | None = None
        failure: Failure | None = None
        peak_bytes = 0.0
        try:
            self.memory.reset()
            work()
            peak_bytes = float(self.memory.peak().limited)
        except Exception as exc:
            if classify_failure(exc) == "oom":
                oom = self.failure_from(exc)
            else:
                failure = self.failure_from(exc)
        oom_flag, peak_bytes = self.agree([1.0 if oom else 0.0, peak_bytes], failure)
        if oom_flag:
            first = oom
            if self.world_size > 1 and self.dist_ready:
                import torch.distributed as dist

                gathered: list[Any] = [None] * self.world_size
                dist.all_gather_object(gathered, oom)
                first = next(f for f in gathered if f is not None)
            assert first is not None
            return Outcome(f"micro-batch {micro}, {where}: rank {first.rank}: {first.reason}", first.traceback, None)
        if self.memory_limit_bytes is not None and peak_bytes > self.memory_limit_bytes:
            reason = (
                f"micro-batch {micro}, {where}: peak {peak_bytes / GIB:.3f} GiB over probe.memory_limit_gib="
                f"{self.memory_limit_bytes / GIB:g}"
            )
            return Outcome(reason, None, peak_bytes)
        return Outcome(None, None, peak_bytes)

    def trial(self, plan: BatchPlan) -> Trial:
        """Build for ``plan`` and run a shortened optimizer step: does it fit on every rank?

        The step has two micro-batches (one when there is no accumulation), the second at the accumulation
        boundary, so it holds what a whole step holds: accumulated gradients, then the reduction and the
        optimizer's states, which Adam allocates at its first step. An OOM on any rank (a real one, or a peak
        over the imposed limit) makes the outcome ``oom`` on every rank and frees the engine.
        """
        micro_steps = min(plan.grad_accum_steps, 2)

        def work() -> None:
            self.build(plan)
            self.memory.reset()  # type: ignore[union-attr]  # the step's peak, not the build's
            for i in range(micro_steps):
                self.micro_step(i, boundary=i == micro_steps - 1)

        outcome = self.attempt(work, plan.micro_batch_size, "trial step")
        if outcome.oom_reason:
            self.release()
        peak_gib = _gib(outcome.peak_bytes)
        return Trial(plan.micro_batch_size, "oom" if outcome.oom_reason else "ok", peak_gib, outcome.oom_reason)

    def search(self, per_gpu: int, below: int | None = None) -> BatchPlan | None:
        """The largest micro-batch dividing ``per_gpu`` (and smaller than ``below``) that fits in a trial step.

        Starts from the memory estimate, goes up one divisor at a time while trials fit and down while they do
        not; returns with the engine of the answer built, or None when even the smallest size does not fit.
        Trials are appended to the record's ``search_tried``.
        """
        candidates = [c for c in divisors(per_gpu) if below is None or c < below]
        if not candidates:
            return None
        global_batch = int(self.model_cfg["global_batch_size"])
        if "micro_batch_estimate" not in self.metrics:
            self.metrics["micro_batch_estimate"] = estimate_micro_batch_size(self.config, self.device_memory_gib())
        estimate = self.metrics["micro_batch_estimate"]
        index = max([i for i, c in enumerate(candidates) if c <= estimate] or [0])
        tried: list[dict[str, Any]] = self.metrics.setdefault("search_tried", [])
        refused = {t["micro_batch_size"] for t in tried if t["outcome"] == "oom"}
        best: int | None = None
        while True:
            plan = BatchPlan(global_batch, self.num_gpus, candidates[index])
            result = self.trial(plan)
            tried.append(asdict(result))
            if result.outcome == "ok":
                best = index
                if index + 1 < len(candidates) and candidates[index + 1] not in refused:
                    index += 1
                    continue
                return plan  # its engine is built
            refused.add(plan.micro_batch_size)
            if best is not None:
                break
            if index == 0:
                return None
            index -= 1
        plan = BatchPlan(global_batch, self.num_gpus, candidates[best])
        self.guarded(self.build, plan)
        return plan

    def device_memory_gib(self) -> float:
        """Memory a rank may use: the imposed limit, else the device's (or, on the CPU, the GPU config's)."""
        if self.memory_limit_bytes is not None:
            return self.memory_limit_bytes / GIB
        if self.use_cuda:
            import torch

            return torch.cuda.get_device_properties(self.device).total_memory / GIB
        return float(self.gpu["memory_gib"])

    def warm_up(self, plan: BatchPlan) -> Outcome:
        """``probe.warmup_steps`` whole optimizer steps; whether they fit."""

        def work() -> None:
            for _ in range(int(self.probe_cfg["warmup_steps"])):
                self.optimizer_step(plan)

        began = time.perf_counter()
        outcome = self.attempt(work, plan.micro_batch_size, "warm-up")
        self.phase_s["warmup_s"] += time.perf_counter() - began
        return outcome

    def timed_steps(self, plan: BatchPlan) -> tuple[list[float], list[float], str, Any]:
        """Time whole optimizer steps until the stopping rule says enough; the same decision on every rank.

        Returns the step times, the host CPU time of each step (this process, all its threads: the work the
        host did, which a busy neighbour does not inflate), why timing stopped, and the last loss.
        """
        rule = StoppingRule(
            min_steps=int(self.probe_cfg["min_steps"]),
            max_steps=int(self.probe_cfg["max_steps"]),
            target_ci_pct=float(self.probe_cfg["target_ci_pct"]),
            time_budget_s=float(self.probe_cfg["time_budget_s"]),
        )
        timer = StepTimer(self.use_cuda)
        times: list[float] = []
        cpu_times: list[float] = []
        loss = None
        while True:
            failure, elapsed, cpu_s = None, 0.0, 0.0
            try:
                timer.start()
                cpu_began = time.process_time()
                loss = self.optimizer_step(plan)
                elapsed = timer.stop()
                cpu_s = time.process_time() - cpu_began
            except Exception as exc:
                failure = self.failure_from(exc)
            # A synchronous step is as slow as its slowest rank; every rank then holds the same list.
            elapsed, cpu_s = self.agree([elapsed, cpu_s], failure)
            times.append(elapsed)
            cpu_times.append(cpu_s)
            reason = rule.decide(times)
            if reason is not None:
                return times, cpu_times, reason, loss

    def choose_plan(self, per_gpu: int) -> BatchPlan | None:
        """Search, then warm up; a size that fits a trial step but not the warm-up's whole steps is refused too
        and the search goes on below it. None when nothing fits."""
        below: int | None = None
        while True:
            began = time.perf_counter()
            plan = self.search(per_gpu, below)
            self.phase_s["search_s"] += time.perf_counter() - began
            if plan is None:
                return None
            outcome = self.warm_up(plan)
            if outcome.oom_reason is None:
                return plan
            refused = Trial(plan.micro_batch_size, "oom", _gib(outcome.peak_bytes), outcome.oom_reason)
            self.metrics["search_tried"].append(asdict(refused))
            self.release()
            below = plan.micro_batch_size

    def run(self) -> dict[str, Any]:
        self.guarded(self.setup)
        assert self.memory is not None
        self.phase_s["startup_s"] = time.perf_counter() - self.started
        global_batch = int(self.model_cfg["global_batch_size"])
        micro_setting = self.method["micro_batch_size"]
        per_gpu = self.guarded(per_gpu_batch_size, global_batch, self.num_gpus)
        self.metrics["per_gpu_batch_size"] = per_gpu
        self.metrics["memory_limit_gib"] = _gib(self.memory_limit_bytes)

        if micro_setting == "auto":
            plan = self.choose_plan(per_gpu)
            if plan is None:
                tried = self.metrics["search_tried"]
                smallest = min(t["micro_batch_size"] for t in tried)
                self.metrics["micro_batch_size"] = smallest
                last = [t for t in tried if t["micro_batch_size"] == smallest][-1]
                return self.record(
                    "does_not_fit",
                    f"nothing fits: even the smallest micro-batch, {smallest}, is out of memory ({last['reason']})",
                )
        else:
            plan = self.guarded(plan_batch, global_batch, self.num_gpus, micro_setting)
            began = time.perf_counter()
            self.guarded(self.build, plan)
            self.phase_s["startup_s"] += time.perf_counter() - began
            outcome = self.warm_up(plan)
            if outcome.oom_reason is not None:
                self.metrics["micro_batch_size"] = plan.micro_batch_size
                return self.record("oom", outcome.oom_reason, outcome.traceback)
        self.metrics.update({"micro_batch_size": plan.micro_batch_size, "grad_accum_steps": plan.grad_accum_steps})

        skipped_before = int(getattr(self.engine, "skipped_steps", 0))
        began = time.perf_counter()
        times, cpu_times, stop_reason, loss = self.timed_steps(plan)
        self.phase_s["timed_s"] = time.perf_counter() - began
        peak = self.memory.peak()  # since the warm-up began: the steady state's peak
        peaks = self.agree([float(peak.allocated), float(peak.reserved or 0), float(peak.host_rss)], None)

        summary = summarize(times)
        self.metrics.update(summary.as_metrics())
        self.metrics["stop_reason"] = stop_reason
        self.metrics["step_times_s"] = times
        self.metrics["step_cpu_time_s"] = summarize(cpu_times).median_s
        self.metrics["step_cpu_times_s"] = cpu_times
        self.metrics.update(throughput_metrics(self.config, plan.global_batch_size, summary.median_s))
        self.metrics.update(
            {
                "peak_memory_allocated_gib": peaks[0] / GIB,
                "peak_memory_reserved_gib": peaks[1] / GIB if peak.reserved is not None else None,
                "host_rss_gib": peaks[2] / GIB,
                "final_loss": float(loss.item()) if loss is not None else None,
                "skipped_steps_timed": int(getattr(self.engine, "skipped_steps", 0)) - skipped_before,
            }
        )
        return self.record("ok", None)

    def record(self, status: str, reason: str | None, tb: str | None = None) -> dict[str, Any]:
        self.metrics.update(self.phase_s)
        self.metrics["probe_wall_s"] = time.perf_counter() - self.started
        return {
            "status": status,
            "reason": reason,
            "traceback": tb,
            "metrics": self.metrics,
            "environment": self.environment,
        }

    def close(self, status: str) -> None:
        """Free the engine; leave the process group cleanly unless a peer may be stuck in a collective."""
        self.release()
        if not self.dist_ready or status == "comm_error":
            return
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def environment(device: Any) -> dict[str, Any]:
    """Library versions and the device, for the record."""
    import deepspeed
    import torch
    import transformers

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "accelerator": getattr(device, "type", str(device)),
    }
    if getattr(device, "type", "") == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        with contextlib.suppress(Exception):  # NCCL may be missing from a CUDA build
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        info["device_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        info["device_name"] = _cpu_model() or platform.processor() or platform.machine()
        info["cpu_count"] = os.cpu_count()
    return info


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return None


def run_probe(cell: dict, rank: int, world_size: int, local_rank: int) -> dict:
    """Measure one cell. Called on every rank after the job side set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT and, for gpu.accelerator == "cpu", DS_ACCELERATOR=cpu (before deepspeed is imported). Never raises
    for a failure of the cell: returns the record's measured part on every rank."""
    probe = _Probe(cell, rank, world_size, local_rank)
    status = "failed"
    try:
        result = probe.run()
    except CellFailed as exc:
        f = exc.failure
        result = probe.record(f.status, f.reason, f.traceback)
    except Exception as exc:  # a failure no other rank could be told about (e.g. inside the process group setup)
        f = probe.failure_from(exc)
        result = probe.record(f.status, f.reason, f.traceback)
    status = result["status"]
    probe.close(status)
    return result


# --------------------------------------------------------------------------------------------------------------
# Command line: one rank by hand


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.probe CELL.yaml [--out record.json]``: measure a resolved cell config."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator.probe", description=main.__doc__)
    parser.add_argument("cell", type=Path, help="a resolved cell config (cells/<id>/cell.yaml of a sweep)")
    parser.add_argument("--out", help="write the result here as JSON; '{rank}' in it is replaced by the rank")
    args = parser.parse_args(argv)

    from omegaconf import OmegaConf

    cell = OmegaConf.to_container(OmegaConf.load(args.cell), resolve=True)
    assert isinstance(cell, dict)
    if cell["gpu"]["accelerator"] == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = run_probe(cell, rank, world_size, int(os.environ["LOCAL_RANK"]))
    text = json.dumps(result, indent=2, sort_keys=True, default=str)
    if args.out:
        from orchestrator.paths import write_json_atomic

        write_json_atomic(Path(args.out.format(rank=rank)), result)
    if rank == 0:
        print(text)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
