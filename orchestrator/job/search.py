"""Which micro-batch the search tries next: pure, from the trials so far.

The search walks the divisors of the per-GPU batch. It goes up one size while trials fit until it has two sizes
that fit; from then on it fits memory as an affine function of the micro-batch through the two largest (a
step's memory is model states, which do not depend on it, plus activations, which grow with it) and jumps to the
largest size predicted to fit. After an OOM it walks down, one size at a time, to the largest size that fitted.

With one size measured on a real device, the line goes through that trial's peak and the memory it left allocated
at rest (weights, gradients and optimizer states: the model states, measured, not modelled). The line is then at
least as steep as the true one, since what a step holds only in flight beyond the rest (a gradient freed after the
optimizer step) counts as activations; so it may overestimate a larger size, never underestimate it, and the next
size up is tried only where even this line says it fits. This spares a trial that would surely run out of memory:
on a GPU, where an OOM costs a rebuild (and with ``compile``, a recompilation), that was most of a cell's cost.

A size predicted not to fit is still tried where trying costs nothing but the trial: under an imposed limit
(``probe.memory_limit_gib``, or a CPU's resident set) a trial over it raises nothing. On a real device the
prediction is trusted, with a margin, so that the search rarely meets a real OOM, which may leave an engine
half-updated and cost a rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.store.record import Trial

DEVICE_MARGIN = 0.95
"""Fraction of a real device's memory a predicted peak may take: fragmentation and allocator slack."""


def predicted_peak_bytes(points: Sequence[tuple[int, float]], micro_batch_size: int) -> float:
    """Peak memory at ``micro_batch_size`` on the line through the two largest ``(size, peak_bytes)`` points."""
    (s1, p1), (s2, p2) = sorted(points)[-2:]
    slope = (p2 - p1) / (s2 - s1)
    return p2 + slope * (micro_batch_size - s2)


def next_size(candidates: Sequence[int], tried: Sequence[Trial], capacity: tuple[float, bool]) -> int | None:
    """The next micro-batch to try, or None when the largest size that fits is known (or nothing fits).

    ``candidates``: the sizes allowed, ascending; ``tried``: the trials so far (an ``ok`` trial has its peak, and
    its rest where measured), of which those outside ``candidates`` are ignored; ``capacity``: the bytes a peak may
    reach and whether exceeding it is harmless (an imposed limit).
    """
    allowed = set(candidates)
    mine = [t for t in tried if t.micro_batch_size in allowed]
    if not mine:
        return None
    fitted = [t for t in mine if t.outcome == "ok"]
    ok = {t.micro_batch_size: (t.peak_memory_gib or 0.0) * 2**30 for t in fitted}  # a trial that fitted has its peak
    rest = {t.micro_batch_size: t.rest_memory_gib for t in fitted}
    refused = {t.micro_batch_size for t in mine if t.outcome != "ok"}
    seen = ok.keys() | refused
    upper = min(refused, default=None)
    if not ok:
        below = [c for c in candidates if (upper is None or c < upper) and c not in seen]
        return max(below, default=None)
    best = max(ok)
    upper = min((r for r in refused if r > best), default=None)
    open_sizes = [c for c in candidates if c > best and (upper is None or c < upper) and c not in seen]
    if not open_sizes:
        return None
    if mine[-1].outcome != "ok":
        return max(open_sizes)  # walking down from a refused jump
    limit_bytes, harmless = capacity
    if len(ok) < 2:
        at_rest = rest[best]
        if harmless or at_rest is None:
            return min(open_sizes)
        one_point = [(0, at_rest * 2**30), (best, ok[best])]
        return min(open_sizes) if predicted_peak_bytes(one_point, min(open_sizes)) <= limit_bytes else None
    margin = 1.0 if harmless else DEVICE_MARGIN
    points = sorted(ok.items())
    fitting = [c for c in open_sizes if predicted_peak_bytes(points, c) <= margin * limit_bytes]
    if fitting:
        return max(fitting)
    return min(open_sizes) if harmless else None
