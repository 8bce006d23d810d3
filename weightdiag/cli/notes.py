"""What the commands that read a model say about it on stderr besides their result (unless -q): that it was
read another way than asked (a fallback), what its numbers are of (quantized, dequantized), which T/τ inputs
are missing, and that it was fitted on the way."""

from typing import TYPE_CHECKING

from .errors import flag
from .output import _say

if TYPE_CHECKING:
    from ..api import RowNote
    from ..record.schema import Row

# Notes a source adds to the row when it had to fall back (weightdiag.source.hub._from_cache_only).
FALLBACK_NOTES = ("read from the local HF cache",)


def _say_fallbacks(row: "Row", quiet: bool) -> None:
    """Say on the terminal when the row was read some other way than asked (the Hub was unreachable ...)."""
    for note in row.get("notes") or ():
        if isinstance(note, str) and note.startswith(FALLBACK_NOTES):
            _say(f"note: {row['model']['id']}: {note}", quiet)
    from ..diagnose.quantized import dequantized_line, grid_line

    for line in (dequantized_line(row), grid_line(row)):
        if line:  # a quantized checkpoint, or floats that hold dequantized values: say what the numbers are of
            _say(f"note: {row['model']['id']}: {line}", quiet)
    hp = row.get("hyperparameters") or {}
    missing = [flag(key) for key in _TAU_INPUTS if hp.get(key) is None]
    if missing and len(missing) < len(_TAU_INPUTS) and hp.get("t_over_tau") is None:  # some given, not all
        _say(
            f"note: T/τ (the lambda axis) needs the learning rate, weight decay and steps: give {', '.join(missing)} "
            f"too (or {flag('preset')} NAME)",
            quiet,
        )


_TAU_INPUTS = ("lr", "weight_decay", "steps")  # the row's hyperparameters, named as FitOptions names them


def _row_note(quiet: bool, save: bool = True) -> "RowNote":
    """What to say on stderr once a model's row is at hand: its fallbacks, and that it was fitted."""

    def note(spec: str, row: "Row", how: str) -> None:
        _say_fallbacks(row, quiet)
        if how == "fitted":
            _say(f"{spec}: fitted" + (" and saved" if save else ""), quiet)
        elif how.startswith("database (the Hub is unreachable)"):
            revision = row["model"].get("revision")
            _say(f"{spec}: the Hub is unreachable; its row of {revision} in the database is used", quiet)

    return note
