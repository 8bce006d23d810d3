"""The error hierarchy (weightdiag/errors.py): each class's exit code and fields, the types that real situations
raise (on the loopback Hub of tests/hub_server.py and on local files), and one line through the CLI."""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from weightdiag import api, cli
from weightdiag.cli.errors import FLAGS, flag
from weightdiag.database.store import AmbiguousRowError, RowNotFoundError
from weightdiag.errors import (
    BadInputError,
    CheckpointFormatError,
    DatabaseError,
    ExitCode,
    GatedRepoError,
    HubError,
    HubResponseError,
    HubUnreachableError,
    MissingDependencyError,
    ModelPathError,
    NotCachedError,
    OptionError,
    OutputError,
    RepoNotFoundError,
    RevisionNotFoundError,
    RowUseError,
    TransferError,
    VerificationError,
    WeightdiagError,
    param,
)
from weightdiag.record.schema import RowError
from weightdiag.run.measure import FitOptions

from .hub_server import FakeHub, write_small_model

HUB_FIELDS = {"repo": None, "revision": None, "file": None, "status": None}

# One instance of every class: (error, exit code, fields).
EXAMPLES: list[tuple[WeightdiagError, ExitCode, dict[str, object]]] = [
    (WeightdiagError("boom"), ExitCode.INTERNAL, {}),
    (BadInputError("bad"), ExitCode.BAD_INPUT, {}),
    (OptionError(f"{param('trim')} 'x': choose one of mid80", param="trim"), ExitCode.BAD_INPUT, {"param": "trim"}),
    (ModelPathError("/nope: no such file or folder", path=Path("/nope")), ExitCode.BAD_INPUT, {"path": "/nope"}),
    (
        CheckpointFormatError("/m/a.safetensors: bad", file=Path("/m/a.safetensors")),
        ExitCode.BAD_INPUT,
        {"file": "/m/a.safetensors"},
    ),
    (CheckpointFormatError("tensors in two shards"), ExitCode.BAD_INPUT, {"file": None}),
    (
        RowError("rows/x.json", "is missing", field="model.source"),
        ExitCode.BAD_INPUT,
        {"file": "rows/x.json", "field": "model.source", "problem": "is missing", "model_id": None},
    ),
    (
        OutputError("--output /o: is a folder; give a file path", path=Path("/o")),
        ExitCode.BAD_INPUT,
        {"path": "/o"},
    ),
    (
        DatabaseError("database folder /db/rows: /db is not a folder", folder=Path("/db/rows")),
        ExitCode.BAD_INPUT,
        {"folder": "/db/rows"},
    ),
    (
        MissingDependencyError("plots need matplotlib: pip install matplotlib", package="matplotlib"),
        ExitCode.BAD_INPUT,
        {"package": "matplotlib"},
    ),
    (RowUseError("c is a cohort summary; give the model", model_id="c"), ExitCode.BAD_INPUT, {"model_id": "c"}),
    (RowNotFoundError("x"), ExitCode.BAD_INPUT, {"spec": "x"}),
    (RowNotFoundError("acme/run", "acme/run: no rows in the database"), ExitCode.BAD_INPUT, {"spec": "acme/run"}),
    (AmbiguousRowError("q", ["Q", "q2"]), ExitCode.BAD_INPUT, {"spec": "q", "candidates": ["Q", "q2"]}),
    (
        HubError("acme/x@main: no weights", repo="acme/x", revision="main"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "revision": "main"},
    ),
    (
        RepoNotFoundError("acme/x: no such model repository", repo="acme/x"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "status": 404},
    ),
    (
        RevisionNotFoundError("acme/x: revision 'step9' not found", repo="acme/x", revision="step9"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "revision": "step9", "status": 404},
    ),
    (
        GatedRepoError("acme/x is gated", repo="acme/x", status=401, file="model.safetensors"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "file": "model.safetensors", "status": 401},
    ),
    (
        HubUnreachableError("cannot reach the Hub", endpoint="https://hf.example", repo="acme/x"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "endpoint": "https://hf.example"},
    ),
    (
        NotCachedError("acme/x@v1 is not in the local cache", repo="acme/x", revision="v1"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "revision": "v1"},
    ),
    (
        HubResponseError("acme/x: HTTP 502", repo="acme/x", file="a.safetensors", status=502),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "file": "a.safetensors", "status": 502},
    ),
    (
        TransferError("acme/x/a.safetensors: stopped", repo="acme/x", file="a.safetensors"),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "file": "a.safetensors"},
    ),
    (
        VerificationError(
            "acme/x/a.safetensors: sha256 mismatch",
            repo="acme/x",
            file="a.safetensors",
            expected="ab" * 32,
            got="cd" * 32,
        ),
        ExitCode.HUB,
        HUB_FIELDS | {"repo": "acme/x", "file": "a.safetensors", "expected": "ab" * 32, "got": "cd" * 32},
    ),
]


@pytest.mark.parametrize(
    ("error", "code", "fields"), EXAMPLES, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else ""
)
def test_each_class_has_its_exit_code_and_fields(
    error: WeightdiagError, code: ExitCode, fields: dict[str, object]
) -> None:
    assert error.exit_code == code
    assert error.fields == fields
    for name, value in fields.items():
        assert getattr(error, name) == value
    copy = pickle.loads(pickle.dumps(error))  # errors cross process pools (`sweep --jobs`)
    assert type(copy) is type(error)
    assert copy.message == error.message
    assert copy.fields == fields


def test_the_hierarchy_keeps_the_exit_codes_of_the_causes() -> None:
    bad_input = (OptionError, ModelPathError, CheckpointFormatError, RowError, RowNotFoundError, AmbiguousRowError)
    for cls in (*bad_input, OutputError, DatabaseError, MissingDependencyError, RowUseError):
        assert issubclass(cls, BadInputError)
        assert cls.exit_code == ExitCode.BAD_INPUT
    assert not issubclass(RowUseError, RowError)  # a usable-elsewhere row is not a damaged one (db list skips those)
    hub = (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError, NotCachedError)
    for cls in (*hub, HubResponseError, TransferError, VerificationError):
        assert issubclass(cls, HubError)
        assert cls.exit_code == ExitCode.HUB
    assert not issubclass(HubUnreachableError, TransferError)  # only an unreachable Hub falls back to the cache


def test_messages_stay_one_line() -> None:
    error = HubResponseError("acme/x:\n  the Hub answered\tHTTP 502", repo="acme/x", status=502)
    assert error.message == "acme/x: the Hub answered HTTP 502"
    with pytest.raises(TypeError):
        OptionError("no option named")  # type: ignore[call-arg]  # fields are required where the cause has them


@pytest.mark.parametrize(
    ("error", "code", "fields"), EXAMPLES, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else ""
)
def test_every_error_is_one_line_with_its_code_through_the_cli(
    error: WeightdiagError, code: ExitCode, fields: dict[str, object], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def app(**_: object) -> None:
        raise error

    monkeypatch.delenv("WEIGHTDIAG_DEBUG", raising=False)
    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "whatever"])
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert err == f"error: {error.render(flag)}\n"  # the parameters a message names, as flags
    assert "Traceback" not in err


# --- parameters: their names for the library, their flags on the command line -----------------------------------


def test_a_message_names_parameters_for_the_library_and_flags_for_the_command_line() -> None:
    error = OptionError(f"{param('schedule')} cosine needs {param('total')}\n (the run's total steps)", param="total")
    assert str(error) == error.message == "schedule cosine needs total (the run's total steps)"
    assert error.render(flag) == "--schedule cosine needs --total (the run's total steps)"
    assert error.param == "total"
    assert pickle.loads(pickle.dumps(error)).render(flag) == error.render(flag)  # sweep's workers hand errors back
    steps = OptionError(f"{param('sweep.steps')} 'log:x': expected log:N", param="steps")
    assert steps.message == "steps 'log:x': expected log:N"  # sweep's `steps`, beside FitOptions' (--train-steps)
    assert steps.render(flag) == "--steps 'log:x': expected log:N"
    assert flag("steps") == "--train-steps" and flag("model_id") == "--name"
    odd = OptionError(f"{param('revision')} 'a\x00b': give a branch", param="revision")
    assert odd.message == "revision 'a\x00b': give a branch"  # a NUL in a value is no parameter
    with pytest.raises(ValueError):
        param("--trim")  # a parameter's name, never a flag


def test_every_parameter_an_error_names_has_a_flag() -> None:
    """FLAGS (weightdiag/cli/errors.py) has every name that weightdiag's messages mark with param()."""
    import ast

    named: dict[str, str] = {}
    package = Path(api.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "param"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                named[str(node.args[0].value)] = f"{path.relative_to(package)}:{node.lineno}"
    assert named, "no param() call found: the scan no longer sees them"
    missing = {name: where for name, where in named.items() if name not in FLAGS}
    assert not missing, missing


def test_the_command_line_writes_the_flags_the_library_names_as_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("WEIGHTDIAG_DEBUG", raising=False)
    with pytest.raises(OptionError) as library:
        api.export_rows("xml", db_dir=tmp_path)
    assert library.value.message == "fmt 'xml': choose csv, jsonl or parquet"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["db", "export", "--format", "xml", "--db", str(tmp_path)])
    assert exit_info.value.code == ExitCode.BAD_INPUT
    assert capsys.readouterr().err == "error: --format 'xml': choose csv, jsonl or parquet\n"


# --- real situations on the loopback Hub ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_model(tmp_path_factory.mktemp("small"), shard_bytes=120_000)


def _fit(spec: str, **kw: object) -> dict:
    return api.fit_model(spec, FitOptions(device="cpu"), **kw)  # type: ignore[arg-type]


def test_missing_repo_and_revision(fake_hub: FakeHub, small_model: Path) -> None:
    fake_hub.add_folder("acme/run", small_model, branch="step1000")
    with pytest.raises(RepoNotFoundError) as missing:
        _fit("nobody/nothing")
    assert missing.value.repo == "nobody/nothing"
    assert missing.value.status == 404
    assert missing.value.exit_code == ExitCode.HUB
    assert "no such model repository" in missing.value.message
    with pytest.raises(RevisionNotFoundError) as revision:
        _fit("acme/run@step2500")
    assert revision.value.repo == "acme/run"
    assert revision.value.revision == "step2500"
    assert "nearest existing: step1000" in revision.value.message


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("hf_not_approved", 403)])
@pytest.mark.parametrize("gate_api", [False, True], ids=["files-gated", "metadata-gated"])
def test_gated_repo_401_and_403(
    fake_hub: FakeHub, small_model: Path, token: str | None, status: int, gate_api: bool
) -> None:
    fake_hub.gate_api = gate_api
    fake_hub.add_folder("acme/gated", small_model, gated="manual")
    with pytest.raises(GatedRepoError) as err:
        _fit("acme/gated", token=token)
    assert err.value.repo == "acme/gated"
    assert err.value.status == status
    assert err.value.exit_code == ExitCode.HUB
    if gate_api:
        assert err.value.file is None  # refused at the model info
    else:
        assert err.value.file in {"config.json", "model.safetensors.index.json"} or err.value.file.endswith(
            ".safetensors"
        )
    assert ("no access yet" if token else "log in") in err.value.message


def test_corrupted_bytes_name_the_file(
    fake_hub: FakeHub, small_model: Path, monkeypatch: pytest.MonkeyPatch, knobs: Callable[..., Any]
) -> None:
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0")
    knobs(head_guess=4096)  # the flipped byte lands in the tensor data
    fake_hub.add_folder("acme/tiny", small_model)
    shard = sorted(p.name for p in small_model.glob("*.safetensors"))[1]
    fake_hub.fail("corrupt", shard, times=1, method="GET")
    with pytest.raises(VerificationError) as err:
        _fit("acme/tiny")
    assert err.value.repo == "acme/tiny"
    assert err.value.file == shard
    assert err.value.expected == fake_hub.blob("acme/tiny", shard).sha256
    assert err.value.got != err.value.expected
    assert len(err.value.got) == 64
    assert err.value.exit_code == ExitCode.HUB


def test_a_byte_range_the_server_ignores(fake_hub: FakeHub, small_model: Path) -> None:
    fake_hub.add_folder("acme/tiny", small_model)
    fake_hub.ignore_range = True
    with pytest.raises(HubResponseError) as err:
        _fit("acme/tiny")
    assert err.value.repo == "acme/tiny"
    assert err.value.status == 200
    assert err.value.file in {"config.json", "model.safetensors.index.json"} or err.value.file.endswith(".safetensors")


def test_unreachable_hub_and_offline_without_a_cached_copy(
    fake_hub: FakeHub, small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.add_folder("acme/tiny", small_model)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NotCachedError) as offline:
        _fit("acme/tiny@v2")
    assert offline.value.repo == "acme/tiny"
    assert offline.value.revision == "v2"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    endpoint = fake_hub.url
    fake_hub.stop()
    with pytest.raises(HubUnreachableError) as unreachable:
        _fit("acme/tiny")
    assert unreachable.value.endpoint == endpoint
    assert unreachable.value.repo == "acme/tiny"
    assert "cannot reach the Hub" in unreachable.value.message


# --- local situations ----------------------------------------------------------------------------------------


def test_missing_model_path(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    with pytest.raises(ModelPathError) as err:
        _fit(str(missing))
    assert err.value.path == str(missing)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert "no such file or folder" in err.value.message


def test_truncated_safetensors_header_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b'{"w": {"dtype": "F32"')  # the header claims more than is there
    with pytest.raises(CheckpointFormatError) as err:
        _fit(str(path))
    assert err.value.file == str(path)
    assert err.value.exit_code == ExitCode.BAD_INPUT


def test_revision_on_a_local_path_is_an_option_error(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as err:
        api.fit_model(str(tmp_path), FitOptions(device="cpu"), revision="main")
    assert err.value.param == "revision"
    assert err.value.message == f"revision applies to Hub repos; {tmp_path} is a local path"


def test_options_and_environment_variables_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightdiag import settings

    with pytest.raises(OptionError) as trim:
        FitOptions(trim="mid99").validate()
    assert trim.value.param == "trim" and trim.value.message.startswith("trim 'mid99': choose one of")
    with pytest.raises(OptionError) as lr:
        FitOptions(lr=-1.0).validate()
    assert lr.value.param == "lr" and lr.value.message == "lr must be a positive finite number, not -1.0"
    monkeypatch.setenv("WEIGHTDIAG_THREADS", "many")
    with pytest.raises(OptionError) as threads:
        settings.threads()
    assert threads.value.param == "WEIGHTDIAG_THREADS"
    assert threads.value.exit_code == ExitCode.BAD_INPUT
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "soon")
    with pytest.raises(OptionError) as backoff:
        settings.http_retries()
    assert backoff.value.param == "WEIGHTDIAG_HTTP_BACKOFF"


# --- the user's options, outputs, database and rows ------------------------------------------------------------


def test_sweep_options_are_named(tmp_path: Path) -> None:
    from weightdiag.run import sweep as sw

    with pytest.raises(OptionError) as jobs:
        api.sweep(str(tmp_path), db_dir=tmp_path / "db", jobs=0)
    assert jobs.value.param == "jobs"
    assert jobs.value.message == "jobs must be at least 1"  # the parameter's name: the CLI writes --jobs
    with pytest.raises(OptionError) as executor:
        api.sweep(str(tmp_path), db_dir=tmp_path / "db", executor="slurm")
    assert executor.value.param == "executor"
    revisions = [sw.Revision(f"step{n}", n, f"acme/run@step{n}") for n in (0, 10, 100)]
    for steps in ("log:x", "1,x", "log:1", "7"):
        with pytest.raises(OptionError) as bad_steps:
            sw.select(revisions, steps=steps)
        assert bad_steps.value.param == "steps"
    with pytest.raises(OptionError) as missing:
        sw.select(revisions, names=["step5"])
    assert missing.value.param == "revisions"
    with pytest.raises(ModelPathError) as not_a_run:
        api.sweep(str(tmp_path), db_dir=tmp_path / "db")  # a folder without checkpoint folders
    assert not_a_run.value.path == str(tmp_path)


def test_an_unwritable_db_is_a_database_error(tmp_path: Path) -> None:
    from weightdiag.database import store as db

    not_a_folder = tmp_path / "db"
    not_a_folder.write_text("a file, not a folder\n")
    with pytest.raises(DatabaseError) as err:
        db.check_writable(not_a_folder)
    assert err.value.folder == str(not_a_folder / "rows")
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert "is not a folder" in err.value.message
    with pytest.raises(OptionError) as empty:
        cli._db_path(" ")
    assert empty.value.param == "db_dir"


def test_an_empty_db_and_a_model_without_rows(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as nothing:
        api.compare(db_dir=tmp_path)
    assert nothing.value.folder == str(tmp_path / "rows")
    with pytest.raises(RowNotFoundError) as no_rows:
        api.trajectory("acme/run", db_dir=tmp_path)
    assert no_rows.value.spec == "acme/run"
    assert no_rows.value.message == (
        f"acme/run: no rows in the database {tmp_path.resolve()}; run `weightdiag sweep acme/run` first, or pass "
        "the database that holds them with --db (or WEIGHTDIAG_DB)"
    )


def test_outputs_that_cannot_be_written_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as output:
        api.export_rows(output=tmp_path, db_dir=tmp_path / "db")
    assert output.value.path == str(tmp_path)
    assert output.value.message.startswith(f"--output {tmp_path}: is a folder")
    with pytest.raises(OutputError) as junit:
        api.check("any-model", tmp_path / "base.json", junit=tmp_path)  # refused before the row is read
    assert junit.value.path == str(tmp_path)
    with pytest.raises(OptionError) as tol:
        api.check("any-model", tmp_path / "base.json", tol_k=-1.0)
    assert tol.value.param == "tol_k"
    with pytest.raises(OptionError) as fmt:
        api.export_rows("xml", db_dir=tmp_path / "db")
    assert fmt.value.param == "fmt"


def test_a_missing_matplotlib_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightdiag.render import plots

    monkeypatch.setattr(plots.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingDependencyError) as err:
        plots.require_matplotlib()
    assert err.value.package == "matplotlib"
    assert "pip install matplotlib" in err.value.message


def test_rows_that_cannot_serve_are_row_use_errors() -> None:
    from weightdiag.diagnose.check import check
    from weightdiag.diagnose.health import health_report

    cohort = {"model": {"id": "cohort/median", "source": "cohort"}, "protocol": {"name": "hist1024"}, "matrices": []}
    with pytest.raises(RowUseError) as report:
        health_report(cohort)
    assert report.value.model_id == "cohort/median"
    assert "a cohort summary" in report.value.message
    fitted = {"model": {"id": "acme/x", "source": "hub"}, "protocol": {"name": "hist1024"}, "matrices": []}
    with pytest.raises(RowUseError) as baseline:
        check(fitted, cohort)
    assert baseline.value.model_id == "cohort/median"
    exact = {**fitted, "protocol": {"name": "exact"}}
    with pytest.raises(RowUseError) as protocol:
        check(exact, cohort)
    assert protocol.value.model_id == "acme/x"


def test_two_different_revisions_for_one_model_are_refused():
    from weightdiag.errors import OptionError
    from weightdiag.source.open import open_model

    with pytest.raises(OptionError, match="name two revisions") as caught:
        open_model("acme/tiny@feature--x", revision="main")
    assert caught.value.param == "revision"
