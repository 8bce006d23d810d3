"""`weightdiag diff`: what changed from a base to a tuned model, and the CI gate on it."""

from typing import Annotated

import typer

from ..errors import ExitCode
from .options import (
    AllMatricesAliasOption,
    AllMatricesOption,
    BlocksOption,
    ConnectionsOption,
    DbOption,
    DiffDeviceOption,
    DiffExecutorOption,
    DiffHtmlOption,
    DiffSaveOption,
    DiffSpectrumOption,
    ExcludeOption,
    FailAboveOption,
    IncludeOption,
    JsonOption,
    NodeProgressOption,
    PlotOption,
    QuietOption,
    RayAddressOption,
    SketchOption,
    TokenOption,
)
from .output import _emit, _node_progress, _progress, _say, _Verbatim


def diff(
    first: Annotated[
        str,
        typer.Argument(
            metavar="BASE",
            help="The base model (file, folder or Hub id ORG/NAME[@REV]); given alone: the tuned model, diffed "
            "against the base_model its model card names.",
        ),
    ],
    second: Annotated[
        str | None,
        typer.Argument(metavar="TUNED", help="The tuned model (file, folder or Hub id).", show_default=False),
    ] = None,
    include: IncludeOption = None,
    exclude: ExcludeOption = None,
    fail_above: FailAboveOption = None,
    blocks: BlocksOption = None,
    sketch: SketchOption = 128,
    spectrum: DiffSpectrumOption = True,
    db: DbOption = None,
    device: DiffDeviceOption = "auto",
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    executor: DiffExecutorOption = "local",
    ray_address: RayAddressOption = None,
    node_progress: NodeProgressOption = False,
    save: DiffSaveOption = True,
    all_matrices: AllMatricesOption = False,
    all_matrices_alias: AllMatricesAliasOption = False,
    plot: PlotOption = None,
    html: DiffHtmlOption = None,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """What changed from BASE to TUNED, matrix by matrix: exact figures, rank90, findings; a CI gate."""
    from ..api import diff as diff_api
    from ..delta.gate import gate, parse_blocks
    from ..delta.result import DiffOptions
    from ..render.diff_view import diff_view, gate_line

    base, tuned = (first, second) if second is not None else (None, first)
    chosen_blocks = parse_blocks(blocks)
    if blocks is not None and fail_above is None:
        from ..errors import OptionError, param

        raise OptionError(
            f"{param('blocks')} selects what {param('fail_above')} gates; give {param('fail_above')} too",
            param="blocks",
        )
    options = DiffOptions(
        device=device,
        include=include or (),
        exclude=exclude or (),
        sketch=sketch,
        spectrum=spectrum,
        connections=connections,
        token=token,
        executor=executor,
        ray_address=ray_address,
    )
    progress = _node_progress(_progress(quiet), node_progress, executor, quiet)
    try:
        result = diff_api(base, tuned, options, db_dir=db, save=save, plot_dir=plot, html_file=html, progress=progress)
    finally:
        progress.close()
    verdict = gate(result, fail_above, blocks=chosen_blocks) if fail_above is not None else None
    document = result.to_json()
    if verdict is not None:
        document["gate"] = verdict.to_json()
    every = all_matrices or all_matrices_alias
    if verdict is not None and quiet:  # a CI gate's result is its verdict: -q prints that line alone (issue 33)
        _emit(document, lambda: _Verbatim(gate_line(verdict) + "\n"), as_json=as_json, quiet=quiet)  # never folded
    else:
        _emit(document, lambda: diff_view(result, every, verdict), as_json=as_json, quiet=quiet)
    if save and not as_json and result.run.get("saved"):
        _say(f"diff row written to {result.run['saved']}", quiet)
    if plot is not None:
        _say(f"{len(result.run.get('plots') or [])} plots written to {plot}", quiet)
    if html is not None:
        _say(f"HTML page written to {html}", quiet)
    raise typer.Exit(ExitCode.OK if verdict is None or verdict.passed else ExitCode.REGRESSION)
