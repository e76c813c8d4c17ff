"""A table as ``gpudays`` shows it: fitted to the terminal it is printed in, or whole as CSV or JSON.

On a terminal no column is ever cut: where a table's columns do not fit the width, whole columns are left out,
those of the highest ``drop`` rank first (each table states its order; the README lists them), and the caption
names what was left out. The columns that carry the answer have rank 0 and are never left out; where even they do
not fit, every row folds into a block of ``header value`` pairs. A console that is no terminal (a pipe, a file)
gets the table at its full width. ``--format csv|json`` prints every column of every row with its raw value,
named as in ``cells.csv``, for a script to read.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from orchestrator.cli.display.figures import count, figure
from orchestrator.cli.parser import FORMATS as FORMATS  # noqa: E402 - one list of formats, the parser's

"""What ``--format`` accepts: a table fitted to the terminal, or every column as CSV or JSON."""

GAP = 2
"""Spaces between two columns (rich's padding of one on either side, none at the edges)."""
MIN_WRAP_WIDTH = 24
"""The narrowest a wrapping column (a reason) is squeezed to before columns are left out for it."""
MAX_CELL_CHARS = 120
"""A text longer than this is cut on screen (``...``); CSV and JSON carry it whole."""
MAX_WRAP_CHARS = 600
"""The same for a wrapping column (a reason): a few lines of it."""


def printable(text: str) -> str:
    """Text any terminal can take: undecodable bytes (surrogates) as ``\\udcff``, control characters escaped."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    # Control characters (a terminal's escape sequences) in a record or a name are shown, not obeyed.
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else repr(c)[1:-1] for c in text)


def missing(value: object) -> bool:
    """None, NaN, or pandas' NA."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    try:
        return bool(value != value)  # NaN of numpy's floats; pandas.NA raises on bool()
    except TypeError:
        return True


def fmt(value: object) -> str:
    """A number as every table writes it (``figures``: four significant digits, thousands grouped; a whole number
    exactly), yes/no, or a dash for a missing value."""
    if missing(value):
        return "-"
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "yes" if value else "no"
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return figure(float(value))  # type: ignore[arg-type]
    if isinstance(value, int) or type(value).__name__.startswith(("int", "uint")):
        return count(int(value))  # type: ignore[call-overload]
    return printable(" ".join(str(value).split()))


@dataclass(frozen=True)
class Column:
    """One column on a terminal: the row's key, its short header, and when it is left out for width."""

    key: str
    header: str
    numeric: bool = False
    """Right-aligned."""
    drop: int = 0
    """0: carries the answer, never left out; otherwise left out for width from the highest rank down."""
    wrap: bool = False
    """A long text (a reason) that wraps in the room left, down to MIN_WRAP_WIDTH, rather than being left out."""


@dataclass
class Tabular:
    """Rows to show, the columns a terminal shows of them, and the text around them.

    ``data`` is what ``--format csv|json`` prints (every column, raw values; the shown rows where None).
    ``footer``: lines after the table on a terminal only (the one-line answers).
    """

    columns: Sequence[Column]
    rows: Sequence[Mapping[str, object]]
    caption: str | None = None
    header: RenderableType | None = None
    footer: Sequence[str] = ()
    data: Sequence[Mapping[str, object]] | None = None
    text: Callable[[str, object], Text] | None = None
    """How a value is shown (a state in its colour); ``fmt`` as plain text where None."""
    empty: str = "(no rows)"
    brief: bool = False
    """On a terminal the header alone (``status --summary``); CSV and JSON still carry the rows."""
    left_out: list[str] = field(default_factory=list)
    """The headers the last rendering left out for width."""

    def _texts(self) -> list[list[Text]]:
        def one(c: Column, value: object) -> Text:
            out = self.text(c.key, value) if self.text is not None else Text(fmt(value))
            most = MAX_WRAP_CHARS if c.wrap else MAX_CELL_CHARS
            return out if len(out.plain) <= most else out[: most - 3] + "..."

        return [[one(c, row.get(c.key)) for c in self.columns] for row in self.rows]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        if self.header is not None:
            yield self.header
        if self.brief:
            return
        if not self.rows:
            yield Text(self.empty)
        else:
            yield from self._fitted(options.max_width)
        for line in self.footer:
            yield Text(printable(line))

    def _fitted(self, width: int) -> Iterator[RenderableType]:
        texts = self._texts()
        natural = [max(len(c.header), *(t[i].cell_len for t in texts)) for i, c in enumerate(self.columns)]
        kept = choose_columns(self.columns, natural, width, [[t.plain for t in row] for row in texts])
        notes = [self.caption] if self.caption else []
        if kept is None:
            self.left_out = []
            yield from _folded(self.columns, texts, width)
        else:
            self.left_out = [c.header for i, c in enumerate(self.columns) if i not in kept]
            t = Table(show_edge=False, pad_edge=False, header_style="bold", box=None)
            for i in kept:
                c = self.columns[i]
                t.add_column(c.header, justify="right" if c.numeric else "left", no_wrap=not c.wrap, overflow="fold")
            for row in texts:
                t.add_row(*(row[i] for i in kept))
            yield from _trimmed(t, width)
            if self.left_out:
                notes.append(f"left out for the terminal's width: {', '.join(self.left_out)} (all: --format csv)")
        for note in notes:
            yield Text(note, style="dim")


def _trimmed(table: Table, width: int) -> Iterator[RenderableType]:
    """The table's lines without the spaces rich pads its last column with (a file or a pipe keeps them)."""
    console = Console(width=width, force_terminal=True, color_system="truecolor")
    for line in console.render_lines(table, console.options.update(width=width), pad=False):
        while line and not line[-1].text.strip():
            line.pop()
        if line:
            last = line.pop()
            line.append(Segment(last.text.rstrip(), last.style, last.control))
        yield Segments([*line, Segment.line()])


def choose_columns(
    columns: Sequence[Column], natural: Sequence[int], width: int, rows: Sequence[Sequence[str]] = ()
) -> list[int] | None:
    """The indices of the columns that fit ``width``, leaving out the highest ``drop`` ranks first (the rightmost
    of equal rank first) until the rest fit; None where even the rank-0 columns do not fit (the table folds).

    ``rows``, the texts shown: no two rows that differ may look the same. Where the columns kept make two rows
    alike, the left-out column of the lowest rank that tells them apart is kept as if of rank 0 and the choice is
    made again (other columns left out in its place); where those no longer fit, the table folds."""
    pinned: set[int] = set()
    while True:
        kept = _fitting(columns, natural, width, pinned)
        if kept is None:
            return None
        apart = telling_apart(columns, rows, kept)
        if apart is None:
            return kept
        pinned.add(apart)


def telling_apart(columns: Sequence[Column], rows: Sequence[Sequence[str]], kept: Sequence[int]) -> int | None:
    """None where no two different ``rows`` look the same in the ``kept`` columns; else the column left out, of
    the lowest ``drop`` rank, that tells some of them apart."""
    alike: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for row in rows:
        alike.setdefault(tuple(row[i] for i in kept), set()).add(tuple(row))
    groups = [group for group in alike.values() if len(group) > 1]
    if not groups:
        return None
    left_out = [i for i in range(len(columns)) if i not in kept]
    telling = [i for i in left_out if any(len({row[i] for row in group}) > 1 for group in groups)]
    return min(telling, key=lambda i: (columns[i].drop, i))


def _fitting(columns: Sequence[Column], natural: Sequence[int], width: int, pinned: set[int]) -> list[int] | None:
    """Columns left out in their stated order until the rest fit; ``pinned`` ones never (as rank 0)."""

    def needed(kept: list[int]) -> int:
        widths = [min(natural[i], MIN_WRAP_WIDTH) if columns[i].wrap else natural[i] for i in kept]
        return sum(widths) + GAP * max(0, len(kept) - 1)

    kept = list(range(len(columns)))
    dropped: list[int] = []
    while needed(kept) > width:
        droppable = [i for i in kept if columns[i].drop > 0 and i not in pinned]
        if not droppable:
            return None
        dropped.append(max(droppable, key=lambda i: (columns[i].drop, i)))
        kept.remove(dropped[-1])
    # Leaving out a wide column may have made room for the one left out just before it, and so on back: the order
    # stays the stated one (never a column of a higher rank kept while one of a lower rank is left out).
    for i in reversed(dropped[:-1]):
        if needed(sorted([*kept, i])) > width:
            break
        kept = sorted([*kept, i])
    return kept


def _folded(columns: Sequence[Column], texts: Sequence[Sequence[Text]], width: int) -> Iterator[RenderableType]:
    """Each row a block of ``header value`` pairs, as many to a line as the width takes; a blank line between."""
    for n, row in enumerate(texts):
        block = Text()
        used = 0
        for c, value in zip(columns, row, strict=True):
            pair = Text(f"{c.header} ", style="bold") + value
            if used and used + GAP + pair.cell_len > width:
                block.append("\n")
                used = 0
            elif used:
                block.append(" " * GAP)
                used += GAP
            block.append_text(pair)
            used += pair.cell_len
        if n:
            yield Text("")
        yield block


def _plain(value: object) -> object:
    """A value as JSON takes it: NaN and NA as null, numpy's scalars as Python's."""
    if missing(value):
        return None
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, (str, bytes)) else value


def as_csv(rows: Sequence[Mapping[str, object]]) -> str:
    """Every column of every row (the union of their keys, in order of appearance) as CSV; missing is empty."""
    import pandas as pd

    keys = list(dict.fromkeys(k for row in rows for k in row))
    frame = pd.DataFrame([{k: _plain(row.get(k)) for k in keys} for row in rows], columns=keys).convert_dtypes()
    return str(frame.to_csv(index=False))


def as_json(rows: Sequence[Mapping[str, object]]) -> str:
    """Every row as a JSON object (a list of them); NaN and NA as null."""
    return json.dumps([{k: _plain(v) for k, v in row.items()} for row in rows], default=str, indent=1) + "\n"


def machine_text(view: Tabular, form: str) -> str:
    """What ``--format csv|json`` prints for a table: its data (every column), else its rows."""
    rows = view.data if view.data is not None else view.rows
    return as_csv(rows) if form == "csv" else as_json(rows)
