"""Where the commands write: the rich consoles on stdout and stderr (their width), a reader of stdout that went
away (a broken pipe), the chatter on stderr (_say, the progress bar), and the one sink of a command's result
(_emit: JSON or a view)."""

import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING, Any

from .. import settings

if TYPE_CHECKING:
    from rich.console import Console

    from ..render.tables import FitProgress


def _flush_stdout() -> None:
    """Flush stdout now (not at interpreter exit, where a closed pipe prints 'Exception ignored')."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()


def _stdout_gone() -> None:
    """Send what is still buffered for stdout nowhere: its reader is gone."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (a test's captured stdout): nothing to do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@cache
def _console(err: bool) -> "Console":
    # Built on first use: rich.console costs ~20 ms at start-up and --json or --version never print with it.
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    # A terminal: its width (or COLUMNS). A file or pipe: COLUMNS if set, else no width at all (rich would
    # wrap at 80), so tables keep their natural width and long lines stay whole; but a pipe read in a
    # terminal (`| head`, `| less`) gets that terminal's width, as its reader sees it (issue 21).
    width = None if stream.isatty() else settings.columns() or _reader_terminal_width(stream) or UNLIMITED_WIDTH
    # emoji=False: paths and model ids are printed as given (`/tmp/p:fire:q` is no emoji code).
    console = Console(stderr=err, width=width, emoji=False)
    if not err:
        console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
    return console


def _broken_pipe() -> None:
    """rich's own Console.on_broken_pipe exits 1, which means "check found a regression": raise instead, and
    _Command ends the command with 0."""
    raise BrokenPipeError


UNLIMITED_WIDTH = 100_000  # wider than any line weightdiag prints: output to a file is never hard-wrapped


def _reader_terminal_width(stream: Any) -> int | None:
    """The width of the terminal a pipe's output is most likely read in: `stream` is a pipe (not a file) and
    stderr is a terminal (`weightdiag db list | head`). None for files, and where no terminal is
    attached (CI, scripts, a job runner): their output keeps its full width."""
    import stat

    try:
        if not stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode):
            return None
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # a captured stream: no descriptor
        return None
    try:
        if sys.stderr is not None and sys.stderr is not stream and sys.stderr.isatty():
            return os.get_terminal_size(sys.stderr.fileno()).columns or None
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass
    return None


def _stderr() -> "Console":
    return _console(True)


def _stdout() -> "Console":
    return _console(False)


def _progress(quiet: bool) -> "FitProgress":
    """The fit progress bar on stderr: not with -q, not when stderr is no terminal (a log file), not when
    HF_HUB_DISABLE_PROGRESS_BARS is set (FitProgress reads it)."""
    from ..render.tables import FitProgress

    return FitProgress(_stderr(), enabled=not quiet and _stderr().is_terminal)


def _node_progress(progress: "FitProgress", wanted: bool, executor: str, quiet: bool) -> Any:
    """The progress callback, with --node-progress a line per task handed back by a cluster node (not with -q)."""
    if not wanted:
        return progress
    from ..execution import choose_executor

    if choose_executor(executor).local:  # nothing runs on a cluster's nodes
        from ..errors import OptionError, param

        progress.close()
        raise OptionError(
            f"{param('node_progress')} shows the nodes of a cluster: give {param('executor')} ray too",
            param="node_progress",
        )
    if quiet:
        return progress
    from ..render.tables import NodeProgress

    return NodeProgress(progress, _stderr())


def _say(text: str, quiet: bool) -> None:
    """One line of chatter on stderr (what was written, what was fitted, fallbacks), unless -q."""
    if not quiet:
        # Once the numpy kernels ran (no C), before the first line: never an error's.
        from ..kernels import fallback_note

        for line in (fallback_note(), text):
            if line is not None:
                _stderr().print(line, markup=False, highlight=False, soft_wrap=True)


def _skipped_row(exc: Any) -> None:
    """A file in rows/ that is not a readable row (records.RowError): one warning line, then go on."""
    _stderr().print(f"warning: {exc.summary}; skipped ({exc.advice})", markup=False, highlight=False, soft_wrap=True)


def _skipped_row_once() -> Callable[[Any], None]:
    """_skipped_row, once per file in a command (a command may scan the database twice)."""
    seen: set[str] = set()

    def note(exc: Any) -> None:
        if exc.summary not in seen:
            seen.add(exc.summary)
            _skipped_row(exc)

    return note


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=1, allow_nan=False) + "\n")


class _Verbatim(str):
    """Text a view has laid out itself: written to stdout as it is (rich would measure and wrap it again)."""


def _emit(
    document: Any, view: Callable[[], Any], *, as_json: bool, quiet: bool, view_beside_json: bool = False
) -> None:
    """A command's result, the one place that chooses how it is shown.

    --json: `document` as JSON on stdout, nothing else there (with `view_beside_json`, as `fit` does, the view
    also goes to stderr for the person watching, unless -q). Otherwise the view on stdout. -q never hides the
    result itself: it silences the chatter on stderr (_say, the progress bar). `view` is called only when it is
    shown; it returns a rich renderable, plain text (printed with markup off), _Verbatim text, or a list of them.
    """
    if as_json:
        _print_json(document)
        if view_beside_json and not quiet:
            _show(view(), _stderr())
        return
    _show(view(), _stdout())


def _emit_each(documents: Iterable[Any], view: Callable[[Any], Any], *, as_json: bool) -> None:
    """_emit of a list whose items are shown as they come (`compare` of a whole database: one row at a time):
    the same output as _emit(list, ...), never the whole list in memory."""
    first = True
    for document in documents:
        if as_json:
            text = json.dumps(document, indent=1, allow_nan=False).replace("\n", "\n ")
            sys.stdout.write(("[\n " if first else ",\n ") + text)
        else:
            _show(view(document), _stdout())
        first = False
    if as_json:
        sys.stdout.write("[]\n" if first else "\n]\n")


def _show(shown: Any, console: "Console") -> None:
    for item in shown if isinstance(shown, list) else [shown]:
        if isinstance(item, _Verbatim):  # past rich, after what it has written so far
            console.file.flush()
            console.file.write(item)
        elif isinstance(item, str):
            console.print(item, markup=False)  # paths and ids are printed as given: `[x]` is no markup
        else:
            console.print(item)
