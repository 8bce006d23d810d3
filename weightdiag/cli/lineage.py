"""`weightdiag lineage`: whether a model's weights derive from other models' (docs/lineage.md)."""

from typing import Annotated

import typer

from .output import _emit, _progress
from .takes import Given, takes

LineageCandidate = Annotated[
    str,
    typer.Argument(
        metavar="CANDIDATE",
        help="The model judged: a row id (`db list`), a row file, a model folder or file, or a Hub id ORG/NAME[@REV].",
    ),
]


@takes("against", "declared", "db", "device", "token", "cache_dir", "connections", "save@lineage", "as_json", "quiet")
def lineage(candidate: LineageCandidate, *, given: Given) -> None:
    """Whether CANDIDATE's weights derive from each reference's (--against, repeatable; default: every row of the
    database): derived, independent or inconclusive, with a p-value against independent initialisations, the
    matrices carrying the evidence and the relation (docs/lineage.md)."""
    from ..api import lineage as lineage_api
    from ..render.lineage_view import lineage_view

    progress = _progress(given.quiet)
    try:
        report = lineage_api(
            candidate,
            given.against or (),
            db_dir=given.db,
            options=given.fit_options(),
            progress=progress,
            token=given.token,
            save=given.save,
            declared=given.declared,
        )
    finally:
        progress.close()
    _emit(report.to_json(), lambda: lineage_view(report), as_json=given.as_json, quiet=given.quiet)
