"""What each config field accepts: a domain declared once, beside the field, in the schema's dataclasses.

A field says ``x: int = field(default=5, metadata=domain(ge=1))``; :func:`problems` walks a dataclass and names
every value outside its field's domain with what would be accepted. ``plan``, ``sweep`` and ``--dry-run`` all judge
cells with it (through ``orchestrator.cells.cell.check_values``) before anything is submitted, and the README's table
of fields and domains is :func:`describe_all`'s output, so the rules are written once.

Hydra's typed composition already refuses a value of the wrong type; a domain refuses a value of the right type
that means nothing (a negative number of steps, a sequence of length 0, ``probe.step_timing=banana``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

DOMAIN = "domain"
"""The key of a field's metadata that holds its :class:`Domain`."""


@dataclass(frozen=True)
class Domain:
    """The values one field accepts. Numbers are finite; bounds combine (``ge=0, le=1`` is [0, 1])."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    integer: bool = False
    """A whole number (an int field, or an alternative to ``choices`` such as ``micro_batch_size``)."""
    choices: tuple[Any, ...] = ()
    """Accepted values; with bounds as well, a value is accepted when it is one of these or a number in bounds."""
    pattern: str | None = None
    """A regular expression a text value must match in full."""
    pattern_text: str = ""
    """How the pattern reads to a person."""
    at_least: str | None = None
    """Another field of the same section this one may not be below (``max_steps`` at least ``min_steps``)."""
    optional: bool = False
    """``None`` (null) is accepted and means the field's documented default."""

    def _numeric(self) -> bool:
        return self.integer or any(b is not None for b in (self.ge, self.gt, self.le))

    def accepted(self) -> str:
        """What the field accepts, as a person reads it: ``an integer >= 1``, ``one of composed, whole``."""
        parts: list[str] = []
        if self.choices:
            parts.append(f"one of {', '.join(map(str, self.choices))}" if len(self.choices) > 1 else
                         str(self.choices[0]))  # fmt: skip
        if self._numeric():
            bounds = [f">= {_num(self.ge)}" if self.ge is not None else "", f"> {_num(self.gt)}" if self.gt is not None
                      else "", f"<= {_num(self.le)}" if self.le is not None else ""]  # fmt: skip
            kind = "an integer" if self.integer else "a number"
            parts.append(" ".join([kind, " and ".join(b for b in bounds if b)]).strip())
        if self.pattern is not None:
            parts.append(self.pattern_text or f"text matching {self.pattern}")
        text = " or ".join(parts) if parts else "any value"
        if self.at_least:
            text += f", at least {self.at_least}"
        return text + (" (or null)" if self.optional else "")

    def problem(self, value: Any, section: Any = None) -> str | None:
        """Why ``value`` is outside the domain, naming what is accepted; None when it is inside.

        ``section`` is the dataclass holding the field, for a relation to a sibling (``at_least``)."""
        if value is None:
            return None if self.optional else f"null is not accepted; use {self.accepted()}"
        if self.choices and not isinstance(value, bool) and value in self.choices:
            return None  # (a bool is never taken for the number 0 or 1 of a choice)
        if self._numeric():
            if not _in_bounds(self, value):
                return f"{value!r} is not accepted; use {self.accepted()}"
        elif self.choices:
            return f"{value!r} is not accepted; use {self.accepted()}"
        if self.pattern is not None and not (isinstance(value, str) and re.fullmatch(self.pattern, value)):
            return f"{value!r} is not accepted; use {self.accepted()}"
        if self.at_least and section is not None:
            other = getattr(section, self.at_least, None)
            if isinstance(other, (int, float)) and isinstance(value, (int, float)) and value < other:
                return f"{value!r} is below {self.at_least} ({other!r}); use {other!r} or more"
        return None


def _num(bound: float | None) -> str:
    return f"{bound:g}" if bound is not None else ""


def _in_bounds(d: Domain, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not math.isfinite(value) or (d.integer and value != int(value)):
        return False
    return not (
        (d.ge is not None and value < d.ge)
        or (d.gt is not None and value <= d.gt)
        or (d.le is not None and value > d.le)
    )


def domain(**kwargs: Any) -> dict[str, Domain]:
    """A field's metadata holding its domain: ``field(default=1, metadata=domain(ge=1, integer=True))``."""
    return {DOMAIN: Domain(**kwargs)}


def domain_of(cls: type, name: str) -> Domain | None:
    """The declared domain of field ``name`` of dataclass ``cls``, or None where it declares none."""
    for f in fields(cls):
        if f.name == name:
            found = f.metadata.get(DOMAIN)
            return found if isinstance(found, Domain) else None
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def problems(section: Any, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """``(key, value, problem)`` for every field of the dataclass ``section`` outside its domain, sections within
    it included (``prefix`` names them: ``model.seq_length``)."""
    for f in fields(section):
        value = getattr(section, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value) and not isinstance(value, type):
            yield from problems(value, f"{key}.")
            continue
        d = f.metadata.get(DOMAIN)
        if isinstance(d, Domain):
            why = d.problem(value, section)
            if why is not None:
                yield key, value, why


def describe_all(cls: type, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(key, accepted)`` for every field with a domain, sections within ``cls`` included, in declaration order."""
    import typing

    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        kind = hints.get(f.name)
        if isinstance(kind, type) and is_dataclass(kind):
            yield from describe_all(kind, f"{prefix}{f.name}.")
            continue
        d = f.metadata.get(DOMAIN)
        if isinstance(d, Domain):
            yield f"{prefix}{f.name}", d.accepted()
