"""The two set-up scripts and the README that names them (issue 12: a newcomer's first minute).

Static checks: running scripts/demo takes a minute and installs packages, so CI runs scripts/test
(which sources the same setup-venv.sh) and the demo is run by hand before a release.
"""

from __future__ import annotations

import re
from pathlib import Path

from .docs_text import user_docs

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_installs_only_what_the_tool_needs():
    demo = (ROOT / "scripts" / "demo").read_text()
    setup = (ROOT / "scripts" / "setup-venv.sh").read_text()
    assert re.search(r"^WEIGHTDIAG_EXTRAS=plot$", demo, re.M)  # not the test extra (pytest, Ray, ruff)
    assert '"torch==2.13.0"' in setup  # the CPU build from local disk, never an unpinned CUDA download
    assert 'pip_install -e ".[$extras]"' in setup
    plot = re.search(r"^plot = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert plot is not None
    assert [re.split(r"[<>=!~ ]", spec.strip(' "'))[0] for spec in plot.group(1).split(",")] == ["matplotlib"]


def test_the_scripts_say_what_they_do_and_what_to_try_next():
    demo = (ROOT / "scripts" / "demo").read_text()
    setup = (ROOT / "scripts" / "setup-venv.sh").read_text()
    assert setup.count('say "') >= 4  # venv, torch, weightdiag, weights: each step announced
    assert "Try next (from any folder):" in demo
    assert '. "$ROOT/.venv/bin/activate"' in demo


def test_the_demo_try_next_lines_work_from_any_folder():
    """Issue 21: the lines the demo suggests name absolute paths (the repository's .venv, the database, the row)."""
    demo = (ROOT / "scripts" / "demo").read_text()
    assert re.search(r"^ROOT=\$PWD$", demo, re.M)  # after setup-venv.sh moved to the repository
    assert "else DB=$ROOT/DATABASE; fi" in demo and 'realpath -m -- "$WEIGHTDIAG_DB"' in demo
    assert re.search(r'^ROW=\$\(ls -t "\$DB"/rows/', demo, re.M)  # under the absolute $DB: absolute too
    nxt = demo.split("<<NEXT", 1)[1].split("\nNEXT", 1)[0]
    commands = [line.strip() for line in nxt.splitlines() if line.startswith("     ")]
    assert len(commands) >= 3
    for command in commands:
        words = command.split("#", 1)[0].split()
        paths = [w for w in words if "/" in w or w.startswith(('"$', "$"))]
        assert all(w.strip('"').startswith(("$ROOT", "$DB", "$ROW")) for w in paths), command


def test_the_readme_gives_two_set_up_commands_and_how_to_run_the_tool():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    first_block = setup.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["scripts/demo", "scripts/test"]
    assert ". .venv/bin/activate" in setup
    assert ".venv/bin/weightdiag" in setup
    assert "pip install weightdiag" not in readme  # not on PyPI: installs are from the repository


def test_ci_runs_the_cli_tests_on_the_lowest_declared_versions():
    """scripts/test ends with scripts/test-floor: every dependency at the floor pyproject.toml declares (torch
    at the local 2.13.0 build), in its own .venv-floor, running the command-line tests."""
    test = (ROOT / "scripts" / "test").read_text()
    floor = (ROOT / "scripts" / "test-floor").read_text()
    assert test.rstrip().endswith("bash scripts/test-floor")
    assert 'pins.append("torch==2.13.0")' in floor and ".venv-floor" in floor
    assert "tests/test_cli.py tests/test_cli_surface.py" in floor
    assert ".venv-floor/" in (ROOT / ".gitignore").read_text().splitlines()


def test_ci_runs_the_suite_without_its_slow_tests_then_them_and_the_kernel_tests_on_both_kernels():
    """Issue 28: scripts/test (the README's command) leaves the slow tests out, so it stays under 10 minutes of CPU
    on 2 cores; .ci/run runs it, then scripts/test-slow. Both run the `kernels` tests again on the numpy kernels,
    and require the C kernels otherwise."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line.startswith("bash ")] == [
        "bash scripts/demo",  # issue 33: the README's order, so that the suite meets the demo's row
        "bash scripts/test",
        "bash scripts/test-slow",
    ]
    test = (ROOT / "scripts" / "test").read_text()
    slow = (ROOT / "scripts" / "test-slow").read_text()
    assert 'marks=(-m "not slow")' in test and 'python -m pytest -q ${marks[@]+"${marks[@]}"} "$@"' in test
    assert 'WEIGHTDIAG_KERNELS=numpy python -m pytest -q -m "kernels and not slow"' in test
    assert 'python -m pytest -q -m slow "$@"' in slow
    assert 'WEIGHTDIAG_KERNELS=numpy python -m pytest -q -m "kernels and slow"' in slow
    for script in (test, slow):
        assert "export WEIGHTDIAG_REQUIRE_C_KERNELS=1" in script


def test_every_install_the_readme_names_exists():
    """Issue 33 (acceptance: the install sections checked as the rest are): every `pip install '.[EXTRA]'` names an
    extra pyproject.toml declares, each extra says what it brings as its README line does, and the one install
    outside the package (the diff pair's transformers) is the version scripts/test installs and the script asks for."""
    import tomllib

    readme = user_docs()  # the README and the docs pages its sections moved to
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    named = re.findall(r"pip install '\.\[([\w,-]+)\]'", readme)
    assert {"plot", "ray"} <= set(named)
    for extra in named:
        assert extra in extras, f"README installs .[{extra}], which pyproject.toml does not declare"
    brings = {"plot": "matplotlib", "ray": "ray"}
    for extra, package in brings.items():
        assert any(spec.lower().startswith(package) for spec in extras[extra]), extra
    others = set(re.findall(r"pip install '([^.][^']*)'", readme))
    assert others == {"transformers==5.24.0"}, others
    setup = (ROOT / "scripts" / "setup-venv.sh").read_text()
    script = (ROOT / "scripts" / "make_diff_pair.py").read_text()
    assert '"transformers==5.24.0"' in setup and 'TRANSFORMERS = "transformers==5.24.0"' in script
