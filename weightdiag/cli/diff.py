"""`weightdiag diff`: what changed from a base to a tuned model, and the CI gate on it."""

from typing import Annotated

import typer

from ..errors import ExitCode
from .output import _emit, _node_progress, _progress, _say, _Verbatim
from .takes import Given, takes

# Positional arguments (the options are the names in @takes: options.OPTIONS).
DiffBase = Annotated[
    str,
    typer.Argument(
        metavar="BASE",
        help="The base model (file, folder or Hub id ORG/NAME[@REV]); given alone: the tuned model, diffed "
        "against the base_model its model card names.",
    ),
]
DiffTuned = Annotated[
    str | None,
    typer.Argument(metavar="TUNED", help="The tuned model (file, folder or Hub id).", show_default=False),
]


@takes(
    "include", "exclude", "fail_above", "blocks", "sketch", "spectrum@diff", "db", "device@diff", "revision@diff",
    "token", "cache_dir", "connections", "executor@diff", "ray_address", "node_progress", "save@diff", "all_matrices",
    "all_matrices_alias", "plot", "html@diff", "export_lora", "rank", "energy", "parent", "as_json", "quiet",
)  # fmt: skip
def diff(first: DiffBase, second: DiffTuned = None, *, given: Given) -> None:
    """What changed from BASE to TUNED, matrix by matrix: exact figures, rank90, findings, the mechanism; a CI gate."""
    from ..api import diff as diff_api
    from ..delta.gate import gate, parse_blocks
    from ..delta.result import DiffOptions
    from ..render.diff_view import diff_view, gate_line

    base, tuned = (first, second) if second is not None else (None, first)
    chosen_blocks = parse_blocks(given.blocks)
    if given.blocks is not None and given.fail_above is None:
        from ..errors import OptionError, param

        raise OptionError(
            f"{param('blocks')} selects what {param('fail_above')} gates; give {param('fail_above')} too",
            param="blocks",
        )
    options = DiffOptions(
        include=given.include or (),
        exclude=given.exclude or (),
        parents=given.parent or (),
        **given.named("device", "sketch", "spectrum", "connections", "token", "executor", "ray_address"),
    )
    progress = _node_progress(_progress(given.quiet), given.node_progress, given.executor, given.quiet)
    try:
        result = diff_api(
            base,
            tuned,
            options,
            db_dir=given.db,
            save=given.save,
            plot=given.plot,
            html=given.html,
            progress=progress,
            revision=given.revision,
            export_lora=given.export_lora,
            lora_rank=given.rank,
            lora_energy=given.energy,
        )
    finally:
        progress.close()
    verdict = gate(result, given.fail_above, blocks=chosen_blocks) if given.fail_above is not None else None
    document = result.to_json()
    if verdict is not None:
        document["gate"] = verdict.to_json()
    every = given.all_matrices or given.all_matrices_alias
    if verdict is not None and given.quiet:  # a CI gate's result is its verdict: -q prints that line alone (issue 33)
        _emit(
            document, lambda: _Verbatim(gate_line(verdict) + "\n"), as_json=given.as_json, quiet=given.quiet
        )  # never folded
    else:
        _emit(document, lambda: diff_view(result, every, verdict), as_json=given.as_json, quiet=given.quiet)
    if given.save and not given.as_json and result.run.get("saved"):
        _say(f"diff row written to {result.run['saved']}", given.quiet)
    if given.plot is not None:
        _say(f"{len(result.run.get('plots') or [])} plots written to {given.plot}", given.quiet)
    if given.html is not None:
        _say(f"HTML page written to {given.html}", given.quiet)
    if result.export_lora is not None and not given.as_json:
        lora = result.export_lora
        _say(
            f"LoRA adapter written to {lora['folder']}: {len(lora['modules'])} modules, rank up to {lora['max_rank']}, "
            f"largest relative error {lora['max_relative_error']:.3g}",
            given.quiet,
        )
    raise typer.Exit(ExitCode.OK if verdict is None or verdict.passed else ExitCode.REGRESSION)
