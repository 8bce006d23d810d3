"""Issue 38, acceptance 1, as a user meets it: a fresh virtualenv, `pip install '<checkout>[pandas]'`, then in that
venv (never this checkout's sources) the README's library example on MiniLM and `mypy --strict` on a user script.

About 1.5 to 2 minutes on the CI machine (benchmarks/RESULTS.md): most of it pip building the C kernels and
fetching pandas and pyarrow, so it is marked slow (scripts/test-slow)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from .docs_text import fenced_blocks
from .docs_text import section as docs_section
from .test_library import USER_SCRIPT

ROOT = Path(__file__).resolve().parents[1]

# A script that is wrong only if mypy reads weightdiag's types (py.typed): a Plan is not a str.
WRONG_SCRIPT = 'import weightdiag as wd\n\nplan: str = wd.plan("ORG/NAME")\n'


def _run(command: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)


def _library_example(minilm: Path) -> tuple[str, list[str]]:
    """The README's library example with MiniLM for "path/to/model", then its WeightWatcher-style lines run on a
    fit --spectrum row of MiniLM; and the output the README shows for the first part."""
    section = docs_section("Python API")
    first, frames = ("\n".join(block) for block in fenced_blocks(section, "python")[:2])
    shown = fenced_blocks(section)[0]
    assert '"path/to/model"' in first and "import weightdiag as wd" in first
    wanted = [line for line in frames.splitlines() if line.startswith(("frame = ", "details = "))]
    assert len(wanted) == 2 and "frame.alpha > 6" in wanted[1]
    code = first.replace('"path/to/model"', repr(str(minilm)))
    code += "\nimport sys\nprint(wd.__file__)\n"
    code += f"row = wd.fit({str(minilm)!r}, wd.FitOptions(spectrum=True, device='cpu'), save=False).row\n"
    code += "\n".join(wanted) + "\n"
    code += "print(len(frame), frame.alpha.notna().sum(), sorted(details.name))\n"
    return code, shown


@pytest.mark.slow
@pytest.mark.e2e
def test_a_fresh_virtualenv_runs_the_readme_example_and_passes_mypy_strict(minilm_dir, tmp_path):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "pandas" in extras  # the extra the README names: pip install '.[pandas]'
    # the environment of a user's shell: no PYTHONPATH to this checkout, no database of the suite's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "WEIGHTDIAG_", "VIRTUAL_ENV"))}
    env["WEIGHTDIAG_DB"] = str(tmp_path / "db")
    started = time.monotonic()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # torch is no dependency of weightdiag or of [pandas]; pinned all the same, as scripts/setup-venv.sh does, so
    # that an extra which came to pull it could never fetch a CUDA build of several GB
    pins = tmp_path / "pins.txt"
    pins.write_text("torch==2.13.0\n")
    pip = [python, "-m", "pip", "install", "--quiet", "--progress-bar", "off", "-c", str(pins), f"{ROOT}[pandas]"]
    done = _run(pip, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = time.monotonic()
    site = Path(
        _run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path, env=env
        ).stdout.strip()
    )
    assert (site / "weightdiag" / "py.typed").is_file()

    code, shown = _library_example(minilm_dir)
    (tmp_path / "example.py").write_text(code)
    done = _run([python, "example.py"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[: len(shown)] == shown  # what the README shows it prints
    saved, module, summary = Path(lines[len(shown)]), Path(lines[-2]), lines[-1]
    assert saved.is_file() and saved.parent == tmp_path / "db" / "rows"
    assert module.is_relative_to(site)  # the installed copy, not the checkout
    # every matrix of MiniLM has its spectrum; alpha > 6 selects some of them (the README's filter, as written)
    count, with_alpha, heavy = summary.split(" ", 2)
    assert count == with_alpha == "40" and heavy.startswith("['encoder.layer.")
    example = time.monotonic()

    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "wrong.py").write_text(WRONG_SCRIPT)
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", python]
    done = _run([*mypy, "user.py", "wrong.py"], cwd=tmp_path, env=env)
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    # user.py is clean; wrong.py's one error shows that mypy read the installed package's types
    assert len(errors) == 1 and errors[0].startswith("wrong.py:3: error: "), done.stdout + done.stderr
    assert 'expression has type "Plan", variable has type "str"' in errors[0]
    print(
        f"fresh venv: install {installed - started:.0f} s, README example {example - installed:.0f} s, "
        f"mypy --strict {time.monotonic() - example:.0f} s"
    )
