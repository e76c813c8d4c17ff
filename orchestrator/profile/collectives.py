"""The collectives the engines issue (all-reduce, all-gather, reduce-scatter, send/recv, all-to-all), timed over
message sizes on each link, and the line ``seconds = latency + bytes / rate`` fitted to each.

Inside a node every node's ranks run the collective at once in a group of their own (as data parallelism inside
a node does); across nodes the whole world runs it. A send/recv is a ping-pong between two ranks (half the round
trip): ranks 0 and 1 inside a node, rank 0 and the first rank of the second node across.

On the CPU the collectives are timed with the cores busy (:func:`cores_busy`): gloo's threads share the cores with
the ranks' compute, and a step keeps those cores busy, so a collective timed on idle cores is faster than any a
step issues. On the 2-core machine of ``tests/data/cpu-grid`` the idle figures were 1.3-1.7 GB/s (all-reduce), and
the grid's two-rank cells ran 5-38% slower than predicted from them, while a one-rank cell computing on its two
threads ran only 1.16x faster than on one (its work between the products does not spread over the cores).
On a GPU the collectives run on the device and the host's cores stay as they are.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.profile.record import LINKS, OPS, CollectiveFit
from orchestrator.profile.timing import fewest, slowest

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

MOST_REPEATS = 1000
LEAST_REPEATS = 3
BLOCKS = 3
ELEMENT_BYTES = 4  # fp32 buffers, as nccl-tests' default


@dataclass(frozen=True)
class Layout:
    """This rank's place: its global rank, the world, and the ranks of each node."""

    rank: int
    world: int
    per_node: int

    @property
    def nodes(self) -> int:
        return self.world // self.per_node


def fit(sizes: list[int], seconds: list[float]) -> tuple[float, float | None, float]:
    """``(latency_s, GB/s, r²)`` of the line through (size, seconds), least squares on relative error
    (``numpy.polyfit`` weighted by 1/seconds, so a 4 KiB message counts as much as a 64 MiB one). The rate is
    None where time does not grow with size; the latency is never below 0; r² is of the line, at least 0."""
    import numpy as np

    x, y = np.asarray(sizes, dtype=float), np.maximum(np.asarray(seconds, dtype=float), 1e-9)
    if len(x) < 2 or np.ptp(x) == 0:
        return float(y.min()), None, 0.0
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - (slope * x + intercept)) ** 2)) / spread if spread > 0 else 0.0
    rate = 1.0 / float(slope) / 1e9 if slope > 0 else None
    return max(float(intercept), 0.0), rate, max(r2, 0.0)


def _operation(
    op: str, nbytes: int, ranks: int, group: ProcessGroup | None, pair: tuple[int, int], layout: Layout,
    device: torch.device,
) -> tuple[Callable[[], object], int]:  # fmt: skip
    """The call that runs ``op`` once on this rank, and the bytes of its message (rounded to whole elements,
    a multiple of the ranks)."""
    import torch
    import torch.distributed as dist

    elements = max(ranks, nbytes // ELEMENT_BYTES // ranks * ranks)
    whole = torch.ones(elements, device=device)
    share = torch.ones(elements // ranks, device=device)
    out = torch.empty(elements, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    calls: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(whole, group=group),
        "all_gather": lambda: gather(out, share, group=group),
        "reduce_scatter": lambda: scatter(share, whole, group=group),
        "all_to_all": lambda: dist.all_to_all_single(out, whole, group=group),
    }
    if op == "send_recv":
        first, second = pair

        def ping_pong() -> None:
            if layout.rank == first:
                dist.send(whole, second)
                dist.recv(out, second)
            elif layout.rank == second:
                dist.recv(out, first)
                dist.send(whole, first)

        return ping_pong, elements * ELEMENT_BYTES
    return calls[op], elements * ELEMENT_BYTES


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(run: Callable[[], object], device: torch.device, target_s: float) -> float:
    """One call's time on this rank, the median of three blocks of calls (a block that another process on the
    machine slowed counts once); every rank runs the same number of calls: a first call estimates how many fill
    ``target_s``, and every rank takes the fewest any rank asked for."""
    import statistics

    from torch.utils.benchmark import Timer

    slowest([0.0], device)  # every rank starts together
    started = time.perf_counter()
    run()
    _sync(device)
    once = max(time.perf_counter() - started, 1e-7)
    repeats = fewest(min(MOST_REPEATS, max(LEAST_REPEATS, math.ceil(target_s / once / BLOCKS))), device)
    timer = Timer(stmt="run()", globals={"run": run})
    blocks = []
    for _ in range(BLOCKS):
        slowest([0.0], device)
        blocks.append(float(timer.timeit(repeats).mean))
    return statistics.median(blocks)


def _intra_group(layout: Layout) -> ProcessGroup | None:
    """Each node's ranks as a group (every rank takes part in making every node's); None for a one-node world."""
    import torch.distributed as dist

    if layout.nodes == 1:
        return None
    group: ProcessGroup = dist.new_subgroups(group_size=layout.per_node)[0]  # type: ignore[no-untyped-call]
    return group


LOAD_SIDE = 384
"""The side of the square product the load thread repeats: a few milliseconds on one CPU core, long enough that
the thread holds the interpreter's lock only between products."""
LOAD_THREAD = "gpudays-profile-load"


@contextmanager
def cores_busy(device: torch.device) -> Iterator[None]:
    """On the CPU, a thread of this rank computing matrix products until the block ends (on its rank's share of the
    cores, as the step's compute is); on a GPU, nothing."""
    if device.type != "cpu":
        yield
        return
    import torch

    stop = threading.Event()
    square = torch.randn(LOAD_SIDE, LOAD_SIDE)

    def compute() -> None:
        while not stop.is_set():
            torch.matmul(square, square)

    thread = threading.Thread(target=compute, name=LOAD_THREAD, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def measure(
    layout: Layout, sizes: list[int], ops: list[str], device: torch.device, target_s: float
) -> list[CollectiveFit]:
    """Every op of ``ops`` at every size on every link this world has (inside a node where a node has two ranks,
    across nodes where there are two), each fitted; on the CPU with the cores busy (:func:`cores_busy`)."""
    if unknown := [op for op in ops if op not in OPS]:
        raise ValueError(f"collective(s) {', '.join(unknown)}: use {', '.join(OPS)}")
    with cores_busy(device):
        return _measure(layout, sizes, ops, device, target_s)


def _measure(
    layout: Layout, sizes: list[int], ops: list[str], device: torch.device, target_s: float
) -> list[CollectiveFit]:
    out: list[CollectiveFit] = []
    intra = _intra_group(layout)
    for link in LINKS:
        ranks = layout.per_node if link == "intra" else layout.world
        if ranks < 2 or (link == "inter" and layout.nodes < 2):
            continue
        group = intra if link == "intra" else None
        pair = (0, 1) if link == "intra" else (0, layout.per_node)
        for op in ops:
            measured: list[int] = []
            seconds: list[float] = []
            for size in sizes:
                run, nbytes = _operation(op, size, ranks, group, pair, layout, device)
                measured.append(nbytes)
                seconds.append(_seconds(run, device, target_s) / (2.0 if op == "send_recv" else 1.0))
            seconds = slowest(seconds, device)
            latency, rate, r2 = fit(measured, seconds)
            width = 2 if op == "send_recv" else ranks
            out.append(CollectiveFit(op, link, width, tuple(measured), tuple(seconds), latency, rate, r2))
    return out
