"""The errors weightdiag raises on purpose, each tied to a documented exit code.

The exit codes let CI tell a finding from a crash (the convention of pytest: 1 is a finding, higher codes
are trouble). Anything that escapes without being a WeightdiagError is a bug: exit 5 (internal error).
Every message is one line: what is wrong, then what to do about it.

The classes name the cause and carry its fields (exit code in brackets):

    WeightdiagError [5]
      BadInputError [2]
        OptionError(param)  ModelPathError(path)  CheckpointFormatError(file)  OutputError(path)
        DatabaseError(folder)  MissingDependencyError(package)  RowUseError(model_id)
        records.RowError(file, field)  db.RowNotFoundError(spec)  db.AmbiguousRowError(spec, candidates)
      HubError(repo, revision, file, status) [3]
        RepoNotFoundError  RevisionNotFoundError  GatedRepoError  HubUnreachableError(+endpoint)
        NotCachedError  HubResponseError  TransferError  VerificationError(+expected, got)

Parameters in messages. A library caller reads the name of the parameter it passed (`protocol`), a user of
the command line the flag they typed (`--protocol`); one message serves both. The raise site names each
parameter with param(): `OptionError(f"{param('protocol')} {x!r}: choose one of ...", param="protocol")`.
param() marks the name with NUL characters (never in a path, a Hub id, a command-line argument or an
environment variable); `str(exc)` and `exc.message` show the parameter's name (`protocol 'x': choose ...`),
and weightdiag.cli.errors renders the same message with `exc.render(flag)`, each name looked up in its one
table of flags (`--protocol 'x': choose ...`). A name is a parameter of the library (an api function's, a
FitOptions field); where two parameters share one, the key names its owner as well (`sweep.steps`, sweep's
checkpoint picker, beside FitOptions' `steps`), and the library shows the part after the dot. Environment
variables (`WEIGHTDIAG_THREADS=...`) are written as they are: both readers set them by that name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from enum import IntEnum
from os import PathLike
from typing import Any, ClassVar


class ExitCode(IntEnum):
    """weightdiag's exit codes (the README's table lists them; tests/test_cli_surface.py runs each)."""

    OK = 0
    REGRESSION = 1  # `check` ran and found matrices that moved beyond the tolerance (a finding, not an error)
    BAD_INPUT = 2  # the user's input (path, file, option, environment variable) is wrong; also typer's usage errors
    HUB = 3  # Hugging Face Hub / network trouble, or bytes that fail their sha256
    PARTIAL = 4  # `sweep` finished, but some checkpoints failed (the others' rows are written)
    INTERNAL = 5  # a bug: please report it (WEIGHTDIAG_DEBUG=1 shows the traceback)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)
    HANGUP = 129  # SIGHUP (a closed terminal, an ssh drop): handled like Ctrl-C
    TERMINATED = 143  # SIGTERM (`kill PID`, a job runner, Popen.terminate()): handled like Ctrl-C


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the signal lands so that it unwinds like Ctrl-C: workers ended,
    nothing written after it, one line, exit 128 + the signal's number."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name


def note_kept(stop: BaseException, what: str) -> None:
    """Say on an interruption (KeyboardInterrupt, Stopped) what of the job survives it for a rerun, in words the
    command line prints after "interrupted: " (`run the command again to resume: 12 tensors measured are kept`, or
    why nothing is). The job that knows sets it where the interruption passes through (the fit, the sweep); the
    innermost word stands unless an outer job knows more. Without one, nothing is promised (issue 42)."""
    stop.weightdiag_kept = what  # type: ignore[attr-defined]


def kept_after(stop: BaseException) -> str | None:
    """What note_kept said of this interruption, or None."""
    what = getattr(stop, "weightdiag_kept", None)
    return what if isinstance(what, str) else None


class WeightdiagError(Exception):
    """Base of every error weightdiag raises deliberately.

    Each subclass names one cause and carries what it is about as attributes (`repo`, `revision`, `file`,
    `status`, ...; None where the raise site does not know it), listed in `field_names` and returned by
    `fields`. The message is written at the raise site, one line; weightdiag.cli.errors._error_line prints it.
    """

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL
    field_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str) -> None:
        # Keep messages to one line so the CLI can print them without a traceback.
        super().__init__(" ".join(message.split()))

    def __str__(self) -> str:
        return self.render(_library_name)

    def render(self, name: Callable[[str], str]) -> str:
        """The message with each parameter marked by param() written as name(key) gives it (str(exc): the
        parameter's name; weightdiag.cli.errors: its flag)."""
        return _PARAM.sub(lambda found: name(found[1]), super().__str__())

    @property
    def message(self) -> str:
        return str(self)

    @property
    def fields(self) -> dict[str, Any]:
        """The cause's fields by name, e.g. {'repo': 'acme/tiny', 'revision': 'step9'}."""
        return {name: getattr(self, name, None) for name in self.field_names}

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take their fields as keyword arguments, which Exception's pickling (cls(*args)) would
        # drop: rebuild from the message and the attributes (errors cross process pools in `sweep`).
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[WeightdiagError], args: tuple[Any, ...], state: dict[str, Any]) -> WeightdiagError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


_MARK = "\0"  # C strings end there: no path, Hub id, argument or environment variable holds one
_PARAM = re.compile(f"{_MARK}([A-Za-z_][A-Za-z0-9_.]*){_MARK}")


def param(name: str) -> str:
    """Parameter `name` inside an error message: its name in str(exc), its flag on the command line (above)."""
    if not _PARAM.fullmatch(f"{_MARK}{name}{_MARK}"):
        raise ValueError(f"not a parameter name: {name!r}")
    return f"{_MARK}{name}{_MARK}"


def _library_name(key: str) -> str:
    """How a library caller reads a parameter: `sweep.steps` is sweep's `steps`."""
    return key.rsplit(".", 1)[-1]


# --- the user's input: exit 2 ---------------------------------------------------------------------------


class BadInputError(WeightdiagError):
    """The model path, file contents or an option cannot be used."""

    exit_code = ExitCode.BAD_INPUT


class OptionError(BadInputError):
    """A parameter or environment variable has an unusable value; `param` names it (`trim`, `HF_ENDPOINT`), and
    the message names it (and any other parameter it mentions) with param()."""

    field_names = ("param",)

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class ModelPathError(BadInputError):
    """The MODEL argument names nothing usable: a missing path, a file or folder without weights (or without
    a shard it names), an unusable HF cache folder, or a string that is no valid Hub id; `path` is it."""

    field_names = ("path",)

    def __init__(self, message: str, *, path: str | PathLike[str]) -> None:
        super().__init__(message)
        self.path = str(path)


class CheckpointFormatError(BadInputError):
    """A checkpoint file violates its format (safetensors header, index, config, GGUF, pickle); `file` is its
    path (or `ORG/NAME/FILE` for a Hub file read by streaming), None where no single file is to blame."""

    field_names = ("file",)

    def __init__(self, message: str, *, file: str | PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.file = str(file) if file is not None else None


class QuantizationError(BadInputError):
    """A quantized checkpoint weightdiag cannot dequantize exactly (an unknown method or layout, a weight
    without its scales): refused rather than fitted on codes or with weights left out. `method` is the
    checkpoint's quant_method (None when only the tensor names gave it away)."""

    field_names = ("method",)

    def __init__(self, message: str, *, method: str | None) -> None:
        super().__init__(message)
        self.method = method


class OutputError(BadInputError):
    """An output file the user named cannot take what is to be written (a folder, a read-only place);
    `path` is it, as given (`--output`, `--junit`)."""

    field_names = ("path",)

    def __init__(self, message: str, *, path: str | PathLike[str]) -> None:
        super().__init__(message)
        self.path = str(path)


class DatabaseError(BadInputError):
    """The database folder cannot be used: rows could not be written there (not a folder, not writable, a
    dangling or looping symlink, a path too long), or it holds no rows where some are needed; `folder` is
    its rows folder (`DB/rows`, as the message names it)."""

    field_names = ("folder",)

    def __init__(self, message: str, *, folder: str | PathLike[str]) -> None:
        super().__init__(message)
        self.folder = str(folder)
        self.unsaved_row: Mapping[str, Any] | None = None  # a fitted Row that could not be written (fit --json)


# How to install torch, the [torch] extra: weightdiag is not on PyPI, so `pip install 'weightdiag[torch]'` fails (and
# would invite a squatted name); the extra is installed from a checkout, or torch itself (issue 42).
TORCH_INSTALL = "pip install 'torch>=2.6' (or, in the weightdiag checkout, pip install '.[torch]')"
# The [pandas] extra likewise: the frames need pandas, the Parquet export pyarrow.
PANDAS_INSTALL = "pip install 'pandas>=2.0' 'pyarrow>=14' (or, in the weightdiag checkout, pip install '.[pandas]')"


class MissingDependencyError(BadInputError):
    """An optional package that the asked-for feature needs is not installed (plots: matplotlib, `sweep
    --executor ray`: ray); `package` is its name, the message says how to install it."""

    field_names = ("package",)

    def __init__(self, message: str, *, package: str) -> None:
        super().__init__(message)
        self.package = package


class RowUseError(BadInputError):
    """A readable row that cannot serve what was asked of it: a cohort summary (no per-matrix fits) given as
    a baseline or to `report`, a row fitted with another protocol than its baseline. `model_id` is the row's
    `model.id` (None where the row has none). An unreadable or damaged row is a records.RowError instead."""

    field_names = ("model_id",)

    def __init__(self, message: str, *, model_id: str | None) -> None:
        super().__init__(message)
        self.model_id = model_id


# --- the Hub and the network: exit 3 --------------------------------------------------------------------


class HubError(WeightdiagError):
    """The Hub or the network refused or failed. Raised as such where no subclass fits (a revision without
    weights, pickles that need --download); `repo`, `revision`, `file` (a path in the repo) and `status` (an
    HTTP status) are None where unknown."""

    exit_code = ExitCode.HUB
    field_names: ClassVar[tuple[str, ...]] = ("repo", "revision", "file", "status")  # subclasses add theirs

    def __init__(
        self,
        message: str,
        *,
        repo: str | None = None,
        revision: str | None = None,
        file: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.repo = repo
        self.revision = revision
        self.file = file
        self.status = status


class RepoNotFoundError(HubError):
    """No such model repository (or a private one without a token)."""

    def __init__(self, message: str, *, repo: str) -> None:
        super().__init__(message, repo=repo, status=404)


class RevisionNotFoundError(HubError):
    """The repository exists, the branch, tag or commit `revision` does not."""

    def __init__(self, message: str, *, repo: str, revision: str | None) -> None:
        super().__init__(message, repo=repo, revision=revision, status=404)


class GatedRepoError(HubError):
    """Access refused: `status` 401 (not logged in) or 403 (a token without access yet); None when the Hub's
    error did not say. `file` is set when the refusal came on reading that file."""

    def __init__(self, message: str, *, repo: str | None, status: int | None, file: str | None = None) -> None:
        super().__init__(message, repo=repo, file=file, status=status)


class HubUnreachableError(HubError):
    """No connection to the Hub at `endpoint` (refused, reset, DNS, TLS); models in the local cache are
    read from there instead."""

    field_names = (*HubError.field_names, "endpoint")

    def __init__(self, message: str, *, endpoint: str, repo: str | None = None) -> None:
        super().__init__(message, repo=repo)
        self.endpoint = endpoint


class NotCachedError(HubError):
    """Offline (HF_HUB_OFFLINE, or the Hub unreachable) and the local cache lacks the revision or some of
    its files."""

    def __init__(self, message: str, *, repo: str, revision: str | None) -> None:
        super().__init__(message, repo=repo, revision=revision)


class HubResponseError(HubError):
    """The Hub answered, but not as it should: a malformed model info or listing, an unexpected HTTP `status`,
    a wrong byte range, a redirect loop, an index naming a file the repo lacks."""


class TransferError(HubError):
    """Bytes did not arrive: a server that stopped sending or never answered in time, retries used up, a
    download that failed. Running the command again may succeed."""


class VerificationError(HubError):
    """Bytes read from the Hub do not match the file's published sha256 (nothing is written); `expected` and
    `got` are the two sha256 digests."""

    field_names = (*HubError.field_names, "expected", "got")

    def __init__(self, message: str, *, repo: str | None, file: str, expected: str | None, got: str) -> None:
        super().__init__(message, repo=repo, file=file)
        self.expected = expected
        self.got = got
