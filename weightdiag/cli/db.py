"""`weightdiag db`: the database's rows (list, show, export) and the journals of interrupted fits (journals, gc)."""

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import settings
from .output import _emit, _say, _skipped_row, _stderr, _stdout, _Verbatim
from .takes import Given, takes

# Positional arguments (the options are the names in @takes: options.OPTIONS).
RowId = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="A cohort entry or fitted model id as `db list` prints it (ID[@REVISION]), or a row file.",
    ),
]


@takes("db", "fitted_only", "as_json", "quiet")  # -q: warnings about skipped files still print
def db_list(given: Given) -> None:
    """List cohort entries and fitted rows (a file in rows/ that is not a readable row is skipped, with a warning)."""
    from rich.text import Text

    from ..api import list_rows
    from ..render.reports import db_list_view

    records = list_rows(given.db, fitted_only=given.fitted_only, on_skip=_skipped_row)
    # No fitted row in the folder the default rules chose (rows fitted elsewhere "vanish"): say which folder, why.
    folder, why = settings.db_location()
    if (
        given.db is None
        and why != settings.DB_FROM_ENV
        and all(str(r.get("source", "")).startswith("cohort") for r in records)
    ):
        _say(
            f"note: no fitted rows in the database {Path(folder).absolute()} ({why}); fit a model, or pass the "
            "database that holds yours with --db (or WEIGHTDIAG_DB)",
            given.quiet,
        )

    def view() -> Any:
        shown = db_list_view(records, _stdout().width)  # ids whole, never cut or folded: `db show` takes them
        return _Verbatim(shown.plain + "\n") if isinstance(shown, Text) else shown  # Text: a long listing

    _emit(records, view, as_json=given.as_json, quiet=given.quiet)


@takes("db", "as_json", "quiet")  # -q: accepted for uniformity, db show prints no notes
def db_show(row_id: RowId, given: Given) -> None:
    """Show one row: the per-kind table (or the whole row with --json).

    An exact id wins; otherwise an id that differs only in case, when it names one entry (`db show QWEN3-8B`
    names two, qwen3-8b and Qwen3-8B, and is refused with both listed).
    """
    from ..api import show_row
    from ..render.tables import kinds_table

    row = show_row(row_id, given.db, summary=not given.as_json)  # the table needs the per-kind summaries only

    def view() -> list[Any]:
        p = row.get("provenance") or {}
        terms = " ".join(str(p[k]) for k in ("license", "copyright") if p.get(k))
        credit = "; ".join(part for part in (str(p.get("paper") or ""), terms) if part)  # paper; license (c)
        if not credit:
            return [kinds_table(row)]
        from rich.styled import Styled

        # What print(credit, markup=False, style="dim") draws: the highlighted text, all of it dim.
        return [kinds_table(row), Styled(_stdout().render_str(credit, markup=False), "dim")]

    _emit(row, view, as_json=given.as_json, quiet=given.quiet)


@takes("db", "as_json", "quiet")
def db_journals(given: Given) -> None:
    """List the journals of interrupted fits (rows/.partial): model, revision, size, age, host and state."""
    from ..api import list_journals
    from ..render.tables import counted

    found = list_journals(given.db)

    def view() -> Any:
        lines = [
            f"{j.model or '?'}{'@' + j.revision if j.revision else ''}  {_bytes(j.size)}  {_age(j.age)} ago  "
            f"{j.host or '?'}  "
            f"{j.state}{': ' + j.why if j.why else ''}  {j.folder}"
            for j in found
        ]
        return _Verbatim("".join(line + "\n" for line in lines) or "no journals\n")

    _emit([j.to_json() for j in found], view, as_json=given.as_json, quiet=given.quiet)
    stale = [j for j in found if j.state == "stale"]
    if stale:
        _say(f"{counted(len(stale), 'stale journal')}: `weightdiag db gc` removes them", given.quiet)


@takes("db", "every@gc", "dry_run", "as_json", "quiet")
def db_gc(given: Given) -> None:
    """Remove stale journals (rows/.partial), and with --all every one not being fitted; never one whose fit is
    running (a live sweep claim, a live process of this host, or another host's journal written within a day)."""
    from ..api import collect_journals
    from ..render.tables import counted

    removed = collect_journals(given.db, everything=given.every, dry_run=given.dry_run)
    verb = "would remove" if given.dry_run else "removed"

    def view() -> Any:
        lines = [f"{verb} {j.folder} ({_bytes(j.size)}: {j.why or j.state})" for j in removed]
        return _Verbatim("".join(line + "\n" for line in lines))

    _emit([j.to_json() for j in removed], view, as_json=given.as_json, quiet=given.quiet)
    freed = _bytes(sum(j.size for j in removed))
    done = f"would be removed, {freed} freed" if given.dry_run else f"removed, {freed} freed"
    _say(f"{counted(len(removed), 'journal')} {done}", given.quiet)


def _bytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


@takes("fmt", "output", "per_matrix", "db", "fitted_only", "quiet")
def db_export(given: Given) -> None:
    """Export one flat record per row (identity, T/tau, per-kind median k and λ), or per matrix, as CSV, JSONL or
    Parquet."""
    from ..api import export_rows

    text, count = export_rows(
        given.fmt,
        output=given.output,
        db_dir=given.db,
        fitted_only=given.fitted_only,
        on_skip=_skipped_row,
        per_matrix=given.per_matrix,
    )
    if given.output:
        if not given.quiet:
            what = "matrix records" if given.per_matrix else "rows"
            _stderr().print(f"{count} {what} written to {given.output}", markup=False)
    else:
        sys.stdout.write(text)
