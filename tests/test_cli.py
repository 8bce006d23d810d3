"""The command line end to end: output, rows, exit codes, one-line errors.

Most runs are in process (conftest.run_cli); the first fit and the start-up checks (--version, what a CPU fit
imports) run in a real interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import row_files, run_cli, write_safetensors

pytestmark = pytest.mark.e2e


def test_fit_minilm_writes_one_row_and_prints_the_table(minilm_dir, tmp_path):
    db = tmp_path / "db"
    out = run_cli("fit", str(minilm_dir), "--db", str(db), real=True)  # the console entry point in its own process
    assert out.returncode == 0, out.stderr
    assert "median k" in out.stdout
    assert "ffn_out" in out.stdout
    rows = row_files(db)
    assert len(rows) == 1
    assert rows[0].name.startswith("all-MiniLM-L6-v2@local-")
    row = json.loads(rows[0].read_text())
    assert row["schema"] == "weightdiag.row/1"
    assert row["model"]["source"] == "local"
    assert row["protocol"] == {
        "name": "hist1024",
        "trim": "mid80",
        "trims": ["mid80", "mid90", "full"],
        "centered": False,
        "bins": 1024,
        "log10_range": [-12.0, 2.0],
    }
    assert row["tool"]["name"] == "weightdiag"
    assert row["files"][0]["size"] == 90868376
    # Refitting the same model replaces its row instead of adding one.
    assert run_cli("fit", str(minilm_dir), "--db", str(db), "-q").returncode == 0
    assert len(row_files(db)) == 1


def test_json_output_and_env_database(minilm_dir, tmp_path):
    out = run_cli(
        "fit",
        str(minilm_dir),
        "--json",
        "--protocol",
        "exact",
        "--include",
        "encoder.layer.0.*",
        env={"WEIGHTDIAG_DB": str(tmp_path / "envdb")},
    )
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["protocol"]["name"] == "exact"
    assert all(m["block"] == 0 for m in row["matrices"])
    # the exact protocol, and a fit restricted by --include: a row of its own beside the full fit's
    assert [".exact.sel-" in p.name for p in row_files(tmp_path / "envdb")] == [True]


def test_no_save(minilm_dir, tmp_path):
    out = run_cli("fit", str(minilm_dir), "--no-save", "-q", cwd=tmp_path)
    assert out.returncode == 0
    assert not (tmp_path / "DATABASE").exists()


def _valid(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return write_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.mlp.up_proj.weight": ("F32", rng.standard_normal((32, 32)).astype(np.float32)),
            "model.layers.0.mlp.down_proj.weight": ("F32", rng.standard_normal((32, 32)).astype(np.float32)),
        },
    )


def _rewrite_header(path: Path, header: dict | bytes, keep_data: bool = True) -> None:
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (blob[8 + n :] if keep_data else b""))


def _case_truncated(p: Path) -> Path:
    f = _valid(p)
    f.write_bytes(f.read_bytes()[:-100])
    return f


def _case_header_beyond_file(p: Path) -> Path:
    f = _valid(p)
    f.write_bytes(struct.pack("<Q", 10**6) + f.read_bytes()[8:])
    return f


def _case_invalid_json(p: Path) -> Path:
    f = _valid(p)
    _rewrite_header(f, b'{"model.layers.0.mlp.up_proj.weight": {"dtype": "F32",')
    return f


def _entries(p: Path) -> tuple[Path, dict]:
    f = _valid(p)
    n = struct.unpack("<Q", f.read_bytes()[:8])[0]
    return f, json.loads(f.read_bytes()[8 : 8 + n])


def _case_offsets_out_of_range(p: Path) -> Path:
    f, doc = _entries(p)
    doc["model.layers.0.mlp.up_proj.weight"]["data_offsets"] = [8192, 12288]
    _rewrite_header(f, doc)
    return f


def _case_overlapping(p: Path) -> Path:
    f, doc = _entries(p)
    doc["model.layers.0.mlp.down_proj.weight"]["data_offsets"] = [2048, 6144]
    doc["model.layers.0.mlp.up_proj.weight"]["data_offsets"] = [0, 4096]
    _rewrite_header(f, doc)
    return f


def _case_unknown_dtype(p: Path) -> Path:
    f, doc = _entries(p)
    doc["model.layers.0.mlp.up_proj.weight"]["dtype"] = "F12"
    _rewrite_header(f, doc)
    return f


def _case_empty_folder(p: Path) -> Path:
    (p / "empty").mkdir()
    return p / "empty"


def _case_index_missing_shard(p: Path, small_llama: Path) -> Path:
    folder = Path(shutil.copytree(small_llama, p / "m"))
    sorted(folder.glob("model-*.safetensors"))[-1].unlink()
    return folder


def _case_index_escapes(p: Path, small_llama: Path) -> Path:
    folder = Path(shutil.copytree(small_llama, p / "m"))
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = next(iter(doc["weight_map"]))
    doc["weight_map"][first] = "../../etc/model.safetensors"
    index.write_text(json.dumps(doc))
    return folder


def _case_index_through_linked_folder(p: Path, small_llama: Path) -> Path:
    folder = Path(shutil.copytree(small_llama, p / "m"))
    outside = p / "elsewhere"
    outside.mkdir()
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    shard.rename(outside / shard.name)
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = {k: (f"sub/{v}" if v == shard.name else v) for k, v in doc["weight_map"].items()}
    index.write_text(json.dumps(doc))
    return folder


CASES = {
    "truncated file": (_case_truncated, "truncated"),
    "header length beyond the file": (_case_header_beyond_file, "runs past the end"),
    "invalid JSON": (_case_invalid_json, "not valid UTF-8 JSON"),
    "offsets out of range": (_case_offsets_out_of_range, "out of range"),
    "overlapping offsets": (_case_overlapping, "overlap"),
    "unknown dtype": (_case_unknown_dtype, "unknown dtype 'F12'"),
    "empty folder": (_case_empty_folder, "no .safetensors, pytorch_model*.bin or single .gguf weights found"),
    "index naming a missing shard": (_case_index_missing_shard, "is missing"),
    "index path leaving the folder": (_case_index_escapes, "leaves the model folder"),
    "index path through a linked folder": (_case_index_through_linked_folder, "leaves the model folder"),
    "nonexistent path": (lambda p: p / "does" / "not" / "exist", "no such file or folder"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, tmp_path, small_llama):
    make, expected = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    target = make(work, small_llama) if "index" in case else make(work)
    db = tmp_path / "db"
    out = run_cli("fit", str(target), "--db", str(db))
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    assert expected in lines[0]
    assert "Traceback" not in out.stderr + out.stdout
    assert not db.exists() or not any(db.rglob("*")), "nothing may be written for bad input"


@pytest.mark.parametrize("name", ["nothere.safetensors", "model.gguf", "pytorch_model.bin", "org/w.safetensors@main"])
def test_a_missing_file_named_like_weights_is_a_path_error_at_once_not_a_hub_lookup(name, tmp_path):
    """A name ending like a weights file is a mistyped path: exit 2 at once, the nearest name offered, the Hub
    never asked (HF_ENDPOINT points nowhere: a lookup would fail with exit 3 after its deadline)."""
    (tmp_path / "nothere.safetensor").write_bytes(b"")
    out = run_cli("fit", name, env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and f"{name}: no such file" in out.stderr, out.stderr
    if name == "nothere.safetensors":
        assert "did you mean nothere.safetensor?" in out.stderr


def test_usage_errors_exit_2(tmp_path):
    assert run_cli("fit").returncode == 2
    assert run_cli("fit", str(tmp_path), "--trim", "mid70").returncode == 2
    assert run_cli("fit", str(tmp_path), "--device", "tpu").returncode == 2
    assert run_cli("nonsense").returncode == 2


def test_version():
    out = run_cli("version")
    assert out.returncode == 0
    assert out.stdout.startswith("weightdiag ")


def test_version_flag_via_the_console_script_the_module_and_the_app():
    from weightdiag import __version__

    expected = f"weightdiag {__version__}\n"
    script = Path(sys.executable).parent / "weightdiag"
    if not script.exists():
        pytest.skip("no weightdiag console script beside this interpreter (not installed with pip)")
    for command in ([str(script), "--version"], [str(script), "-V"], [sys.executable, "-m", "weightdiag", "--version"]):
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout, out.stderr) == (0, expected, ""), command
    # The Typer app's eager option (reached when weightdiag.cli.main is called directly) says the same.
    out = run_cli("--help")
    assert out.returncode == 0
    assert "--version" in out.stdout
    code = "from weightdiag.cli import main\nmain(['--version'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, expected), out.stderr


def test_version_flag_imports_nothing_heavy():
    code = (
        "import sys\nfrom weightdiag.__main__ import main\nmain(['--version'])\n"
        "print(sorted(m for m in ('typer', 'rich', 'numpy', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "[]", out.stdout + out.stderr


def test_a_cpu_fit_of_safetensors_imports_neither_torch_nor_scipy(tmp_path):
    model = _valid(tmp_path)
    code = (
        "import sys\nfrom weightdiag.cli import main\n"
        "try:\n"
        f"    main(['fit', {str(model)!r}, '--no-save', '-q', '--json', '--device', 'cpu'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "sys.stderr.write(repr(sorted(m for m in ('torch', 'scipy') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.endswith("[]"), out.stderr


def test_connections_is_range_checked_and_passed_on(tmp_path):
    model = _valid(tmp_path)
    for command in ("fit", "report"):
        out = run_cli(command, str(model), "--no-save", "-q", "--connections", "0")
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2, out.stderr
        assert len(lines) == 1, out.stderr
        assert "--connections 0" in lines[0], out.stderr
    out = run_cli("fit", str(model), "--no-save", "-q", "--json", "--connections", "3")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema"] == "weightdiag.row/1"


def test_an_unwritable_database_fails_before_fitting(tmp_path):
    model = _valid(tmp_path)
    blocker = tmp_path / "db-is-a-file"
    blocker.write_text("")
    out = run_cli("fit", str(model), "--db", str(blocker))
    assert out.returncode == 2
    assert "is not a folder" in out.stderr
    assert "--no-save" in out.stderr


def test_a_read_only_database_folder_fails_before_fitting(tmp_path):
    model = _valid(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        out = run_cli("fit", str(model), "--db", str(locked / "db"))
        assert out.returncode == 2
        assert "is not writable" in out.stderr
        assert run_cli("fit", str(model), "--db", str(locked / "db"), "--no-save").returncode == 0
    finally:
        locked.chmod(0o700)


def test_a_damaged_row_is_skipped_by_listing_and_refused_when_named(minilm_dir, tmp_path):
    db = tmp_path / "db"
    assert run_cli("fit", str(minilm_dir), "--db", str(db), "-q", "--device", "cpu").returncode == 0
    bad = db / "rows" / "broken.json"
    bad.write_text(json.dumps({"schema": "weightdiag.row/1", "model": {"id": 3}}))
    listing = run_cli("db", "list", "--db", str(db))
    assert listing.returncode == 0
    assert "Traceback" not in listing.stderr
    out = run_cli("compare", str(bad), "--db", str(db))
    assert out.returncode == 2
    assert "damaged" in out.stderr


def test_model_names_that_look_like_markup_are_printed_as_they_are(tmp_path):
    model = _valid(tmp_path)
    out = run_cli("fit", str(model), "--name", "run[/bold][red]x", "--db", str(tmp_path / "db"))
    assert out.returncode == 0, out.stderr
    assert "run[/bold][red]x" in out.stdout


def test_permission_denied_is_bad_input_not_a_bug(tmp_path, monkeypatch, capsys):
    from weightdiag import cli
    from weightdiag.source import local

    model = _valid(tmp_path)

    def denied(path, where):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(local, "read_file_header", denied)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", str(model), "--no-save", "-q"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "permission denied" in err
    assert str(model) in err
    assert "Traceback" not in err


def test_rows_are_written_with_the_usual_file_permissions(tmp_path):
    from weightdiag.database.store import write_text_atomic

    mask = os.umask(0o022)
    os.umask(mask)
    target = tmp_path / "rows" / "x.json"
    write_text_atomic(target, "{}")
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


# --- the terminal: a broken pipe, a real 80-column terminal (tmux) ----------------------------------------

LONG_ID = "an-organisation/a-rather-long-model-name-v2"


def _tiny_model(folder: Path) -> Path:
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=128, seed=5)
    return synthetic.write_model(folder, spec)


def _cli_env(**extra: str) -> dict[str, str]:
    """The environment of a real run: no COLUMNS (a terminal gives its own width), no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "WEIGHTDIAG_DB")}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


def _run_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """A real `weightdiag ARGS | head -0`: stdout's reader is gone before weightdiag writes a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the first write meets EPIPE
    try:
        return subprocess.run(
            [sys.executable, "-W", "error::RuntimeWarning", "-m", "weightdiag", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=_cli_env(),
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [("db", "list"), ("db", "export"), ("db", "list", "--json")])
def test_a_closed_pipe_ends_quietly_with_exit_0(args, tmp_path):
    """`weightdiag db list | head -1`: the reader goes away; exit 0 (1 means a regression), no traceback."""
    done = _run_into_a_closed_pipe(*args, "--db", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def _wrapped_table_lines(text: str) -> list[str]:
    """Table lines the terminal wrapped (a border line that does not end with its border)."""
    ends = {"┏": "┓", "┃": "┃", "┡": "┩", "│": "│", "└": "┘"}
    return [line for line in text.splitlines() if line[:1] in ends and not line.rstrip().endswith(ends[line[0]])]


def test_a_tmux_capture_at_80_columns(tmp_path):
    """The terminal look, in a real 80x40 terminal: `fit` and `db list` as a user sees them."""
    import time

    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed")
    model = _tiny_model(tmp_path / "model")
    db = tmp_path / "db"
    seeded = run_cli("fit", str(model), "--name", LONG_ID, "--db", str(db), "--device", "cpu", "-q")
    assert seeded.returncode == 0, seeded.stderr  # a row with a long id for `db list`
    done = tmp_path / "done"
    weightdiag = f"{sys.executable} -W error::RuntimeWarning -m weightdiag"
    script = tmp_path / "session.sh"
    script.write_text(
        f"{weightdiag} fit '{model}' --no-save --name '{LONG_ID}' --device cpu\n"
        f"{weightdiag} db list\n"
        f"touch '{done}'\n"
        "sleep 120\n"
    )
    socket = tmp_path / "tmux.sock"
    base = [tmux, "-S", str(socket), "-f", os.devnull]
    env = _cli_env(WEIGHTDIAG_DB=str(db))
    subprocess.run([*base, "new-session", "-d", "-x", "80", "-y", "40", f"sh '{script}'"], env=env, check=True)
    try:
        for _ in range(1200):  # at most a minute: a safety net, not a timing assertion
            if done.exists():
                break
            time.sleep(0.05)
        assert done.exists(), "the tmux session did not finish"
        captured = subprocess.run(
            [*base, "capture-pane", "-p", "-S", "-"], env=env, check=True, capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run([*base, "kill-server"], env=env, capture_output=True)
    assert "Traceback" not in captured, captured
    assert "…" not in captured, captured
    assert max(len(line) for line in captured.splitlines()) <= 80, captured
    assert not _wrapped_table_lines(captured), captured  # no table line wider than the terminal
    assert f"│ {LONG_ID} │" in captured, captured  # the id whole in its cell, as `db show` takes it
    assert "median" in captured  # the fit's table
    assert "llama-3-8b" in captured


def test_the_readme_compare_example_is_a_real_run(minilm_dir, tmp_path):
    """README's `compare` example is what `weightdiag compare` prints on MiniLM (to a file: full width)."""
    from .docs_text import section as docs_section

    section = docs_section("Comparing with the paper's cohort: `compare`")
    start = section.index("```\n") + 4
    example = section[start : section.index("\n```", start)]
    out = run_cli("compare", str(minilm_dir), "--db", str(tmp_path / "db"), "-q", env={"COLUMNS": "100000"})
    assert out.returncode == 0, out.stderr
    printed = "\n".join(line.rstrip() for line in out.stdout.strip("\n").splitlines())
    assert printed == example.strip("\n"), printed


@pytest.mark.parametrize(("moved", "code"), [(False, 0), (True, 1)])
def test_check_keeps_its_verdict_when_the_pipe_closes(tmp_path, moved, code):
    """`weightdiag check ... | head -1` in CI: the reader leaves early, but a regression still exits 1."""
    import copy

    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    row = api.fit(str(_tiny_model(tmp_path / "model")), FitOptions(device="cpu"), save=False).row
    base = tmp_path / "base.json"
    base.write_text(json.dumps(row))
    checked = copy.deepcopy(row)
    if moved:
        checked["matrices"][0]["fits"]["mid80"]["k"] += 0.05
    current = tmp_path / "current.json"
    current.write_text(json.dumps(checked))
    done = _run_into_a_closed_pipe("check", str(current), "--baseline", str(base), "--show-passing")
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
