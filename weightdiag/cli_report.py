"""The `weightdiag report` command (registered on the main Typer app by cli.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the report command to `app` (filled in by the health-report work)."""
