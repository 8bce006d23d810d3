"""Rich renderings of rows: the per-kind summary table and the fit progress bar."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from ..diagnose.classes import k_class_label, kind_records

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.progress import Progress


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

    Empty columns go first, then the `optional` ones in order; what is left still folds (never an
    ellipsis) if the console is narrower than that. Cells of `no_wrap` columns (numbers, ids) are never
    squeezed while a wrappable column can give way.
    """

    def __init__(self, table: Table, optional: Iterable[str] = ()) -> None:
        self.table = table
        self.optional = tuple(optional)
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
        return narrower

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        unbounded = options.update_width(1 << 20)  # Measurement.get clamps to the width it is given
        table = self.table
        for table in self._variants():
            if Measurement.get(console, unbounded, table).maximum <= options.max_width:
                yield table
                return
        # Narrower than the narrowest variant: every column folds its share, so none collapses to nothing.
        table = copy.copy(table)
        table.columns = [copy.copy(c) for c in table.columns]
        for column in table.columns:
            column.no_wrap = False
        yield table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)


def kinds_table(row: dict[str, Any], title: str | None = None) -> FitWidth:
    model = row["model"]
    arch = row.get("architecture", {})
    if model["source"] == "cohort":
        contents = f"{model['cohort']} summary: per-kind medians only"
    else:
        contents = (
            f"{counted(len(row['matrices']), 'matrix', 'matrices')}, {counted(len(row['vectors']), 'vector')}, "
            f"{len(row['skipped'])} skipped"
        )
    caption = f"protocol {row['protocol']['name']}, trim {row['protocol']['trim']}; {contents}"
    table = Table(
        title=escape(title or f"{model['id']}" + (f"@{model['revision']}" if model.get("revision") else "")),
        caption=caption,
    )
    for col, justify in (
        ("kind", "left"),
        ("class", "left"),
        ("n", "right"),
        ("median k", "right"),
        ("median λ", "right"),
        ("median R²", "right"),
        ("R²<0.95", "right"),
        ("k class", "left"),
        ("flags", "left"),
    ):
        # Numbers and the kind never wrap; the class names and flags fold when space is short.
        table.add_column(col, justify=justify, no_wrap=col not in ("class", "k class", "flags"))
    for kind, s in row["kinds"].items():
        table.add_row(
            kind,
            s["class"],
            str(s["count"]),
            fmt(s["k_median"]),
            fmt(s["lambda_median"], ".5g"),
            fmt(s["r2_median"]),
            s["r2_below_95"],
            k_class_label(s, kind_records(row, kind)),
            ", ".join(s["flags"]),
        )
    for kind, s in row.get("part_kinds", {}).items():
        table.add_row(
            f"{kind} (part)",
            s["class"],
            str(s["count"]),
            fmt(s["k_median"]),
            fmt(s["lambda_median"], ".5g"),
            fmt(s["r2_median"]),
            s["r2_below_95"],
            k_class_label(s, kind_records(row, kind, parts=True)),
            ", ".join(s["flags"]),
        )
    if arch.get("attention"):
        table.caption += f"; attention {arch['attention']}"
    # Narrow terminals (80 columns) lose the least needed columns first rather than show "0.0712…".
    return FitWidth(table, optional=("median R²", "R²<0.95", "flags"))


class FitProgress:
    """A progress callback for pipeline.fit_plan drawing tensors, bytes, rate and ETA on stderr."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        from ..settings import progress_bars

        self.console = console
        self.enabled = enabled and progress_bars()  # HF_HUB_DISABLE_PROGRESS_BARS=1 hides it, as huggingface_hub's
        self._progress: Progress | None = None
        self._task = None

    def __call__(self, event: str, payload: Any) -> None:
        if not self.enabled:
            return
        if event == "start":
            # Imported here: rich.progress costs ~10 ms and quiet or piped runs never draw a bar.
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}", style="bold", markup=False),  # the model id, as given
                BarColumn(),
                TextColumn("{task.fields[done]}/{task.fields[tensors]} tensors"),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                payload["model"], total=payload["bytes"], done=0, tensors=payload["tensors"]
            )
            self._done = 0
        elif event == "bytes" and self._progress is not None:  # as chunks land: a smooth rate and ETA
            self._progress.update(self._task, advance=payload)
        elif event == "advance" and self._progress is not None:
            self._done += 1
            self._progress.update(self._task, done=self._done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
