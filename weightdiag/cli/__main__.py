"""`python -m weightdiag.cli`, as `python -m weightdiag` (which answers --version before importing typer)."""

from . import main

main()
