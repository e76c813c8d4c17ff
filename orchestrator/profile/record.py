"""A profile on disk: the figures one ``gpudays profile`` run measured, with the identity of the hardware, as one
JSON file in a sweep folder's ``profiles/`` (``SweepPaths.profile``), found again by that identity.

Every figure is the slowest rank's (a step waits for it), in seconds; the rates are derived from them. A file that
cannot be read as a profile raises :class:`BadProfile` naming the file and the key.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TypeVar

from orchestrator.profile.identity import Identity
from orchestrator.store.durable import write_json_atomic
from orchestrator.store.paths import SweepPaths, read_regular_file

FORMAT = 1
"""The layout of a profile file; a file of another layout is refused, not guessed at."""
PASSES = ("forward", "backward_input", "backward_weight")
"""The three products of a linear layer ``y = x @ w.T`` (``w``: out x in): the forward, the gradient of its input
(``dy @ w``) and of its weight (``dy.T @ x``)."""
LINKS = ("intra", "inter")
"""Inside a node, and across nodes (measured only where the job spans two)."""
OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")


class BadProfile(ValueError):
    """A profile file that is missing, damaged, or of another layout; the message names the file and why."""


@dataclass(frozen=True)
class MatmulTime:
    """One product ``(m x k) @ (k x n)`` of a model's linear layer, as a step runs it."""

    label: str
    """What the product is of, and for which model: ``pythia-70m qkv`` (h x 3h), ``out`` (h x h), ``ffn``, ``vocab``."""
    step: str
    """One of :data:`PASSES`."""
    m: int
    k: int
    n: int
    dtype: str
    """bf16, fp16, fp32, or tf32 (fp32 storage, TF32 tensor cores)."""
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12


@dataclass(frozen=True)
class AttentionTime:
    """``torch.nn.functional.scaled_dot_product_attention`` over ``batch`` sequences, causal, as many key/value
    heads as query heads."""

    seq_len: int
    heads: int
    head_dim: int
    batch: int
    dtype: str
    forward_s: float
    backward_s: float

    @property
    def forward_flops(self) -> float:
        """The two products (scores and the weighted sum), 2 FLOPs a multiply-add, half of them masked away."""
        return 2.0 * 2.0 * self.batch * self.heads * self.seq_len**2 * self.head_dim / 2.0

    @property
    def forward_tflops(self) -> float:
        return self.forward_flops / self.forward_s / 1e12

    @property
    def backward_tflops(self) -> float:
        """Counting the backward as twice the forward's products (no recomputation counted)."""
        return 2.0 * self.forward_flops / self.backward_s / 1e12


@dataclass(frozen=True)
class MemoryTime:
    """A device-memory stream: ``copy`` (read one buffer, write one) or ``add`` (read two, write one)."""

    op: str
    bytes_moved: int
    seconds: float

    @property
    def gbytes_s(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


@dataclass(frozen=True)
class CollectiveFit:
    """One collective over one link at several message sizes, and the line ``seconds = latency + size / rate``
    fitted to them (least squares on relative error, so the small sizes fix the latency).

    ``sizes_bytes`` follow nccl-tests: the whole buffer of a rank (all-reduce's tensor, all-gather's output,
    reduce-scatter's input, all-to-all's send buffer, the message of a send/recv). ``gbytes_s`` is that size over
    the time it adds (nccl-tests' algorithm bandwidth); ``bus_gbytes_s`` scales it as nccl-tests' bus bandwidth does.
    """

    op: str
    link: str
    ranks: int
    sizes_bytes: tuple[int, ...]
    seconds: tuple[float, ...]
    latency_s: float
    """The fitted intercept, never below 0."""
    gbytes_s: float | None
    """None where time did not grow with size over the sizes measured (no rate can be read from them)."""
    r2: float

    @property
    def bus_factor(self) -> float:
        n = self.ranks
        return {"all_reduce": 2.0 * (n - 1) / n, "send_recv": 1.0}.get(self.op, (n - 1) / n)

    @property
    def bus_gbytes_s(self) -> float | None:
        return None if self.gbytes_s is None else self.gbytes_s * self.bus_factor


@dataclass(frozen=True)
class Profile:
    identity: Identity
    measured_at: str
    """UTC, ISO 8601."""
    wall_s: float
    """How long the measurements took (the ranks' start-up not counted)."""
    matmuls: tuple[MatmulTime, ...]
    attention: tuple[AttentionTime, ...]
    memory: tuple[MemoryTime, ...]
    collectives: tuple[CollectiveFit, ...]

    def to_json(self) -> Mapping[str, object]:
        return {"format": FORMAT, **asdict(self)}


T = TypeVar("T")


def _value(kind: object, value: object, where: str) -> object:
    """``value`` checked against one field's type (int, float, str, ``float | None`` or a tuple of them)."""
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, list):
            raise BadProfile(f"{where}: expected a list, got {type(value).__name__}")
        item = typing.get_args(kind)[0]
        return tuple(_value(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if kind == float | None:
        return None if value is None else _value(float, value, where)
    if kind is str and isinstance(value, str):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if value < 0:
            raise BadProfile(f"{where}: {value} is negative")
        return float(value)
    name = getattr(kind, "__name__", str(kind))
    raise BadProfile(f"{where}: expected {'a positive int' if kind is int else name}, got {value!r}")


def _build(cls: type[T], data: object, where: str) -> T:
    """``cls`` from a JSON mapping whose keys are exactly its fields, each value of the field's type."""
    if not isinstance(data, Mapping):
        raise BadProfile(f"{where}: expected a mapping, got {type(data).__name__}")
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    missing, unknown = [n for n in names if n not in data], sorted(str(k) for k in data if k not in names)
    if missing or unknown:
        said = [f"missing {', '.join(missing)}"] * bool(missing) + [f"unknown {', '.join(unknown)}"] * bool(unknown)
        raise BadProfile(f"{where}: {'; '.join(said)} (expected the keys {', '.join(names)})")
    hints = typing.get_type_hints(cls)
    return cls(**{n: _value(hints[n], data[n], f"{where}.{n}") for n in names})


def _many(cls: type[T], data: Mapping[str, object], key: str, where: str) -> tuple[T, ...]:
    items = data.get(key)
    if not isinstance(items, list):
        raise BadProfile(f"{where}: {key}: expected a list, got {type(items).__name__}")
    return tuple(_build(cls, item, f"{where}: {key}[{i}]") for i, item in enumerate(items))


def profile_from_json(data: object, where: str) -> Profile:
    """A profile from the JSON it was written as; BadProfile naming ``where`` and the key that is wrong."""
    if not isinstance(data, Mapping):
        raise BadProfile(f"{where}: expected a JSON object (a profile), got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise BadProfile(f"{where}: format {data.get('format')!r} is not a profile of this gpudays (format {FORMAT})")
    expected = {"format", *(f.name for f in fields(Profile))}
    if unknown := sorted(str(k) for k in data if k not in expected):
        raise BadProfile(f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(expected))}")
    identity = _build(Identity, data.get("identity"), f"{where}: identity")
    head = _build(_Head, {k: data.get(k) for k in ("measured_at", "wall_s")}, where)
    return Profile(
        identity,
        head.measured_at,
        head.wall_s,
        _many(MatmulTime, data, "matmuls", where),
        _many(AttentionTime, data, "attention", where),
        _many(MemoryTime, data, "memory", where),
        _many(CollectiveFit, data, "collectives", where),
    )


@dataclass(frozen=True)
class _Head:
    measured_at: str
    wall_s: float


def read_profile(path: Path) -> Profile:
    """The profile in ``path``; BadProfile naming the file where it is missing or not a profile."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except FileNotFoundError:
        raise BadProfile(f"{path}: no such profile") from None
    except OSError as e:
        raise BadProfile(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise BadProfile(f"{path}: not UTF-8 text (byte {e.start}); damaged") from None
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadProfile(f"{path}: not valid JSON ({e}); damaged") from None
    return profile_from_json(data, str(path))


def write_profile(paths: SweepPaths, profile: Profile) -> Path:
    """Keep ``profile`` in the sweep folder, under its identity's key (replacing an older one of that identity)."""
    target = paths.profile(profile.identity.key())
    write_json_atomic(target, profile.to_json())
    return target


def profiles_in(paths: SweepPaths) -> list[Path]:
    """The profile files of a sweep folder, by name."""
    folder = paths.profiles_dir
    return sorted(p for p in folder.glob("*.json") if p.is_file()) if folder.is_dir() else []


def find_profile(folders: Iterable[SweepPaths], identity: Identity) -> tuple[Path, Profile] | None:
    """The newest profile of ``identity`` in these sweep folders, and its file; None where there is none. Files are
    judged by the identity they hold, not their names; a damaged one raises BadProfile (it is not passed over)."""
    found = [(p, read_profile(p)) for paths in folders for p in profiles_in(paths)]
    mine = [(p, prof) for p, prof in found if prof.identity == identity]
    return max(mine, key=lambda pair: pair[1].measured_at) if mine else None


def profile_for(path: Path, identity: Identity) -> Profile:
    """The profile in ``path``, refused (BadProfile) where it was measured on other hardware."""
    profile = read_profile(path)
    if profile.identity != identity:
        differ = "; ".join(profile.identity.differences(identity))
        raise BadProfile(f"{path}: measured on {profile.identity.describe()}, not this hardware ({differ})")
    return profile
