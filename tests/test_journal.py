"""Journals that can only help (issue 31): a resume gives the row a fresh fit gives, or the journal is not used.

The journal's manifest covers what shapes a record besides the shards (config.json and its quantization
settings, the kernels, the build), each record is checked as rows are and by its checksum, the journal never
costs the row its disk space, and stale journals are listed (`db journals`) and removed (`db gc`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import weightdiag
from weightdiag import api, kernels
from weightdiag.database import store as db
from weightdiag.record import journal as journal_module
from weightdiag.record.journal import PARTIAL_DIR, WRITER, digest
from weightdiag.run import fitting
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .conftest import run_cli
from .hub_server import write_small_model
from .test_resume import _StopAfter

_CONTEXT = ("created", "run")


def _science(row: dict) -> dict:
    """The row less its run metadata (when and how it ran), as in tests/test_resume.py."""
    return {k: v for k, v in row.items() if k not in _CONTEXT}


def _fit(spec: Path, database: Path, progress=None, **options) -> dict:
    return api.fit(str(spec), FitOptions(device="cpu", **options), progress, db_dir=database).row


def _interrupted(model: Path, database: Path, after: int = 5) -> Path:
    """Fit `model` into `database`, interrupted after `after` tensors: the journal it leaves."""
    before = set(_journals(database))
    with pytest.raises(KeyboardInterrupt):
        _fit(model, database, _StopAfter(after))
    (folder,) = set(_journals(database)) - before
    return folder


def _journals(database: Path) -> list[Path]:
    folder = database / "rows" / PARTIAL_DIR
    return sorted(folder.iterdir()) if folder.exists() else []


def _edit_config(model: Path, **changes) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.fixture
def model(tmp_path_factory) -> Path:
    return write_small_model(tmp_path_factory.mktemp("model"), shard_bytes=120_000)


# --- 1. the manifest covers what shapes a record -----------------------------------------------------------


def test_model_type_edited_between_an_interrupted_fit_and_its_rerun(model, tmp_path, capsys):
    """llama -> gemma changes the norms' offset (gemma stores 1 + w): the rerun is a fresh fit of the edited
    checkpoint, never a mix of both configs."""
    _interrupted(model, tmp_path / "db")
    _edit_config(model, model_type="gemma", architectures=["GemmaForCausalLM"])
    capsys.readouterr()
    row = _fit(model, tmp_path / "db")
    assert "resumed" not in row["run"]
    assert "config.json or another file of the checkpoint changed since" in capsys.readouterr().err
    assert _science(row) == _science(_fit(model, tmp_path / "fresh"))


def test_head_count_edited_on_a_fused_qkv_model(tmp_path):
    """GPT-NeoX's fused query_key_value is split per head: num_attention_heads 4 -> 8 changes its parts."""
    model = synthetic.write_model(
        tmp_path / "neox", synthetic.ModelSpec(family="gpt_neox", n_layers=2, d_model=64, n_heads=4, ffn_size=128)
    )
    before = _fit(model, tmp_path / "before")
    _interrupted(model, tmp_path / "db", after=len(before["matrices"]) // 2)
    _edit_config(model, num_attention_heads=8)
    row = _fit(model, tmp_path / "db")
    fresh = _fit(model, tmp_path / "fresh")
    assert _science(fresh) != _science(before)  # the edit does change the records
    assert "resumed" not in row["run"]
    assert _science(row) == _science(fresh)


def test_hf_quant_config_is_part_of_the_identity(model, tmp_path):
    """A file the plan reads beside config.json (modelopt's hf_quant_config.json) changes the manifest."""
    from weightdiag.record.journal import manifest, resume_options
    from weightdiag.source.local import open_local

    def identity() -> dict:
        plan, reader = open_local(str(model))
        reader.close()
        return manifest(plan, resume_options(FitOptions()))

    first = identity()
    (model / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": None}}))
    assert identity()["plan"] != first["plan"]
    _edit_config(model, quantization_config={"quant_method": "none"})
    assert identity()["plan"] != first["plan"]


def test_a_journal_of_an_older_build_is_not_reused(model, tmp_path, monkeypatch, capsys):
    """Same __version__, other sources: the build identity (a hash of the package's .py and .c) differs."""
    monkeypatch.setattr(journal_module, "build_identity", lambda: f"{weightdiag.__version__}+older")
    _interrupted(model, tmp_path / "db")
    monkeypatch.undo()
    capsys.readouterr()
    row = _fit(model, tmp_path / "db")
    assert "resumed" not in row["run"]
    assert "written by another build of weightdiag" in capsys.readouterr().err
    assert _science(row) == _science(_fit(model, tmp_path / "fresh"))


def test_the_build_identity_hashes_the_sources(tmp_path, monkeypatch):
    identity = journal_module.build_identity()
    assert identity.startswith(weightdiag.__version__ + "+") and len(identity) > len(weightdiag.__version__) + 8
    assert journal_module.build_identity() is identity  # computed once per process
    # Another copy of the package with one source line changed: another identity.
    package = Path(journal_module.__file__).resolve().parent.parent
    copy = tmp_path / "weightdiag"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from weightdiag.record import journal; "
        "print(journal.build_identity())"
    )
    same = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert same.stdout.strip() == identity
    with open(copy / "fit" / "weibull.py", "a") as f:
        f.write("\n# a change\n")
    changed = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert changed.stdout.strip() != identity


@pytest.mark.skipif(not kernels.HAVE_C, reason="needs both kernels")
def test_a_journal_of_other_kernels_is_not_reused(model, tmp_path, monkeypatch, capsys):
    _interrupted(model, tmp_path / "db")  # the C kernels
    monkeypatch.setattr(kernels, "HAVE_C", False)
    capsys.readouterr()
    row = _fit(model, tmp_path / "db")
    assert "resumed" not in row["run"]
    assert "other kernels" in capsys.readouterr().err
    assert _science(row) == _science(_fit(model, tmp_path / "fresh"))


# --- 2. damaged records are dropped and read again ---------------------------------------------------------


def _with_checksum(entry: dict) -> dict:
    return {**entry, "sha256": digest(entry)}


def _wrong_type(entry: dict) -> dict:
    entry["matrices"][0]["fits"]["mid80"]["k"] = "1.2"
    return _with_checksum(entry)


def _missing_field(entry: dict) -> dict:
    del entry["matrices"][0]["stats"]
    return _with_checksum(entry)


def _emptied(entry: dict) -> dict:
    entry["matrices"] = []
    return _with_checksum(entry)


def _bad_checksum(entry: dict) -> dict:
    entry["matrices"][0]["fits"]["mid80"]["k"] += 1e-9  # a digit changed, the checksum not
    return entry


def _no_checksum(entry: dict) -> dict:
    entry.pop("sha256")
    return entry


def _number(text: str, value: object = math.nan) -> Callable[[dict], str]:
    """Issue 42, item 3: a number no row holds (the row is strict JSON: NaN as null), under a valid checksum,
    written as `text`: passed every check, then failed the row's write at the end of the fit (exit 5), and the
    journal, kept, failed every rerun the same way."""

    def damage(entry: dict) -> str:
        entry.pop("sha256")
        entry["matrices"][0]["fits"]["mid80"]["k"] = value
        return json.dumps(_with_checksum(entry)).replace(json.dumps(value), text)

    return damage


DAMAGE: dict[str, Callable[[dict], dict | str]] = {
    "wrong type": _wrong_type,
    "missing field": _missing_field,
    "emptied": _emptied,
    "bad checksum": _bad_checksum,
    "no checksum": _no_checksum,
    "truncated": lambda entry: json.dumps(entry)[: len(json.dumps(entry)) // 2],
    "NaN": _number("NaN"),
    "Infinity": _number("Infinity", math.inf),
    "-Infinity": _number("-Infinity", -math.inf),
    "1e999": _number("1e999", math.inf),  # a finite literal that parses to infinity
    "an integer of 400 digits": _number(str(10**400), 10**400),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_record_is_dropped_and_its_tensor_read_again(model, tmp_path, damage):
    folder = _interrupted(model, tmp_path / "db")
    path = folder / "records.jsonl"
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line).get("matrices"))  # a matrix's record
    damaged = DAMAGE[damage](json.loads(lines[at]))
    lines[at] = damaged if isinstance(damaged, str) else json.dumps(damaged)
    path.write_text("\n".join(lines) + "\n")
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(tmp_path / "db"), "--json", "-q")
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "1 damaged journal record dropped" in warnings[0], out.stderr
    assert "its tensor is read again" in warnings[0]
    row = json.loads(out.stdout)
    assert row["run"]["resumed"]["tensors"] == 4  # the other records of the interrupted fit are reused
    assert _science(row) == _science(_fit(model, tmp_path / "fresh"))
    (saved,) = (tmp_path / "db" / "rows").glob("*.json")
    assert _science(db.load_row(saved)) == _science(row)  # the tool's own reader takes the row
    assert not _journals(tmp_path / "db")


def test_a_manifest_that_is_not_json_starts_over(model, tmp_path):
    folder = _interrupted(model, tmp_path / "db")
    (folder / "manifest.json").write_text('{"schema": "weightdiag.resume/2", "bui')
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(tmp_path / "db"), "--json", "-q")
    assert out.returncode == 0, out.stderr
    assert "its manifest is unreadable; the fit starts over" in out.stderr
    assert "resumed" not in json.loads(out.stdout)["run"]


# --- 3. journals never cost the row ------------------------------------------------------------------------


def test_the_journal_is_removed_once_the_row_is_written(model, tmp_path):
    database = tmp_path / "db"
    _fit(model, database)
    assert not _journals(database)  # an uninterrupted fit
    _interrupted(model, database)
    _fit(model, database)
    assert not _journals(database)  # a resumed one
    out = run_cli("sweep", str(model.parent), "--all", "--glob", model.name, "--db", str(tmp_path / "sw"), "-q")
    assert out.returncode == 0, out.stderr
    assert list((tmp_path / "sw" / "rows").glob("*.json")) and not _journals(tmp_path / "sw")


def test_a_journal_that_cannot_be_removed_is_said_and_gc_takes_it(model, tmp_path, monkeypatch):
    database = tmp_path / "db"
    folder = _interrupted(model, database)
    monkeypatch.setattr(journal_module.shutil, "rmtree", lambda *args, **kwargs: None)  # as a file it cannot remove
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(database), "-q")
    assert out.returncode == 0, out.stderr
    assert f"{folder}: this fit's journal could not be removed; `weightdiag db gc` removes it" in out.stderr
    monkeypatch.undo()
    (listed,) = json.loads(run_cli("db", "journals", "--db", str(database), "--json").stdout)
    if listed["state"] == "running":  # written by this process, which lives: as another process's would be
        _set_writer(folder, pid=_dead_pid())
    assert run_cli("db", "gc", "--db", str(database)).returncode == 0
    assert not _journals(database)


def _disk(monkeypatch, free: Callable[[], int]) -> None:
    real = shutil.disk_usage

    def usage(path):
        total, used, _ = real(path)
        return type(real(path))(total, used, free())

    monkeypatch.setattr(shutil, "disk_usage", usage)


def test_a_nearly_full_disk_takes_the_row_in_place_of_its_journal(model, tmp_path, monkeypatch):
    """The disk cannot hold both: this fit's journal (all of it in the row) goes first, and the row is written."""
    database = tmp_path / "db"
    folder = _interrupted(model, database)
    row = _fit(model, tmp_path / "ref")
    need = len(json.dumps(row, indent=1)) + fitting.ROOM_MARGIN
    _disk(monkeypatch, lambda: need - 1000 if folder.exists() else need + 10**6)
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(database), "-q")
    assert out.returncode == 0, out.stderr
    assert "this fit's journal" in out.stderr and "is removed to make room for its row" in out.stderr
    assert len(list((database / "rows").glob("*.json"))) == 1 and not _journals(database)


def test_a_full_disk_names_the_journals_and_how_to_clear_them(model, tmp_path, monkeypatch):
    database = tmp_path / "db"
    other = write_small_model(tmp_path / "other", shard_bytes=120_000, seed=2)
    _interrupted(other, database)  # another model's journal takes the space
    _disk(monkeypatch, lambda: 1000)
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(database), "-q")
    assert out.returncode == 2, out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert "cannot write a row" in line
    assert f"{database / 'rows' / PARTIAL_DIR} holds" in line
    assert "weightdiag db journals" in line and "weightdiag db gc" in line
    assert not list((database / "rows").glob("*.json"))


def test_no_space_at_the_write_names_rows_partial(model, tmp_path, monkeypatch):
    """ENOSPC raised by the write itself (as tests/test_disk_full.py injects it)."""
    database = tmp_path / "db"
    _interrupted(model, database)
    real = db.write_text_atomic

    def write(path, text, before_rename=None):
        if path.parent.name == "rows":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, before_rename)

    monkeypatch.setattr(db, "write_text_atomic", write)
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(database), "-q")
    assert out.returncode == 2
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert "No space left on device" in line and f"{database / 'rows' / PARTIAL_DIR} holds" in line
    assert "weightdiag db gc" in line


# --- db journals, db gc ------------------------------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _set_writer(folder: Path, **fields) -> None:
    path = folder / "manifest.json"
    st = path.stat()
    document = json.loads(path.read_text())
    document[WRITER].update(fields)
    path.write_text(json.dumps(document))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as its writer left it


def test_db_journals_lists_and_db_gc_removes_only_the_stale(model, tmp_path):
    database = tmp_path / "db"
    running = _interrupted(model, database)  # written by this process: its fit counts as running while
    held = (running / "records.jsonl").open("a")  # it holds the records, as a fit does until its row is written
    interrupted = _interrupted(write_small_model(tmp_path / "b", shard_bytes=120_000, seed=3), database)
    _set_writer(interrupted, pid=_dead_pid())
    stale = _interrupted(write_small_model(tmp_path / "c", shard_bytes=120_000, seed=4), database)
    _set_writer(stale, pid=_dead_pid())
    document = json.loads((stale / "manifest.json").read_text())
    document["build"] = "0.1.0+older"
    (stale / "manifest.json").write_text(json.dumps(document))

    out = run_cli("db", "journals", "--db", str(database), "--json")
    assert out.returncode == 0, out.stderr
    listed = {Path(j["journal"]).name: j for j in json.loads(out.stdout)}
    assert {name: j["state"] for name, j in listed.items()} == {
        running.name: "running",
        interrupted.name: "interrupted",
        stale.name: "stale",
    }
    for j in listed.values():
        assert j["model"] and j["bytes"] > 0 and j["age_seconds"] >= 0 and j["host"]
    text = run_cli("db", "journals", "--db", str(database))
    assert "another build" in text.stdout and "1 stale journal: `weightdiag db gc` removes them" in text.stderr

    dry = run_cli("db", "gc", "--db", str(database), "--dry-run")
    assert dry.returncode == 0 and f"would remove {stale}" in dry.stdout
    assert sorted(_journals(database)) == sorted([running, interrupted, stale])
    assert run_cli("db", "gc", "--db", str(database)).returncode == 0
    assert sorted(_journals(database)) == sorted([running, interrupted])
    assert run_cli("db", "gc", "--db", str(database), "--all").returncode == 0
    assert _journals(database) == [running]  # never one whose fit is running
    held.close()


def test_db_gc_leaves_a_journal_whose_sweep_holds_its_claim(model, tmp_path):
    database = tmp_path / "db"
    folder = _interrupted(model, database)
    _set_writer(folder, pid=_dead_pid())
    with db.claim(database / "rows" / folder.name) as holder:
        assert holder is None
        out = run_cli("db", "gc", "--db", str(database), "--all")
        assert out.returncode == 0 and _journals(database) == [folder]
    run_cli("db", "gc", "--db", str(database), "--all")
    assert not _journals(database)


def test_a_journal_of_a_changed_checkpoint_is_stale(model, tmp_path):
    database = tmp_path / "db"
    folder = _interrupted(model, database)
    _set_writer(folder, pid=_dead_pid())
    shard = sorted(model.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (j,) = json.loads(run_cli("db", "journals", "--db", str(database), "--json").stdout)
    assert j["state"] == "stale" and "changed" in j["why"]


# --- 4. shard names that are not UTF-8 ---------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes: Linux file systems")
def test_a_shard_whose_name_is_not_utf8_is_fitted(tmp_path):
    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=1, d_model=32, ffn_size=64))
    (shard,) = model.glob("*.safetensors")
    odd = os.fsdecode(b"w\xffeights.safetensors")  # byte 0xff: a lone surrogate in Python's str
    shard.rename(model / odd)
    assert os.path.exists(os.fsencode(model) + b"/w\xffeights.safetensors")
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(tmp_path / "db"), "--json", "-q", real=True)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert [f["name"] for f in row["files"]] == [odd] and len(row["matrices"]) == 9
    assert len(list((tmp_path / "db" / "rows").glob("*.json"))) == 1


def test_the_manifest_of_every_format_is_the_same_at_each_opening(smollm_gguf, antiberty_bin, model):
    """What the manifest hashes is read the same way each time (GGUF metadata, a .bin's pickle, safetensors
    headers), so that an interrupted fit of each format is resumed at all."""
    from weightdiag.record.journal import manifest, resume_options
    from weightdiag.source.open import open_model

    def identity(path: Path) -> dict:
        plan, reader = open_model(str(path))
        reader.close()
        return manifest(plan, resume_options(FitOptions()))

    for path in (smollm_gguf, antiberty_bin, model):
        assert identity(path) == identity(path)


# --- 5. journal files that are not files (issue 42, item 5) ------------------------------------------------
# A FIFO in place of manifest.json or records.jsonl hung `fit`, `db journals` and `db gc` (open() waits for a
# writer); a link to /dev/zero was read whole (20 GB, then killed). Each is now discarded by the fit with one
# line, listed as stale and removed by `db gc`: never opened for a blocking read, never read past a bound.


# Each replaces the file `path` with something else.
def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("{}")


def _link_to_a_copy(path: Path) -> None:
    """A link to the very bytes weightdiag wrote: still not the journal's own file (weightdiag writes no link)."""
    copy = path.parents[4] / f"{path.name}.copy"  # beside the database
    copy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(copy)


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "a FIFO (named pipe)"),
    "link to /dev/zero": (_dev_zero, "a symbolic link"),
    "folder": (_folder, "a folder"),
    "link to a copy": (_link_to_a_copy, "a symbolic link"),
}
JOURNAL_FILES = ("manifest.json", "records.jsonl")


def _bounded_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command line in a fresh process that may neither hang (killed after `timeout`: the test fails) nor
    take the machine's memory (4 GiB of address space: a read without end fails there, not in the OOM killer)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-m", "weightdiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env={**os.environ, "COLUMNS": "160", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )


def _hostile_journal(model: Path, database: Path, name: str, kind: str) -> Path:
    """An interrupted fit's journal (its writer gone) whose file `name` is then replaced by HOSTILE[kind]."""
    folder = _interrupted(model, database)
    _set_writer(folder, pid=_dead_pid())
    HOSTILE[kind][0](folder / name)
    return folder


@pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, /dev/zero and RLIMIT_AS: Linux")
@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("name", JOURNAL_FILES)
def test_a_journal_file_that_is_no_file_is_discarded_by_the_fit(model, tmp_path, name, kind):
    database = tmp_path / "db"
    folder = _hostile_journal(model, database, name, kind)
    out = _bounded_cli("fit", str(model), "--device", "cpu", "--db", str(database), "--json", "-q")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert line == (
        f"warning: {folder}: the journal of an interrupted fit is not reused: its {name} is {HOSTILE[kind][1]}, "
        "not a regular file; the fit starts over"
    )
    row = json.loads(out.stdout)
    assert "resumed" not in row["run"]
    assert _science(row) == _science(_fit(model, tmp_path / "fresh"))
    assert not _journals(database)
    if kind == "link to a copy":
        assert (tmp_path / f"{name}.copy").exists()  # the link is removed, never what it points to


@pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, /dev/zero and RLIMIT_AS: Linux")
@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("name", JOURNAL_FILES)
def test_db_journals_and_gc_take_a_journal_file_that_is_no_file_for_stale(model, tmp_path, name, kind):
    database = tmp_path / "db"
    folder = _hostile_journal(model, database, name, kind)
    listed = _bounded_cli("db", "journals", "--db", str(database), "--json")
    assert listed.returncode == 0, listed.stderr
    (j,) = json.loads(listed.stdout)
    assert j["state"] == "stale", j
    assert j["why"] == f"its {name} is {HOSTILE[kind][1]}, not a regular file"
    text = _bounded_cli("db", "journals", "--db", str(database))
    assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
    gc = _bounded_cli("db", "gc", "--db", str(database))
    assert gc.returncode == 0 and "Traceback" not in gc.stderr, gc.stderr
    assert f"{folder}" in gc.stdout and not _journals(database)


def test_a_journal_folder_that_is_a_link_is_removed_never_followed(model, tmp_path):
    """A link in place of the journal's folder (to a copy of a valid journal outside the database): neither read
    nor written through, nor is what it points to removed."""
    database = tmp_path / "db"
    folder = _interrupted(model, database)
    elsewhere = Path(shutil.move(folder, tmp_path / "elsewhere"))
    folder.symlink_to(elsewhere)
    out = _bounded_cli("fit", str(model), "--device", "cpu", "--db", str(database), "--json", "-q")
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert line == (
        f"warning: {folder}: the journal of an interrupted fit is not reused: it is a symbolic link, not a folder; "
        "the fit starts over"
    )
    assert "resumed" not in json.loads(out.stdout)["run"]
    assert not _journals(database) and sorted(p.name for p in elsewhere.iterdir()) == ["manifest.json", "records.jsonl"]


def test_rows_partial_as_a_link_out_of_the_database_is_never_written_through(model, tmp_path):
    database = tmp_path / "db"
    outside = tmp_path / "outside"
    outside.mkdir()
    (database / "rows").mkdir(parents=True)
    (database / "rows" / PARTIAL_DIR).symlink_to(outside)
    with pytest.raises(KeyboardInterrupt):
        _fit(model, database, _StopAfter(5))
    assert not list(outside.iterdir())
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(database), "-q")
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert line == (
        f"warning: {database / 'rows' / PARTIAL_DIR} is a symbolic link, not a folder; this fit keeps no journal "
        "to resume from"
    )
    assert not list(outside.iterdir()) and len(list((database / "rows").glob("*.json"))) == 1
