"""The docs' option tables are generated from the typer app (weightdiag/cli/option_table.py) and cannot drift:
each one equals what the app gives today (issue 38). After changing an option: `python -m
weightdiag.cli.option_table --write docs/*.md`."""

from __future__ import annotations

import re

import typer.main

from weightdiag.cli import app
from weightdiag.cli.option_table import generated_tables, option_table, rewrite

from .docs_text import doc_pages


def test_every_generated_option_table_in_the_docs_is_the_apps():
    found = {}
    for page in doc_pages():
        for command, table in generated_tables(page.read_text()):
            found[command] = page.name
            assert table == option_table(command), (
                f"{page.name}: the options of `{command}` changed; run python -m weightdiag.cli.option_table "
                "--write docs/*.md"
            )
    assert found.get("fit") == "usage.md", found


def test_the_generated_table_lists_every_option_and_its_help():
    command = typer.main.get_command(app).commands["fit"]
    table = option_table("fit")
    listed = set(re.findall(r"(?<![\w-])(-{1,2}[a-z][a-z0-9-]*)", " ".join(re.findall(r"^\| `([^`]*)`", table, re.M))))
    options = {name for p in command.params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}
    assert listed == options
    assert "| `--spectrum` | Also take each matrix's spectrum" in table


def test_a_stale_table_is_rewritten():
    page = (doc_pages()[0].parent / "docs" / "usage.md").read_text()
    stale = page.replace("| `--plan` |", "| `--dry-run` |", 1)
    assert stale != page
    (command, table), *_ = generated_tables(stale)
    assert command == "fit" and table != option_table("fit")
    assert rewrite(stale) == page
