"""Rich renderings of rows: the per-kind summary table and the fit progress bar."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


def fmt(value: Any, spec: str = ".4f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def kinds_table(row: dict[str, Any], title: str | None = None) -> Table:
    model = row["model"]
    arch = row.get("architecture", {})
    if model["source"] == "cohort":
        contents = f"{model['cohort']} summary: per-kind medians only"
    else:
        contents = f"{len(row['matrices'])} matrices, {len(row['vectors'])} vectors, {len(row['skipped'])} skipped"
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
        table.add_column(col, justify=justify)
    for kind, s in row["kinds"].items():
        table.add_row(
            kind,
            s["class"],
            str(s["count"]),
            fmt(s["k_median"]),
            fmt(s["lambda_median"], ".5g"),
            fmt(s["r2_median"]),
            s["r2_below_95"],
            s["k_class"] or "-",
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
            s["k_class"] or "-",
            ", ".join(s["flags"]),
        )
    if arch.get("attention"):
        table.caption += f"; attention {arch['attention']}"
    return table


class FitProgress:
    """A progress callback for pipeline.fit_plan drawing tensors, bytes, rate and ETA on stderr."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
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
