"""Where the prices behind a cost come from: the line every output that uses a GPU's price prints under its table.

Each price in ``conf/gpu`` names its source and the date it was read (``GpuConfig.cloud_price_source``,
``cloud_price_date``, likewise for the purchase price); where a GPU has no cloud price, its source says why, and
the outputs say "no price" for it rather than $0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.config.schema import GpuConfig


@dataclass(frozen=True)
class CloudPrice:
    """One GPU type's hourly cloud price, where it comes from and when it was read; ``usd_per_hour`` None: none."""

    gpu: str
    usd_per_hour: float | None
    source: str | None
    date: str | None


def cloud_prices(gpus: Iterable[GpuConfig]) -> list[CloudPrice]:
    """The cloud price of each GPU type, as its config states it."""
    return [CloudPrice(g.name, g.cloud_usd_per_gpu_hour, g.cloud_price_source, g.cloud_price_date) for g in gpus]


def price_note(prices: Iterable[CloudPrice]) -> str:
    """One line naming each price's source and date, GPUs of one source together; GPUs without a price last."""
    by_source: dict[tuple[str, str], list[str]] = {}
    none: dict[str, str] = {}
    for p in {p.gpu: p for p in prices}.values():
        if p.usd_per_hour is None:
            none[p.gpu] = p.source or "no cloud_usd_per_gpu_hour in its conf/gpu file"
        else:
            key = (p.source or "source not stated", p.date or "date not stated")
            by_source.setdefault(key, []).append(f"{p.gpu} ${p.usd_per_hour:.3g}/h")
    parts = [f"{', '.join(gpus)} ({source}, read {date})" for (source, date), gpus in by_source.items()]
    parts += [f"{gpu}: no price ({why})" for gpu, why in none.items()]
    return "cloud prices: " + ("; ".join(parts) if parts else "none used")
