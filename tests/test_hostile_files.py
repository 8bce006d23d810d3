"""Issue 13, files and folders: hostile or careless input ends in one line and exit code 2 (never 1).

One test per class (deeply nested JSON, absurd config numbers, non-UTF-8 refs, a secret linked in as a
shard, unwritable outputs, a bad WEIGHTDIAG_THREADS, rich emoji codes in paths and names), then bounded
property-based fuzzing of the safetensors header parser, the GGUF reader and a CLI-level sample.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightdiag.errors import BadInputError, CheckpointFormatError
from weightdiag.layout import arch_from_config
from weightdiag.source.gguf import open_gguf, parse_gguf_bytes
from weightdiag.source.local import open_local
from weightdiag.source.safetensors_header import parse_file_bytes
from weightdiag.testing import synthetic

from .conftest import load_json, row_files, run_cli

DEEP = b"[" * 200_000 + b"]" * 200_000  # far past json's C-scanner recursion limit


def _one_error_line(out: Any) -> str:
    """The single `error: ...` line of a bad-input run (exit 2), with no traceback anywhere."""
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert "Traceback" not in out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    return lines[0]


def _tiny_model(folder: Path) -> Path:
    spec = synthetic.ModelSpec(n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=64, seed=5)
    return synthetic.write_model(folder, spec)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")


def _copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


# --- 1. deeply nested JSON ----------------------------------------------------------------------


@pytest.mark.e2e
def test_deeply_nested_json_is_bad_input(tmp_path: Path, small_llama: Path, tiny: Path) -> None:
    index = _copy(small_llama, tmp_path / "index")
    (index / "model.safetensors.index.json").write_bytes(DEEP)
    config = _copy(tiny, tmp_path / "config")
    (config / "config.json").write_bytes(b'{"a": ' + DEEP + b"}")
    binfolder = tmp_path / "bin"
    binfolder.mkdir()
    (binfolder / "pytorch_model.bin").write_bytes(b"")
    (binfolder / "pytorch_model.bin.index.json").write_bytes(b'{"weight_map": ' + DEEP + b"}")
    for folder in (index, config, binfolder):
        with pytest.raises(CheckpointFormatError, match="nested too deeply"):
            open_local(folder)
    line = _one_error_line(run_cli("fit", str(config), "--db", str(tmp_path / "db")))
    assert "config.json: not valid JSON (nested too deeply)" in line


# --- 2. config numbers that cannot be counts ------------------------------------------------------


@pytest.mark.parametrize("value", [1e308, float("inf"), float("nan"), 10**30, -64, 2.5])
def test_absurd_config_counts_are_ignored_with_a_note(value: float) -> None:
    notes: list[str] = []
    info = arch_from_config({"hidden_size": value, "num_attention_heads": 4, "model_type": "llama"}, notes)
    assert info.d_model is None
    assert info.head_dim is None
    assert len(notes) == 1
    assert notes[0].startswith("config hidden_size=")
    assert "ignored" in notes[0]
    assert len(notes[0]) < 120  # 10**30 or 1e308 are abbreviated, not spelled out


@pytest.mark.parametrize("ratio", [1e308, float("inf"), -1.0])
def test_absurd_mlp_ratio_is_ignored_with_a_note(ratio: float) -> None:
    notes: list[str] = []
    info = arch_from_config({"hidden_size": 64, "mlp_ratio": ratio}, notes)  # 1e308 * 64 = inf: int() overflowed
    assert info.ffn_size is None
    assert info.d_model == 64
    assert notes == [f"config mlp_ratio={ratio:.6g} ignored: not a ratio between 0 and 1000"]
    assert arch_from_config({"hidden_size": 64, "mlp_ratio": 4}).ffn_size == 256  # sane ratios still count


@pytest.mark.e2e
def test_config_with_infinity_and_1e308_fits_and_says_what_it_ignored(tmp_path: Path, tiny: Path) -> None:
    folder = _copy(tiny, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    del config["intermediate_size"]
    text = json.dumps(config)[:-1] + ', "mlp_ratio": Infinity, "vocab_size": 1e308}'
    (folder / "config.json").write_text(text.replace(f'"vocab_size": {config["vocab_size"]}, ', ""))
    db = tmp_path / "db"
    out = run_cli("fit", str(folder), "--db", str(db), "-q")
    assert out.returncode == 0, out.stderr
    (row_path,) = row_files(db)
    notes = load_json(row_path)["notes"]
    assert any("mlp_ratio=inf ignored" in n for n in notes), notes
    assert any("vocab_size=1e+308 ignored" in n for n in notes), notes


# --- 3. HF cache refs that are not text ------------------------------------------------------------


def _hf_cache(tmp_path: Path, model: Path) -> tuple[Path, Path]:
    repo = tmp_path / "hub" / "models--acme--tiny"
    commit = "c" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    for src in model.iterdir():
        blob = repo / "blobs" / hashlib.sha256(src.read_bytes()).hexdigest()
        shutil.copy(src, blob)
        os.symlink(os.path.relpath(blob, snap), snap / src.name)
    return repo, snap


@pytest.mark.e2e
def test_non_utf8_refs_are_bad_input(tmp_path: Path, tiny: Path) -> None:
    repo, snap = _hf_cache(tmp_path, tiny)
    (repo / "refs" / "main").write_bytes(b"\xff\xfe\x80" + b"c" * 40)
    with pytest.raises(BadInputError, match="not a commit id"):
        open_local(repo)
    (repo / "refs" / "main").write_bytes(b"c" * 40)
    (repo / "refs" / "a-branch").write_bytes(b"\xc3\x28 garbage")  # read (before main) to name a snapshot's ref
    with pytest.raises(BadInputError, match="not a commit id"):
        open_local(snap)
    (repo / "refs" / "main").write_bytes(b"\xff" * 64)
    assert "refs/main: not a commit id" in _one_error_line(run_cli("fit", str(repo), "--db", str(tmp_path / "db")))


# --- 4. a secret linked in as a shard: its bytes never reach a message ------------------------------

SECRET = b"TOPSECRET-password=hunter2-" * 40


@pytest.mark.e2e
def test_linked_secret_is_not_a_safetensors_file_and_is_not_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(secret)
    line = _one_error_line(run_cli("fit", str(folder), "--db", str(tmp_path / "db")))
    assert "not a safetensors file" in line
    n = struct.unpack("<Q", SECRET[:8])[0]
    assert "TOPS" not in line
    assert str(n) not in line
    assert "hunter" not in line
    # The same bytes as a short file (N fits the cap but not the file), and as a GGUF file.
    for blob in (struct.pack("<Q", 5000) + b"TOPSECRET", SECRET):
        with pytest.raises(CheckpointFormatError) as err:
            parse_file_bytes(blob)
        assert "not a safetensors file" in str(err.value)
        assert "TOPS" not in str(err.value)
        assert "5000" not in str(err.value)
    with pytest.raises(CheckpointFormatError) as err:
        parse_gguf_bytes(SECRET)
    assert "TOPS" not in str(err.value)
    assert "not a GGUF file" in str(err.value)
    # A header that is not UTF-8: say where, not which byte.
    with pytest.raises(CheckpointFormatError) as err:
        parse_file_bytes(struct.pack("<Q", 8) + b'{"\xa7\xa7": 1}')
    assert "xa7" not in str(err.value)
    assert "header byte 2" in str(err.value)


# --- 5. outputs that cannot be written, a bad WEIGHTDIAG_THREADS --------------------------------------


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> tuple[Path, Path]:
    db = tmp_path_factory.mktemp("fitted") / "db"
    out = run_cli("fit", str(tiny), "--db", str(db), "-q")
    assert out.returncode == 0, out.stderr
    (row,) = row_files(db)
    return db, row


@pytest.mark.e2e
def test_unwritable_outputs_are_bad_input(tmp_path: Path, tiny: Path, fitted: tuple[Path, Path]) -> None:
    db, row = fitted
    assert "is a folder" in _one_error_line(run_cli("db", "export", "--output", str(tmp_path), "--db", str(db)))
    assert "cannot write it" in _one_error_line(run_cli("db", "export", "--output", "/proc/x.csv", "--db", str(db)))
    check = ("check", str(row), "--baseline", str(row), "--db", str(db))
    assert "is a folder" in _one_error_line(run_cli(*check, "--junit", str(tmp_path)))
    assert "cannot write it" in _one_error_line(run_cli(*check, "--junit", "/proc/x/junit.xml"))
    assert not list(tmp_path.iterdir())


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["abc", "0", "-3", "1e3", "100000"])
def test_bad_weightdiag_threads_is_bad_input(tmp_path: Path, tiny: Path, value: str) -> None:
    db = tmp_path / "db"
    line = _one_error_line(run_cli("fit", str(tiny), "--db", str(db), env={"WEIGHTDIAG_THREADS": value}))
    assert line.startswith(f"error: WEIGHTDIAG_THREADS={value!r}")
    assert not db.exists()


def test_weightdiag_threads_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightdiag import kernels

    monkeypatch.setenv("WEIGHTDIAG_THREADS", "3")
    assert kernels.threads() == 3
    monkeypatch.setenv("WEIGHTDIAG_THREADS", "three")
    with pytest.raises(BadInputError, match="WEIGHTDIAG_THREADS"):
        kernels.threads()


# --- 6. rich emoji codes in paths and names are printed literally -------------------------------------


@pytest.mark.e2e
def test_emoji_codes_in_paths_and_names_are_printed_literally(tmp_path: Path, tiny: Path) -> None:
    folder = _copy(tiny, tmp_path / "p:fire:q")
    db = tmp_path / "db:smile:"
    fit = run_cli("fit", str(folder), "--db", str(db), "--name", "team/n:fire:x")
    assert fit.returncode == 0, fit.stderr
    outputs = [fit]
    for args in (
        ("compare", str(folder)),  # fitted again under the folder's name, p:fire:q
        ("report", str(folder)),
        ("db", "list", "--fitted"),
        ("db", "show", "team/n:fire:x"),
    ):
        out = run_cli(*args, "--db", str(db))
        assert out.returncode == 0, (args, out.stderr)
        assert ("p:fire:q" if args[0] in ("compare", "report") else "n:fire:x") in out.stdout, (args, out.stdout)
        outputs.append(out)
    missing = run_cli("fit", str(tmp_path / "no:thumbs_up:such"), "--db", str(db))
    assert "no:thumbs_up:such" in _one_error_line(missing)
    for out in (*outputs, missing):
        assert "\N{FIRE}" not in out.stdout + out.stderr
        assert "\N{SMILING FACE WITH OPEN MOUTH}" not in out.stderr
        assert "\N{THUMBS UP SIGN}" not in out.stderr


def test_progress_bar_prints_the_model_id_literally() -> None:
    from rich.console import Console

    from weightdiag.render.tables import FitProgress

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, emoji=True)  # even where emoji are on
    progress = FitProgress(console)
    progress.started("org/a:fire:[red]b", 1, 10)
    progress.close()
    text = buffer.getvalue()
    assert "a:fire:[red]b" in text
    assert "\N{FIRE}" not in text


# --- 7. property-based fuzzing -------------------------------------------------------------------


def _no_leak(message: str) -> None:
    assert "\n" not in message
    assert "Traceback" not in message


def _parse_header_ok(blob: bytes) -> None:
    """parse_file_bytes succeeds or raises a one-line CheckpointFormatError; nothing else escapes."""
    try:
        parse_file_bytes(blob)
    except BadInputError as exc:
        _no_leak(str(exc))


_TENSOR_NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=6)
_DTYPES = st.sampled_from(["F32", "BF16", "F16", "I8", "U8", "F64", "BOOL", "F8_E4M3", "Q4_K", "", "f32"])
_SHAPES = st.lists(st.integers(0, 5), max_size=3)


def _valid_header(entries: list[tuple[str, str, tuple[int, ...]]]) -> bytes:
    known = [(n, d, s) for n, d, s in entries if d in synthetic.ELEMENT_BYTES]
    head = synthetic.header_bytes(known)
    return head + bytes(sum(int(np.prod(s)) * synthetic.ELEMENT_BYTES[d] for _, d, s in known))


@st.composite
def _mutated_headers(draw: st.DrawFn) -> bytes:
    """A valid file, then one structured mutation of its prefix, JSON text or data size."""
    entries = draw(
        st.lists(st.tuples(_TENSOR_NAMES, _DTYPES, _SHAPES.map(tuple)), max_size=4, unique_by=lambda e: e[0])
    )
    blob = _valid_header(entries)
    n = struct.unpack("<Q", blob[:8])[0]
    text = blob[8 : 8 + n].decode()
    data = blob[8 + n :]
    kind = draw(st.sampled_from(["length", "offsets", "dtype", "shape", "duplicate", "huge", "nested", "data", "raw"]))
    if kind == "length":
        n = draw(
            st.sampled_from([0, 1, 2, n - 1, n + 1, 2**63, 2**64 - 1, 100 * 1024 * 1024 + 1])
            | st.integers(0, 2**64 - 1)
        )
        return struct.pack("<Q", max(0, n)) + text.encode() + data
    doc = json.loads(text)
    names = [k for k in doc if k != "__metadata__"]
    if kind in ("offsets", "dtype", "shape") and names:
        name = draw(st.sampled_from(names))
        value = draw(
            st.one_of(
                st.integers(-(2**70), 2**70),
                st.floats(),
                st.lists(st.integers(-(2**70), 2**70) | st.floats() | st.none(), max_size=4),
                st.text(max_size=4),
                st.none(),
            )
        )
        doc[name][{"offsets": "data_offsets"}.get(kind, kind)] = value
    new = json.dumps(doc, allow_nan=True)
    if kind == "duplicate" and names:
        new = new[:-1] + f", {json.dumps(names[0])}: {json.dumps(doc[names[0]])}}}"
    elif kind == "huge":
        new = (
            new[:-1]
            + ', "h": {"dtype": "F32", "shape": ['
            + "9" * draw(st.sampled_from([30, 400, 5000]))
            + '], "data_offsets": [0, 1e999]}}'
        )
    elif kind == "nested":
        depth = draw(st.sampled_from([10, 900, 5000, 100_000]))
        new = new[:-1] + ', "n": ' + "[" * depth + "]" * depth + "}"
    elif kind == "data":
        data = data[: draw(st.integers(0, len(data)))] + bytes(draw(st.integers(0, 9)))
    elif kind == "raw":
        raw = bytearray(new.encode())
        for _ in range(draw(st.integers(1, 4))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return struct.pack("<Q", len(raw)) + bytes(raw) + data
    raw = new.encode()
    return struct.pack("<Q", len(raw)) + raw + data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_fuzz_header_arbitrary_bytes(blob: bytes) -> None:
    _parse_header_ok(blob)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_mutated_headers())
def test_fuzz_header_structured_mutations(blob: bytes) -> None:
    _parse_header_ok(blob)


@cache
def _valid_gguf() -> bytes:
    """A small valid GGUF (F32 and F16 tensors, Llama metadata) written by the `gguf` package."""
    gguf = pytest.importorskip("gguf")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_name("fuzz base")
        writer.add_block_count(1)
        writer.add_embedding_length(32)
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
        writer.add_feed_forward_length(64)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_token_list([f"t{i}" for i in range(16)])
        rng = np.random.default_rng(0)
        writer.add_tensor("token_embd.weight", rng.standard_normal((16, 32)).astype(np.float32))
        writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((32, 32)).astype(np.float16))
        writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


def _open_gguf_ok(blob: bytes) -> None:
    """open_gguf and reading every tensor succeed or raise a one-line BadInputError; nothing else escapes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(blob)
        try:
            plan, reader = open_gguf(path)
            try:
                for ref in plan.tensors:
                    reader.read_into(ref, np.empty(ref.nbytes, np.uint8))
            finally:
                reader.close()
        except BadInputError as exc:
            _no_leak(str(exc))


def test_the_gguf_fuzz_base_is_valid() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(_valid_gguf())
        plan, reader = open_gguf(path)
        reader.close()
    assert {t.name for t in plan.tensors} >= {"token_embd.weight", "blk.0.attn_q.weight"}


@st.composite
def _mutated_gguf(draw: st.DrawFn) -> bytes:
    blob = bytearray(_valid_gguf())
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "u64"]))
        at = draw(st.integers(0, len(blob) - 1))
        if op == "flip":
            blob[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            blob[at] = draw(st.integers(0, 255))
        elif op == "insert":
            blob[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del blob[at : at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del blob[at:]
        else:  # a length, count, dimension or offset replaced by an extreme value
            blob[at : at + 8] = struct.pack("<Q", draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1])))
        if not blob:
            break
    return bytes(blob)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_gguf())
def test_fuzz_gguf_mutations(blob: bytes) -> None:
    _open_gguf_ok(blob)


@cache
def _cli_base() -> bytes:
    rng = np.random.default_rng(1)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": ("BF16", rng.standard_normal((16, 16)).astype(np.float32)),
        "model.layers.0.mlp.down_proj.weight": ("F32", rng.standard_normal((16, 24)).astype(np.float32)),
    }
    entries = [(name, dtype, tuple(arr.shape)) for name, (dtype, arr) in tensors.items()]
    return synthetic.header_bytes(entries) + b"".join(synthetic.encode(a, d) for d, a in tensors.values())


@pytest.mark.e2e
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["safetensors", "gguf"]), st.data())
def test_fuzz_cli_sample(kind: str, data: st.DataObject) -> None:
    """Mutated files through the real CLI: exit 0 or 2, and a 2 is one line without a traceback."""
    if kind == "gguf":
        blob, name = data.draw(_mutated_gguf()), "m.gguf"
    else:
        base = bytearray(_cli_base())
        for _ in range(data.draw(st.integers(1, 3))):
            base[data.draw(st.integers(0, len(base) - 1))] = data.draw(st.integers(0, 255))
        blob, name = bytes(base[: data.draw(st.integers(0, len(base)))]), "model.safetensors"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(blob)
        out = run_cli("fit", str(path), "--db", str(Path(tmp) / "db"), "-q", "--json")
    assert out.returncode in (0, 2), (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stdout + out.stderr
    if out.returncode == 2:
        _one_error_line(out)
