"""The `weightdiag` console script and `python -m weightdiag`.

`weightdiag --version` is answered here, before typer, rich and numpy are imported (they cost
~0.3 s); every other command line goes to weightdiag.cli.main.
"""

from __future__ import annotations

import sys

from . import __version__

VERSION_FLAGS = ("--version", "-V")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # Same outcome as the eager --version option on the Typer app (cli/options.py): an eager option
    # given first is handled before anything after it is parsed.
    if args and args[0] in VERSION_FLAGS:
        sys.stdout.write(f"weightdiag {__version__}\n")
        return
    from .cli import main as cli_main

    cli_main(argv)


if __name__ == "__main__":
    main()
