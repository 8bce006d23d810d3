"""Issue 13, "Losing data": injective bounded row names, old names still found, stale temporary files
cleaned, the database destination checked before the fit, and 8 concurrent fits killed at random."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightdiag.database import store as db
from weightdiag.errors import BadInputError
from weightdiag.run.sweep import row_path
from weightdiag.testing import synthetic
from weightdiag.vocabulary import PROTOCOLS

from .conftest import row_files, run_cli

ISSUE_IDS = ["team/llama", "team--llama", "модель", "мадель", ".", "..", "", "_", "a/-", "a-/", "x" * 300]
TINY = synthetic.ModelSpec(n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=256)


def stub(model_id: str, revision: str | None = "main", protocol: str = "hist1024", **extra: Any) -> dict[str, Any]:
    return {
        "schema": "weightdiag.row/1",
        "model": {"id": model_id, "revision": revision, "fingerprint": "local-abc", "source": "local"},
        "protocol": {"name": protocol, "trim": "mid80"},
        "kinds": {},
        "part_kinds": {},
        "matrices": [],
        "vectors": [],
        "skipped": [],
        "unclassified": [],
        **extra,
    }


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return synthetic.write_model(tmp_path_factory.mktemp("tiny"), TINY)


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp")) if folder.exists() else []


# --- names --------------------------------------------------------------------------------------------


def test_the_issues_colliding_ids_get_distinct_bounded_names():
    names = [db.row_filename(stub(i)) for i in [*ISSUE_IDS, "y" * 100_000]]
    assert len(set(names)) == len(names), names
    for name in names:
        assert len(name.encode()) <= db.MAX_ROW_NAME
        assert "/" not in name
        assert not name.startswith(".")
    assert names[0] == "team--llama@main.json"  # plain ids keep the name they always had
    assert names[1].startswith("team--llama~")
    assert names[2] == "модель@main.json"
    assert names[3] == "мадель@main.json"  # readable, no hash needed


def test_plain_names_are_unchanged_so_existing_rows_keep_their_file():
    for model_id, rev in [("EleutherAI/pythia-70m", "step3000"), ("run-a/checkpoint-1000", "refs/pr/1")]:
        row = stub(model_id, rev)
        assert db.row_filename(row) == db.legacy_row_filename(row)
    assert db.row_filename(stub("m", "v1", "exact")) == "m@v1.exact.json"


def test_a_revision_that_looks_like_a_protocol_suffix_does_not_collide():
    assert db.row_filename(stub("m", "v1.exact")) != db.row_filename(stub("m", "v1", "exact"))
    assert {f".{p}" for p in PROTOCOLS} == set(db._PROTOCOL_SUFFIXES)


def test_non_utf8_file_systems_get_ascii_stems(monkeypatch):
    monkeypatch.setattr(db, "_unicode_names", lambda: False)
    names = {db.row_filename(stub(i)) for i in ("модель", "мадель")}
    assert len(names) == 2
    assert all(n.isascii() for n in names)


ids = st.text(st.sampled_from("ab/-._~ @éé\u0301ß\ud800Я\x00"), max_size=12) | st.text(max_size=400)


@settings(max_examples=400, deadline=None)
@given(ids, ids, st.sampled_from(["main", "v1.exact", "", "a/b", "é"]), st.sampled_from(PROTOCOLS))
def test_names_are_injective_and_bounded(a: str, b: str, rev: str, protocol: str):
    name_a = db.row_filename(stub(a, rev or None, protocol))
    assert len(name_a.encode("utf-8", "surrogatepass")) <= db.MAX_ROW_NAME
    assert "/" not in name_a
    assert "\x00" not in name_a
    assert not name_a.startswith(".")
    if a != b:
        assert name_a != db.row_filename(stub(b, rev or None, protocol))
    assert name_a != db.row_filename(stub(a, "other", protocol))


def test_every_issue_id_is_written_and_read_back(tmp_path):
    for i in [*ISSUE_IDS, "y" * 100_000, "bad\ud800surrogate"]:
        path = db.write_row(stub(i), tmp_path)
        assert db.load_row(path)["model"]["id"] == i
    assert len(row_files(tmp_path)) == len(ISSUE_IDS) + 2
    assert {r["model"]["id"] for _, r in db.iter_rows(tmp_path)} == {*ISSUE_IDS, "y" * 100_000, "bad\ud800surrogate"}
    assert len(db.find_rows("team--llama", tmp_path)) == 1
    assert len(db.find_rows("team/llama", tmp_path)) == 1


# --- rows under the old names -------------------------------------------------------------------------


def test_a_different_models_row_at_our_old_name_is_moved_not_overwritten(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    # Before: 'team--llama' was written as team--llama@main.json, the name 'team/llama' keeps.
    (rows / "team--llama@main.json").write_text(json.dumps(stub("team--llama", created="old")))
    db.write_row(stub("team/llama"), tmp_path)
    assert [r["created"] for r in db.find_rows("team--llama", tmp_path)] == ["old"]
    assert len(db.find_rows("team/llama", tmp_path)) == 1


def test_our_row_under_its_old_name_is_found_and_then_replaced(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "_@main.json").write_text(json.dumps(stub("модель", created="old")))
    (rows / "_@v2.json").write_text(json.dumps(stub("мадель", "v2", created="old")))
    assert [r["created"] for r in db.find_rows("модель", tmp_path)] == ["old"]
    assert row_path(tmp_path, "модель", "main", "hist1024") == rows / "_@main.json"  # sweep: "existing"
    assert row_path(tmp_path, "мадель", "main", "hist1024") == rows / "мадель@main.json"
    db.write_row(stub("модель", created="new"), tmp_path)
    assert [r["created"] for r in db.find_rows("модель", tmp_path)] == ["new"]
    assert not (rows / "_@main.json").exists()
    db.write_row(stub("мадель", created="new"), tmp_path)  # v2's old row is another revision: kept
    assert sorted(r["created"] for r in db.find_rows("мадель", tmp_path)) == ["new", "old"]


@pytest.mark.e2e
def test_fit_keeps_team_slash_llama_and_team_dash_dash_llama_apart(tiny_model, tmp_path):
    for name in ("team/llama", "team--llama", "team/llama"):
        assert run_cli("fit", str(tiny_model), "--db", str(tmp_path), "--name", name, "-q").returncode == 0
    assert sorted(load["model"]["id"] for load in map(db.load_row, row_files(tmp_path))) == [
        "team--llama",
        "team/llama",
    ]


# --- temporary files ----------------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: not even a zombie
    return proc.pid


def test_stale_temporary_files_go_on_the_next_write_and_live_ones_stay(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    host = db._host_tag()
    other_host = "0" * 8 if host != "0" * 8 else "1" * 8
    dead, alive = dead_pid(), os.getpid()
    names = {
        f".m@main.json.{host}-{dead}.abc123.tmp": False,  # writer killed
        f".m@main.json.{host}-{alive}.abc123.tmp": True,  # writer at work
        f".m@main.json.{other_host}-{dead}.abc123.tmp": True,  # a pid of another host means nothing here
        ".m@main.json.k2j3h4l5.tmp": True,  # old-style name, recent
        ".n@main.json.a1b2c3d4.tmp": False,  # old-style name, 20 minutes old
        ".keep.tmp": True,  # not ours
        "notes.tmp": True,
    }
    for name in names:
        (rows / name).write_text("{half")
    old = time.time() - 1200
    os.utime(rows / ".n@main.json.a1b2c3d4.tmp", (old, old))
    assert [p.name for p in (p for p, _ in db.iter_rows(tmp_path))] == []  # never listed as rows
    db.write_row(stub("m"), tmp_path)
    assert sorted(temp_files(rows)) == sorted(n for n, keep in names.items() if keep)
    assert [p.name for p, _ in db.iter_rows(tmp_path)] == ["m@main.json"]


def test_hidden_json_files_are_not_rows(tmp_path):
    rows = tmp_path / "rows"
    db.write_row(stub("m"), tmp_path)
    (rows / ".m@main.json").write_text(json.dumps(stub("ghost")))
    assert [r["model"]["id"] for _, r in db.iter_rows(tmp_path)] == ["m"]


def test_the_host_tag_names_the_pid_namespace(monkeypatch):
    db._host_tag.cache_clear()
    here = db._host_tag()
    real_stat = os.stat
    monkeypatch.setattr(
        os, "stat", lambda p, *a, **k: os.stat_result((0,) * 10) if "ns/pid" in str(p) else real_stat(p)
    )
    db._host_tag.cache_clear()
    try:
        assert db._host_tag() != here or not Path("/proc/self/ns/pid").exists()
    finally:
        db._host_tag.cache_clear()


def test_temporary_names_of_the_longest_rows_stay_below_name_max(tmp_path):
    path = db.write_row(stub("é" * 1000, "r" * 1000, "exact"), tmp_path)
    prefix = db._temp_prefix(path)
    assert len((prefix + "abcdefgh.tmp").encode()) <= 255


# --- the destination, checked before the fit ----------------------------------------------------------


def one_line_exit_2(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("target", ["dangling", "loop"])
def test_a_broken_symlink_db_is_refused_before_the_fit(tmp_path, target):
    link = tmp_path / "db"
    link.symlink_to(tmp_path / "nowhere" if target == "dangling" else link)
    # The model does not exist either: the database is checked first, so the error names the link.
    one_line_exit_2(run_cli("fit", str(tmp_path / "no-model"), "--db", str(link)), "symbolic link")
    with pytest.raises(BadInputError, match="symbolic link"):
        db.check_writable(link)


def test_a_dangling_rows_link_inside_the_db_is_refused(tmp_path):
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "rows").symlink_to(tmp_path / "gone")
    with pytest.raises(BadInputError, match="symbolic link"):
        db.check_writable(tmp_path / "db")


@pytest.mark.e2e
def test_a_db_path_too_long_to_create_is_refused_before_the_fit(tmp_path):
    too_long = tmp_path / ("d" * 300)
    one_line_exit_2(run_cli("fit", str(tmp_path / "no-model"), "--db", str(too_long)), "database folder")
    deep = tmp_path.joinpath(*["e" * 200] * 25)  # every part fits; the whole path does not
    one_line_exit_2(run_cli("fit", str(tmp_path / "no-model"), "--db", str(deep)), "database folder")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_a_300_character_name_is_written(tiny_model, tmp_path):
    result = run_cli("fit", str(tiny_model), "--db", str(tmp_path), "--name", "n" * 300, "-q")
    assert result.returncode == 0, result.stderr
    [row] = row_files(tmp_path)
    assert db.load_row(row)["model"]["id"] == "n" * 300


@pytest.mark.e2e
def test_a_model_named_with_60k_characters_is_written(tmp_path):
    import numpy as np

    from .test_gguf import STR, gguf_file, llama_kv

    # The id comes from the file name (at most 255 bytes) or --name: a 120 KB --name (one argument may
    # hold at most 128 KiB) still gives a row file name within the limit.
    long_id = "Ж" * 60_000
    kv = [("general.name", STR, long_id) if e[0] == "general.name" else e for e in llama_kv()]
    weight = np.random.default_rng(0).standard_normal((96, 64)).astype("<f4")
    model = tmp_path / "m.gguf"
    model.write_bytes(gguf_file(kv, [("blk.0.ffn_up.weight", (96, 64), "F32", weight.tobytes())]))
    result = run_cli("fit", str(model), "--db", str(tmp_path / "db"), "-q", "--name", long_id)
    assert result.returncode == 0, result.stderr
    [row] = row_files(tmp_path / "db")
    assert db.load_row(row)["model"]["id"] == long_id
    assert len(row.name.encode()) <= db.MAX_ROW_NAME


@pytest.mark.e2e
def test_empty_model_and_empty_db_are_bad_input(tiny_model, tmp_path):
    work = tmp_path / "work"
    synthetic.write_model(work, TINY)  # the current folder is a model: '' must not fit it
    before = sorted(p.name for p in work.iterdir())
    one_line_exit_2(run_cli("fit", "", "--db", str(tmp_path / "db"), cwd=work), "empty model")
    one_line_exit_2(run_cli("fit", str(tiny_model), "--db", "", cwd=work), "--db")
    one_line_exit_2(run_cli("fit", str(tiny_model), "--db", " ", cwd=work), "--db")
    assert sorted(p.name for p in work.iterdir()) == before
    assert not (tmp_path / "db").exists()


# --- acceptance 2: concurrent fits killed at random ---------------------------------------------------


@pytest.mark.e2e
def test_eight_concurrent_fits_killed_at_random_lose_nothing(tiny_model, tmp_path):
    rng = random.Random(13)
    dbdir, rows = tmp_path / "db", tmp_path / "db" / "rows"
    env = {**os.environ, "COLUMNS": "160"}
    env.pop("WEIGHTDIAG_DB", None)
    names = ["a", "b", "team/llama", "team--llama", "модель", "a", "b", "a"]
    # Per process: None = left alone, "write" = killed inside its write, a float = killed after that many seconds.
    plans: list[float | str | None] = [None, "write", None, "write", rng.uniform(0, 1.5), "write", rng.uniform(0, 1.5)]
    plans.append(rng.choice([None, rng.uniform(0, 1.5)]))
    # "write" processes hold their temporary file until every other process is done (a finishing writer
    # would clean it up, as it should); the others pause 0.4 s there, where random kills may land.
    delays = ["30" if plan == "write" else "0.4" for plan in plans]
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "weightdiag", "fit", str(tiny_model), "--db", str(dbdir), "--name", n, "-q"],
            env={**env, db.TEST_WRITE_DELAY_ENV: delay},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, delay in zip(names, delays, strict=True)
    ]
    pending = {i for i, plan in enumerate(plans) if plan is not None}
    left_behind: list[str] = []
    while pending and time.monotonic() - started < 15:
        others_done = all(p.poll() is not None for p, plan in zip(procs, plans, strict=True) if plan != "write")
        for i in sorted(pending):
            proc, plan = procs[i], plans[i]
            mine = [t for t in temp_files(rows) if f"-{proc.pid}." in t]
            if proc.poll() is not None:
                pending.discard(i)
            elif plan == "write" and mine and others_done:
                proc.send_signal(signal.SIGKILL)
                left_behind += mine
                pending.discard(i)
            elif isinstance(plan, float) and time.monotonic() - started >= plan:
                proc.send_signal(signal.SIGKILL)
                pending.discard(i)
        time.sleep(0.005)
    for proc in procs:
        if proc.poll() is None:  # only if the loop timed out: fail below rather than hang
            proc.kill()
    codes = [proc.wait(timeout=15) for proc in procs]  # reaped: a zombie's pid still looks alive
    assert all(code in (0, -signal.SIGKILL) for code in codes), [p.stderr.read() for p in procs]
    assert all(codes[i] == 0 for i, plan in enumerate(plans) if plan is None), codes
    assert len(left_behind) == 3, (left_behind, codes)
    assert set(left_behind) <= set(temp_files(rows)), (left_behind, codes)

    completed = {names[i] for i, code in enumerate(codes) if code == 0}
    found = {}
    for path in rows.glob("*.json"):
        row = json.loads(path.read_text(encoding="utf-8"))  # every row file is complete JSON
        found[row["model"]["id"]] = path
    assert completed <= set(found), (completed, found)
    assert len(found) == len(list(rows.glob("*.json")))  # one file per model id

    # The next write removes what the killed writers left.
    result = run_cli("fit", str(tiny_model), "--db", str(dbdir), "--name", "next", "-q")
    assert result.returncode == 0, result.stderr
    assert temp_files(rows) == []
    assert {r["model"]["id"] for _, r in db.iter_rows(dbdir)} == set(found) | {"next"}
    assert time.monotonic() - started < 20


def test_a_deeply_nested_row_file_is_bad_input(tmp_path: Path) -> None:
    row = tmp_path / "deep.json"
    row.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadInputError, match="cannot read a row"):
        db.load_row(row)
