"""conftest.run_cli, the suite's way to run the command line: in process it answers as a real process would
(exit codes, stdout, stderr, warnings, tracebacks) and leaves nothing behind for the next run."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from weightdiag import cli, kernels
from weightdiag.errors import ExitCode

from .conftest import run_cli, write_safetensors

pytestmark = pytest.mark.e2e


def _tiny(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = {
        f"model.layers.0.mlp.{name}.weight": ("F32", rng.standard_normal((64, 64)).astype(np.float32))
        for name in ("up_proj", "down_proj")
    }
    return write_safetensors(folder / "model.safetensors", tensors)


def _process_state() -> dict:
    return {
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "streams": (sys.stdout, sys.stderr, sys.argv),
        "consoles": cli._console.cache_info().currsize,
        "thread budget": getattr(kernels._budget, "threads", None),
        "warning filters": list(warnings.filters),
        "showwarning": warnings.showwarning,
        "log streams": [
            (h, getattr(h, "stream", None))
            for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
            if isinstance(logger, logging.Logger)
            for h in logger.handlers
        ],
    }


def test_in_process_runs_leave_no_state_behind(tmp_path):
    model = _tiny(tmp_path / "model")
    before = _process_state()
    env = {"WEIGHTDIAG_THREADS": "3", "COLUMNS": "80", "WEIGHTDIAG_DB": str(tmp_path / "db")}
    fitted = run_cli("fit", str(model), "-q", env=env, cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    listed = run_cli("db", "list", "--fitted", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "model" in listed.stdout
    failed = run_cli("fit", str(tmp_path / "missing"), env=env, cwd=tmp_path)
    assert failed.returncode == ExitCode.BAD_INPUT
    assert _process_state() == before


def test_the_environment_and_folder_hold_for_the_call_only(tmp_path, monkeypatch):
    monkeypatch.delenv("WEIGHTDIAG_DB", raising=False)
    run_cli("fit", str(_tiny(tmp_path / "model")), "-q", env={"WEIGHTDIAG_DB": str(tmp_path / "envdb")}, cwd=tmp_path)
    assert list((tmp_path / "envdb" / "rows").glob("*.json"))
    assert "WEIGHTDIAG_DB" not in os.environ
    (tmp_path / "DATABASE").mkdir()
    run_cli("fit", str(tmp_path / "model"), "-q", cwd=tmp_path)  # no --db, no WEIGHTDIAG_DB: ./DATABASE of cwd
    assert list((tmp_path / "DATABASE" / "rows").glob("*.json"))
    assert Path.cwd() != tmp_path


@pytest.mark.parametrize(
    "args",
    [
        ("db", "list", "--db", "{tmp}"),
        ("fit", "{tmp}/missing"),
        ("fit", "--trim", "mid70", "{tmp}"),
        ("compare", "pythia-70m", "--db", "{tmp}"),
        ("nonsense",),  # a usage error: click's own message and exit 2
        ("fit", "-h"),
    ],
)
def test_in_process_and_real_runs_agree(tmp_path, args):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    inside, real = run_cli(*argv), run_cli(*argv, real=True)
    assert inside.returncode == real.returncode
    assert inside.stdout == real.stdout
    assert inside.stderr == real.stderr


def test_an_uncaught_exception_is_a_traceback_and_exit_1(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(cli, "app", broken)
    out = run_cli("version", env={"WEIGHTDIAG_DEBUG": "1"})  # debug: main re-raises, the interpreter prints it
    assert out.returncode == 1
    assert "Traceback" in out.stderr
    assert "ValueError: a bug" in out.stderr
    out = run_cli("version")
    assert out.returncode == ExitCode.INTERNAL
    assert out.stderr.startswith("internal error: ValueError: a bug")


def test_warnings_reach_stderr_and_runtime_warnings_are_errors(monkeypatch):
    def warns(*args, **kwargs):
        warnings.warn("careful", UserWarning, stacklevel=1)
        raise SystemExit(0)

    monkeypatch.setattr(cli, "app", warns)
    out = run_cli("version")
    assert out.returncode == 0
    assert "UserWarning: careful" in out.stderr
    out = run_cli("version")  # shown again: each run starts with a fresh warnings registry, as a process does
    assert "UserWarning: careful" in out.stderr

    def overflows(*args, **kwargs):
        warnings.warn("overflow", RuntimeWarning, stacklevel=1)
        raise SystemExit(0)

    monkeypatch.setattr(cli, "app", overflows)
    out = run_cli("version")  # -W error::RuntimeWarning, as run_cli(real=True) starts the interpreter
    assert out.returncode == ExitCode.INTERNAL
    assert "RuntimeWarning: overflow" in out.stderr
