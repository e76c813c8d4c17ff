"""How every figure of a profile is timed: ``torch.utils.benchmark.Timer``, which synchronises the accelerator
before reading the clock, and the agreement of the ranks on the slowest of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SLOW = 20
"""A first call this many times the time asked for each figure is taken as the figure (a bf16 product on a CPU
without bf16 instructions takes minutes)."""
DTYPES = ("bf16", "fp16", "fp32", "tf32")
"""The precisions a profile measures; ``tf32`` is fp32 storage with TF32 tensor cores allowed."""


def torch_dtype(name: str) -> torch.dtype:
    import torch

    found = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
    if name not in found:
        raise ValueError(f"precision {name!r}: use one of {', '.join(DTYPES)}")
    return found[name]


def allow_tf32(name: str) -> None:
    """TF32 tensor cores on for ``tf32``, off for plain fp32 (the products' precision is what was asked)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"


def median_seconds(run: Callable[[], object], min_run_s: float, threads: int, accelerator: bool = False) -> float:
    """The median time of one call of ``run`` over at least ``min_run_s`` of calls on ``threads`` CPU threads,
    after two calls to warm up: the first pays one-off costs (a GPU loads its kernels lazily, a library builds its
    plan, cuBLAS its handle), and so may the second (a backward's gradients accumulate into tensors the first
    created); on an H200 a single call timed after the first alone read 51 TFLOP/s for a product that runs at
    540, and 3 GFLOP/s for an attention backward. On the CPU a first call of :data:`SLOW` times ``min_run_s`` (a
    large product without the precision's instructions) is its own figure, its one-off costs lost in it; on an
    ``accelerator`` never, since loading a kernel lazily takes seconds there (an H200's first attention backward
    of pythia-160m's shape took over 2 s, read 3.6 GFLOP/s as its figure, and runs at about 140 TFLOP/s). One that
    still takes ``min_run_s`` on its second call is timed once more and the faster of the two kept: the profile's
    time stays near its budget."""
    from torch.utils.benchmark import Timer
    from torch.utils.benchmark.utils.timer import timer as clock  # Timer's own clock: synchronises the device

    def once() -> float:
        started = clock()
        run()
        return float(clock() - started)

    first = once()
    if first >= SLOW * min_run_s and not accelerator:
        return first
    second = once()
    if second >= min_run_s:
        return min(second, once())
    timer = Timer(stmt="run()", globals={"run": run}, num_threads=threads)
    return float(timer.blocked_autorange(min_run_time=min_run_s).median)


def slowest(values: Sequence[float], device: torch.device) -> list[float]:
    """Each of ``values`` as the largest any rank measured (every rank passes its own, in the same order)."""
    import torch
    import torch.distributed as dist

    if not values:
        return []
    held = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(held, op=dist.ReduceOp.MAX)
    return [float(v) for v in held.cpu().tolist()]


def fewest(value: int, device: torch.device) -> int:
    """The smallest ``value`` of any rank: a repeat count every rank then runs."""
    import torch
    import torch.distributed as dist

    held = torch.tensor([value], dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(held, op=dist.ReduceOp.MIN)
    return int(held.item())
