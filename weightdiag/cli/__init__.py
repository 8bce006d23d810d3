"""The `weightdiag` command line: thin Typer commands over weightdiag.api.

Exit codes (weightdiag.errors.ExitCode, the README's table): 0 ok; 1 `check` found a regression; 2 bad input or
usage; 3 Hub/network; 4 `sweep` finished with failed checkpoints; 5 internal error (a bug); 130 interrupted.
Errors print one line on stderr, never a traceback (set WEIGHTDIAG_DEBUG=1 to see one).

The package: app (the Typer app and its commands' registration), one module per command group (fit; models:
compare, check, report, trajectory; diff; sweep; db; env: version and env), options (every option declared
once), takes (the options each command takes, by name: its signature built from them), output (consoles, broken
pipes, the JSON/view sink), notes (what a command says besides its result) and errors (the error line with flags
for the parameters it names, the exit codes, signals).
"""

from .app import app, db_app
from .errors import run
from .options import JsonOption, QuietOption, _db_path
from .output import _console
from .takes import Given

__all__ = ["Given", "JsonOption", "QuietOption", "_console", "_db_path", "app", "db_app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with weightdiag's exit codes and one-line errors (errors.run).

    It runs this package's `app` as found here when called, so a test may replace `weightdiag.cli.app`.
    """
    run(app, argv)
