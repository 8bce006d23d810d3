"""How a command ends badly: the one line on stderr and the exit code of an exception (_error_line), with the
parameters its message names written as flags (FLAGS), SIGTERM and SIGHUP handled like Ctrl-C, and `run`, the
boundary that turns both into weightdiag's exit codes."""

import signal
import sys
import threading
from typing import Any

import typer

from .. import settings
from ..errors import ExitCode, Stopped, WeightdiagError
from .output import _stderr

# The flag of each parameter an error message names with weightdiag.errors.param: the library's name (an api
# function's parameter, a FitOptions or DiffOptions field; `owner.name` where two share a name) on the left,
# the command line's on the right. The one place where the command line maps them (notes.py asks it too).
FLAGS = {
    "against": "--against",
    "base": "BASE",
    "blocks": "--blocks",
    "connections": "--connections",
    "db_dir": "--db",
    "device": "--device",
    "declared": "--declared",
    "download": "--download",
    "energy": "--energy",
    "everything": "--all",
    "exclude": "--exclude",
    "executor": "--executor",
    "export_lora": "--export-lora",
    "fail_above": "--fail-above",
    "fmt": "--format",
    "hist": "--hist",
    "html": "--html",
    "include": "--include",
    "jobs": "--jobs",
    "lr": "--lr",
    "min_lr_ratio": "--min-lr-ratio",
    "model_id": "--name",
    "node_progress": "--node-progress",
    "output": "--output",
    "parents": "--parent",
    "plot": "--plot",
    "preset": "--preset",
    "protocol": "--protocol",
    "ray_address": "--ray-address",
    "rank": "--rank",
    "revision": "--revision",
    "revisions": "--revisions",
    "schedule": "--schedule",
    "sketch": "--sketch",
    "steps": "--train-steps",  # FitOptions.steps, the training steps done (for T/tau)
    "sweep.steps": "--steps",  # sweep's checkpoint picker
    "tol_k": "--tol-k",
    "tol_lambda": "--tol-lambda",
    "total": "--total",
    "trim": "--trim",
    "warmup": "--warmup",
    "weight_decay": "--weight-decay",
}


def flag(name: str) -> str:
    """The command line's name for parameter `name` (FLAGS: tests/test_errors.py checks that every parameter an
    error names is there; a name missing from it is still written as a flag)."""
    return FLAGS.get(name) or "--" + name.rsplit(".", 1)[-1].replace("_", "-")


def _error_line(exc: Exception) -> tuple[str, int]:
    """The one line on stderr for an exception that ends the command, and its exit code.

    The only place where errors are formatted for the terminal. A WeightdiagError's class names the cause
    and fixes the exit code (weightdiag.errors: BadInputError and its subclasses 2, HubError and its
    subclasses 3); its message says what is wrong and what to do; its fields (repo, revision, file, status,
    ...) are for programs (`exc.fields`), the line shows the message alone, its parameters named by their flags.
    """
    if isinstance(exc, WeightdiagError):
        message = " ".join(exc.render(flag).split()) or type(exc).__name__  # one line, whatever a subclass did
        return f"error: {message}", ExitCode(exc.exit_code)
    if isinstance(exc, PermissionError):  # a file or folder the user may not read or write: their input
        where = exc.filename or "a file"
        return (
            f"error: {where}: permission denied; make it readable (or the folder writable) or choose another path",
            ExitCode.BAD_INPUT,
        )
    return (  # a bug: say so in one line, keep the traceback for WEIGHTDIAG_DEBUG
        f"internal error: {type(exc).__name__}: {exc} (set WEIGHTDIAG_DEBUG=1 for a traceback and please report it)",
        ExitCode.INTERNAL,
    )


def run(app: typer.Typer, argv: list[str] | None = None) -> None:
    """Run `app` with weightdiag's exit codes and one-line errors (weightdiag.cli.main runs the command line's).

    Typer handles usage errors itself (exit 2, with the usage line); everything weightdiag raises
    on purpose becomes one line on stderr with its documented exit code.
    """
    previous = _stop_on_signals()
    try:
        app(args=argv, prog_name="weightdiag")
    except KeyboardInterrupt as stop:
        _stderr().print(f"stopped by {stop.name}" if isinstance(stop, Stopped) else "interrupted")
        sys.exit(_interrupt_code(stop))
    except Exception as exc:
        if settings.debug():
            raise
        line, code = _error_line(exc)
        _stderr().print(line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(code)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_STOP_SIGNALS = {"SIGTERM": ExitCode.TERMINATED, "SIGHUP": ExitCode.HANGUP}


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM and SIGHUP raise Stopped in the main thread, which unwinds like Ctrl-C (sweep workers are
    ended, nothing is written after it). Only from the main thread, where Python can install handlers."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for name in _STOP_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None:  # SIGHUP does not exist on Windows
            continue

        def stop(received: int, _frame: Any, name: str = name) -> None:
            raise Stopped(received, name)

        previous[signum] = signal.signal(signum, stop)
    return previous


def _interrupt_code(stop: KeyboardInterrupt) -> ExitCode:
    return _STOP_SIGNALS[stop.name] if isinstance(stop, Stopped) else ExitCode.INTERRUPTED
