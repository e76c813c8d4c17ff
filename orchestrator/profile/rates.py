"""What the step-time model reads from a profile: the rate of each matrix product by shape and precision, the
memory's streaming rate, and each collective's latency and rate on each link."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.profile.record import Profile


@dataclass(frozen=True)
class Product:
    """A product ``(m x k) @ (k x n)`` in one precision."""

    m: int
    k: int
    n: int
    dtype: str


@dataclass(frozen=True)
class Link:
    """One collective over one link: ``seconds = latency_s + bytes / (gbytes_s * 1e9)``."""

    latency_s: float
    gbytes_s: float | None
    """None where the profile could read no rate (time did not grow with size)."""

    def seconds(self, nbytes: float) -> float | None:
        return None if self.gbytes_s is None else self.latency_s + nbytes / (self.gbytes_s * 1e9)


@dataclass(frozen=True)
class Rates:
    matmul_tflops: dict[Product, float]
    """The slowest rank's rate of each product."""
    attention_tflops: dict[tuple[int, int, int, str], tuple[float, float]]
    """(seq_len, heads, head_dim, dtype) -> (forward, backward) TFLOP/s, causal."""
    memory_gbytes_s: float
    """The copy's rate: bytes read and written a second."""
    collectives: dict[tuple[str, str], Link]
    """(op, link) -> its fitted line; link ``intra`` or ``inter``."""
    source: str


def rates(profile: Profile) -> Rates:
    """The figures of ``profile`` as the step-time model reads them."""
    products = {Product(t.m, t.k, t.n, t.dtype): t.tflops for t in profile.matmuls}
    heads = {
        (a.seq_len, a.heads, a.head_dim, a.dtype): (a.forward_tflops, a.backward_tflops) for a in profile.attention
    }
    copies = [s.gbytes_s for s in profile.memory if s.op == "copy"]
    if not copies:
        raise ValueError(f"the profile of {profile.identity.describe()} holds no memory copy")
    links = {(c.op, c.link): Link(c.latency_s, c.gbytes_s) for c in profile.collectives}
    source = f"profile of {profile.identity.describe()}, measured {profile.measured_at}"
    return Rates(products, heads, copies[0], links, source)
