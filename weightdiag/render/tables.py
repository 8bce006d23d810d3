"""Rich renderings of rows: the per-kind summary table and the fit progress bar."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.measure import Measurement
from rich.table import Column, Table

from ..diagnose.classes import k_class_label, kind_records
from ..progress import Relay, Silent

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
    from rich.progress import Progress, TaskID

    from ..record.schema import Row


def fmt(value: Any, spec: str = ".4f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def counted(n: int, singular: str, plural: str | None = None, *, every: bool = False) -> str:
    """'1 matrix', '2 matrices' ('all 2 matrices', 'the 1 matrix' with every=True)."""
    word = singular if n == 1 else (plural or singular + "s")
    return f"{'the' if n == 1 else 'all'} {n} {word}" if every else f"{n} {word}"


class FitWidth:
    """A table that drops columns to fit the width it is given, instead of cutting cells with "…".

    Each variant of the table is tried in turn: the whole table, then without its empty columns, then without
    each of the `optional` columns in order. The first whose cells fit whole is drawn, its headers folded at
    spaces where that is what it takes ("same-group k range" on two lines). When even the narrowest does not
    fit, the `no_wrap` columns (numbers, ids) stay whole while the others fold at spaces; only if that is still
    too wide do they give way too, from the right (the first column, usually an id, last). Nothing is ever cut
    with an ellipsis, and a title or caption word (a model id) is never split while the width allows it.
    """

    def __init__(
        self, table: Table, optional: Iterable[str] = (), retitle: Callable[[list[str]], str] | None = None
    ) -> None:
        self.table = table
        self.optional = tuple(optional)
        self.retitle = retitle  # the title for the columns a variant keeps: it never names a dropped one
        for column in table.columns:
            column.overflow = "fold"

    def _variants(self) -> Iterator[Table]:
        yield self.table
        dropped = {str(c.header) for c in self.table.columns if not any(str(cell).strip() for cell in c.cells)}
        if dropped:
            yield self._without(dropped)
        for name in self.optional:
            dropped.add(name)
            yield self._without(dropped)

    def _without(self, names: set[str]) -> Table:
        narrower = copy.copy(self.table)
        narrower.columns = [c for c in self.table.columns if str(c.header) not in names]
        if self.retitle is not None:
            narrower.title = self.retitle([str(c.header) for c in narrower.columns])
        return narrower

    @staticmethod
    def _headers(console: Console, options: ConsoleOptions, table: Table) -> list[Measurement]:
        """Each header's (longest word, whole width): a header may fold at its spaces."""
        if not table.show_header:
            return [Measurement(0, 0) for _ in table.columns]
        return [Measurement.get(console, options, column.header) for column in table.columns]

    @staticmethod
    def _cells(console: Console, options: ConsoleOptions, table: Table) -> Measurement:
        """The table's (minimum, maximum) width from its cells alone, padding and borders included."""
        headless = copy.copy(table)
        headless.show_header = False
        return Measurement.get(console, options, headless)

    @staticmethod
    def _columns(console: Console, options: ConsoleOptions, column: Column) -> Measurement:
        """One column's cells: (longest word, widest line), no padding."""
        widths = [Measurement.get(console, options, cell) for cell in column.cells]
        if not widths:
            return Measurement(0, 0)
        return Measurement(max(w.minimum for w in widths), max(w.maximum for w in widths))

    def fitting(self, console: Console, options: ConsoleOptions) -> Table | None:
        """The first variant whose cells all fit `options.max_width` whole (headers folded at spaces where
        needed), sized to it; None when even the narrowest does not fit."""
        width = options.max_width
        unbounded = options.update_width(1 << 20)  # Measurement.get clamps to the width it is given
        for table in self._variants():
            if not table.row_count or Measurement.get(console, unbounded, table).maximum <= width:
                return self._whole_words(console, unbounded, table, width)
            sized = self._sized(console, unbounded, table, width, whole=[True] * len(table.columns))
            if sized is not None:
                return self._whole_words(console, unbounded, sized, width)
        return None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.fitting(console, options)
        if table is None:
            table = self._fold(console, options.update_width(1 << 20), self._narrowest(), options.max_width)
        yield table

    def _narrowest(self) -> Table:
        *_, table = self._variants()
        return table

    def _sized(
        self, console: Console, options: ConsoleOptions, table: Table, width: int, whole: list[bool]
    ) -> Table | None:
        """`table` with a fixed width per column, or None if it does not fit: the `whole` columns at their
        widest cell, the others at least at their longest word, every header at least at its longest word;
        what is left goes to the columns that need the least to be whole (their cells, then their header)."""
        headers = self._headers(console, options, table)
        cells = [self._columns(console, options, c) for c in table.columns]
        overhead = self._cells(console, options, table).maximum - sum(c.maximum for c in cells)  # padding, borders
        room = width - overhead
        widths = [
            max(c.maximum if keep else c.minimum, h.minimum) for c, h, keep in zip(cells, headers, whole, strict=True)
        ]
        if sum(widths) > room:
            return None
        slack = room - sum(widths)
        whole_cells = [c.maximum for c in cells]
        whole_headers = [max(c.maximum, h.maximum) for c, h in zip(cells, headers, strict=True)]
        for wanted in (whole_cells, whole_headers):
            needs = [max(0, want - have) for want, have in zip(wanted, widths, strict=True)]
            for i in sorted(range(len(widths)), key=needs.__getitem__):
                grow = min(slack, needs[i])
                widths[i] += grow
                slack -= grow
        sized = copy.copy(table)
        sized.columns = [copy.copy(c) for c in table.columns]
        for column, column_width in zip(sized.columns, widths, strict=True):
            column.no_wrap = False  # a whole column's cells fit its width anyway; its header may fold
            column.width = column_width
        return sized

    def _fold(self, console: Console, options: ConsoleOptions, table: Table, width: int) -> Table:
        """Narrower than the narrowest variant: the other columns fold at spaces while the `no_wrap` ones
        stay whole; those give way from the right only when that is still too wide (the first, usually an
        id, last); and if even that does not fit, every column folds its share, words included."""
        whole = [bool(c.no_wrap) for c in table.columns]
        while True:
            sized = self._sized(console, options, table, width, whole)
            if sized is not None:
                return self._whole_words(console, options, sized, width)
            if not any(whole):
                break
            whole[max(i for i, keep in enumerate(whole) if keep)] = False
        folded = copy.copy(table)
        folded.columns = [copy.copy(c) for c in table.columns]
        for column in folded.columns:
            column.no_wrap = False
        return folded

    @staticmethod
    def _whole_words(console: Console, options: ConsoleOptions, table: Table, width: int) -> Table:
        """A table at least as wide as the longest word of its title and caption (a model id, a path), so
        that the word is not split across lines, as long as the console is that wide."""
        texts = [t for t in (table.title, table.caption) if t]
        words = [Measurement.get(console, options, t).minimum for t in texts]
        # Where the width allows, each title and caption line whole too (issue 21: `db show X > file` and a
        # sweep's summary folded theirs onto a second line under a narrower table).
        lines = [Measurement.get(console, options, t).maximum for t in texts]
        wanted = max(lines) if lines and max(lines) <= width else max(words, default=0)
        if wanted > (table.min_width or 0):
            table = copy.copy(table)
            table.min_width = min(width, wanted)
        return table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)


class FirstFit:
    """The first of several renderings whose tables (FitWidth) all fit the width whole; else the last one.

    For a view with a compact form: `trajectory` shows "k (λ)" per cell where there is room, and separate
    k, λ and T/τ tables where there is not, rather than numbers folded across lines.
    """

    def __init__(self, *choices: Sequence[Any]) -> None:
        self.choices = choices

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for choice in self.choices:
            if all(part.fitting(console, options) is not None for part in choice if isinstance(part, FitWidth)):
                yield from choice
                return
        yield from self.choices[-1]


# The two class columns, said under every per-kind table (issue 21): what the kind is, and what its k says.
CLASS_LEGEND = (
    "class: the kind's role (Weibull paper, Sec. 2.2): Q/K select, V/O/FFN transmit\n"
    "k class: from median k (transmission >= 1.18 > selection-mild >= 1.045 > deep)"
)


def _below(summary: Mapping[str, Any]) -> str | None:
    """The R²<0.95 cell: how many of the kind's fits, out of those fitted ("0/6")."""
    below = summary.get("r2_below_95")
    return None if below is None else f"{below}/{summary.get('fitted')}"


def kinds_table(row: Row, title: str | None = None) -> FitWidth:
    model = row["model"]
    arch = row.get("architecture") or {}  # null in a row (the schema allows it) as well as absent
    if model["source"] == "cohort":
        contents = f"{model['cohort']} summary: per-kind medians only"
    else:
        # A row's summary (db show) has `counts` in place of the records themselves.
        n_matrices, n_vectors = (
            (len(row["matrices"]), len(row["vectors"]))
            if "matrices" in row
            else (row["counts"]["matrices"], row["counts"]["vectors"])
        )
        contents = (
            f"{counted(n_matrices, 'matrix', 'matrices')}, {counted(n_vectors, 'vector')}, "
            f"{len(row['skipped'])} skipped"
        )
    caption = f"protocol {row['protocol']['name']}, trim {row['protocol']['trim']}"
    if model["source"] != "cohort":
        caption += f"; {contents}"
    if arch.get("attention"):
        caption += f"; attention {arch['attention']}"
    if model["source"] == "cohort":  # a line of its own: caption lines never fold, even in a file (issue 21)
        caption += f"\n{contents}"
    caption += "\n" + CLASS_LEGEND
    table = Table(
        title=escape(title or f"{model['id']}" + (f"@{model['revision']}" if model.get("revision") else "")),
        caption=caption,
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("kind", "left"),
        ("class", "left"),
        ("n", "right"),
        ("median k", "right"),
        ("median λ", "right"),
        ("median R²", "right"),
        ("R²<0.95", "right"),
        ("k class", "left"),
        ("flags", "left"),
    )
    for col, justify in columns:
        # Numbers and the kind never wrap; the class names and flags fold when space is short.
        table.add_column(col, justify=justify, no_wrap=col not in ("class", "k class", "flags"))
    # The kinds of whole matrices, then those of fused matrices' parts.
    for parts, summaries in ((False, row["kinds"]), (True, row.get("part_kinds", {}))):
        for kind, s in summaries.items():
            table.add_row(
                f"{kind} (part)" if parts else kind,
                s["class"],
                str(s["count"]),
                fmt(s["k_median"]),
                fmt(s["lambda_median"], ".5g"),
                fmt(s["r2_median"]),
                _below(s),
                k_class_label(s, kind_records(row, kind, parts=parts)),
                ", ".join(s["flags"]),
            )
    # Narrow terminals (80 columns) lose the least needed columns first rather than show "0.0712…".
    return FitWidth(table, optional=("median R²", "R²<0.95", "flags"))


class FitProgress(Silent):
    """The Progress (weightdiag/progress.py) the command line draws on stderr: tensors, bytes, rate and ETA."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        from ..settings import progress_bars

        self.console = console
        self.enabled = enabled and progress_bars()  # HF_HUB_DISABLE_PROGRESS_BARS=1 hides it, as huggingface_hub's
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._done = 0

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        if not self.enabled:
            return
        self.close()  # a sweep fits one revision after another: one bar each
        # Imported here: rich.progress costs ~10 ms and quiet or piped runs never draw a bar.
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.table import Column

        # One line at any width: the counters (~45 columns) keep theirs, the model id and the bar share
        # the rest, and the rate goes first below 100 columns (the ETA says the same).
        narrow = self.console.width < 100
        room = max(self.console.width - (47 if narrow else 59), 13)
        bar = max(min(40, room // 3), 5)
        columns = [
            TextColumn(
                "{task.description}",
                style="bold",
                markup=False,  # the model id, as given
                table_column=Column(max_width=max(room - bar - 1, 8), no_wrap=True, overflow="ellipsis"),
            ),
            BarColumn(bar_width=bar),
            TextColumn("{task.fields[done]}/{task.fields[tensors]} tensors"),
            DownloadColumn(),
            *([] if narrow else [TransferSpeedColumn()]),
            TimeRemainingColumn(),
        ]
        self._progress = Progress(*columns, console=self.console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(model, total=nbytes, done=0, tensors=tensors)
        self._done = 0

    def read(self, nbytes: int) -> None:
        if self.enabled and self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=nbytes)  # as chunks land: a smooth rate and ETA

    def measured(self, tensor: str) -> None:
        if self.enabled and self._progress is not None and self._task is not None:
            self._done += 1
            self._progress.update(self._task, done=self._done)

    def spectra_started(self, matrices: int, flops: float) -> None:
        """fit --spectrum's second pass: its own bar, advanced by flops."""
        if not self.enabled:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.close()
        self._progress = Progress(
            TextColumn("spectra", style="bold"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[done]}/{task.fields[matrices]} matrices"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("spectra", total=flops, done=0, matrices=matrices)
        self._done = 0

    def spectrum_taken(self, flops: float) -> None:
        if self.enabled and self._progress is not None and self._task is not None:
            self._done += 1
            self._progress.update(self._task, advance=flops, done=self._done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _amount(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


class NodeProgress(Relay):
    """`--node-progress` (with --executor ray): each time a task is handed back, one line on stderr with its node's
    tasks and bytes so far (above the progress bar on a terminal; in a log too), every call going on to `inner`
    (the bar). The counts are the run's `run.cluster` as they grow: both passes of a fit --spectrum."""

    def __init__(self, inner: FitProgress, console: Console) -> None:
        super().__init__(inner)
        self.bar = inner
        self.console = console
        self.nodes: dict[str, list[int]] = {}  # node: [tasks, bytes]

    def node_done(self, node: str, nbytes: int, spectrum: bool) -> None:
        counts = self.nodes.setdefault(node, [0, 0])
        counts[0] += 1
        counts[1] += nbytes
        done = f"{counts[0]} task{'s' if counts[0] != 1 else ''} done, {_amount(counts[1])} read"
        what = " (the last one a spectrum task)" if spectrum else ""
        self.console.print(f"{node}: {done}{what}", markup=False, highlight=False, soft_wrap=True)
        self.inner.node_done(node, nbytes, spectrum)

    def close(self) -> None:
        self.bar.close()


def plan_table(plan: Mapping[str, Any]) -> Table:
    """`fit --plan`: what the fit would do with each tensor (run/plan.py Plan.to_json())."""
    counts = plan["counts"]
    fetched = plan["bytes_read"]
    title = (
        f"{plan['model']['id']}: {counted(counts['matrix'], 'matrix', 'matrices')}, "
        f"{counted(counts['vector'], 'vector')}, {counts['skipped']} skipped"
        + (f", {counts['not selected']} not selected" if counts["not selected"] else "")
        + f"; {_amount(plan['bytes_to_read'])} to read"
        + (f" ({_amount(fetched)} fetched to plan)" if fetched is not None else "")
        + f"; --spectrum takes {sum(bool(t['spectrum']) for t in plan['tensors'])} of {counts['matrix']}"
    )
    table = Table("fate", "name", "kind", "dtype", "shape", "view/parts", "spectrum", "reason", title=escape(title))
    for t in plan["tensors"]:
        cut = t["view"] or "+".join(t["parts"])
        table.add_row(
            t["fate"],
            escape(t["name"]),
            t["kind"] or "",
            t["dtype"],
            "x".join(map(str, t["shape"])),
            cut,
            {True: "yes", False: "no"}.get(t["spectrum"], ""),
            escape(t["reason"] or t["spectrum_skipped"] or ""),
        )
    return table
