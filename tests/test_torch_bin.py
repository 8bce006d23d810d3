""".bin checkpoints: read through the restricted unpickler only, real and synthetic."""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightdiag.api import fit_path
from weightdiag.errors import BadInputError, CheckpointFormatError
from weightdiag.fit.stats import Summary
from weightdiag.reduce.reduction import reduce_array
from weightdiag.run.measure import FitOptions
from weightdiag.source.local import open_local

from .conftest import run_cli


def test_antiberty_real_bin_checkpoint(antiberty_bin):
    row = fit_path(str(antiberty_bin), FitOptions(device="cpu"))
    assert row["model"]["format"] == "torch"
    assert "weights_only=True" in row["notes"][0]
    kinds = row["kinds"]
    for kind in ("q", "k", "v", "o", "ffn_in", "ffn_out"):
        assert kinds[kind]["count"] == 8  # AntiBERTy: BERT, 8 layers
    assert row["architecture"]["norm_placement"] == "post"
    assert row["skipped"][0]["reason"] == "non-float dtype I64"


def test_bin_values_are_read_exactly(tmp_path):
    rng = np.random.default_rng(0)
    state = {
        "model.layers.0.mlp.down_proj.weight": torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32)),
        "model.layers.0.mlp.up_proj.weight": torch.from_numpy(rng.standard_normal((96, 64))).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(64, dtype=torch.float16),
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    plan, reader = open_local(tmp_path)
    for ref in plan.tensors:
        raw = np.empty(ref.nbytes, dtype=np.uint8)
        reader.read_into(ref, raw)
        t = state[ref.name]
        expected = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().view(np.uint8).reshape(-1)
        assert np.array_equal(raw, expected), ref.name
    reader.close()
    row = fit_path(str(tmp_path), FitOptions(device="cpu"))
    up = next(m for m in row["matrices"] if m["kind"] == "up")
    bits = state["model.layers.0.mlp.up_proj.weight"].view(torch.int16).numpy().view(np.uint16).reshape(-1)
    assert up["fits"]["mid80"]["k"] == pytest.approx(Summary(reduce_array(bits, "BF16")).fit("hist1024", "mid80").k)


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.e2e
def test_a_pickle_that_builds_objects_is_refused(tmp_path, capsys):
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        torch.save({"w": torch.zeros(4, 4), "evil": _Evil()}, f)
    with pytest.raises(CheckpointFormatError, match="restricted unpickler"):
        open_local(tmp_path)
    assert "must never run" not in capsys.readouterr().out
    out = run_cli("fit", str(tmp_path), "--no-save")
    assert out.returncode == 2
    assert "restricted unpickler" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_corrupt_bin_is_a_format_error(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps([1, 2, 3])[:5])
    with pytest.raises(CheckpointFormatError, match="not a readable torch checkpoint"):
        open_local(tmp_path)


def test_a_legacy_non_zip_bin_is_read_without_mapping(tmp_path):
    w = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    torch.save({"layers.0.mlp.up_proj.weight": w}, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    plan, reader = open_local(tmp_path)
    out = np.empty(plan.tensors[0].nbytes, dtype=np.uint8)
    reader.read_into(plan.tensors[0], out)
    assert np.array_equal(out.view(np.float32).reshape(16, 8), w.numpy())


def test_a_bin_index_with_a_bad_weight_map_is_a_format_error(tmp_path):
    torch.save({"a.weight": torch.zeros(2, 2)}, tmp_path / "pytorch_model-1.bin")
    (tmp_path / "pytorch_model.bin.index.json").write_text('{"weight_map": {"a.weight": 3}}')
    with pytest.raises(CheckpointFormatError, match="no valid weight_map"):
        open_local(tmp_path)


# --- hostile and malformed files (issue 13) -------------------------------------------------------------------


def _save(state: dict, path: Path, legacy: bool) -> Path:
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    return path


def _patch_pickle(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first `old` in the checkpoint's pickle (rewriting data.pkl inside a zip checkpoint)."""
    data = path.read_bytes()
    if not data.startswith(b"PK"):
        assert old in data
        path.write_bytes(data.replace(old, new, 1))
        return
    with zipfile.ZipFile(path) as z:
        entries = [(info.filename, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, content in entries:
            if name.endswith("/data.pkl"):
                assert old in content
                content = content.replace(old, new, 1)
            z.writestr(name, content)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


FORMATS = pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])


@pytest.mark.e2e
@FORMATS
def test_an_os_system_payload_never_runs(tmp_path, legacy):
    marker = tmp_path / "MARKER"
    model = tmp_path / "model"
    model.mkdir()
    bin_path = _save({"w": torch.zeros(2, 2), "x": _Payload(marker)}, model / "pytorch_model.bin", legacy)
    with pytest.raises(CheckpointFormatError, match="restricted unpickler"):
        open_local(model)
    out = run_cli("fit", str(model), "--no-save")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not marker.exists()
    torch.load(bin_path, weights_only=False)  # the payload is live: an unrestricted load runs it
    assert marker.exists()


@FORMATS
def test_float8_and_uint16_tensors_are_read_or_skipped(tmp_path, legacy):
    # Legacy files save these dtypes as untyped storages, which torch.load's own legacy path cannot read.
    w8 = torch.randn(32, 16, generator=torch.Generator().manual_seed(1)).to(torch.float8_e5m2)
    state = {
        "model.layers.0.mlp.up_proj.weight": w8,
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 32).to(torch.float8_e4m3fn),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16),
        "u16": torch.arange(6).to(torch.uint16),
        "c128": torch.zeros(3, dtype=torch.complex128),
    }
    _save(state, tmp_path / "pytorch_model.bin", legacy)
    plan, reader = open_local(tmp_path)
    ref = next(r for r in plan.tensors if r.name == "model.layers.0.mlp.up_proj.weight")
    raw = np.empty(ref.nbytes, dtype=np.uint8)
    reader.read_into(ref, raw)
    assert np.array_equal(raw, w8.view(torch.uint8).numpy().reshape(-1))
    row = fit_path(str(tmp_path), FitOptions(device="cpu"))
    assert {m["kind"] for m in row["matrices"]} == {"up", "down", "q"}
    reasons = {s["name"]: s["reason"] for s in row["skipped"]}
    assert reasons == {"u16": "non-float dtype U16", "c128": "unsupported tensor type TORCH_COMPLEX128"}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: quantized tensors deprecated, nested a prototype
@FORMATS
def test_sparse_quantized_and_nested_tensors_are_skipped_with_a_reason(tmp_path, legacy):
    state = {
        "model.layers.0.mlp.up_proj.weight": torch.eye(4).to_sparse(),
        "model.layers.0.mlp.gate_proj.weight": torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8),
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 8),
    }
    if not legacy:  # torch cannot rebuild a nested tensor from a legacy file
        state["extra.nested"] = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
    _save(state, tmp_path / "pytorch_model.bin", legacy)
    row = fit_path(str(tmp_path), FitOptions(device="cpu"))
    assert [m["kind"] for m in row["matrices"]] == ["down"]
    reasons = {s["name"]: s["reason"] for s in row["skipped"]}
    assert reasons["model.layers.0.mlp.up_proj.weight"] == "unsupported tensor type TORCH_SPARSE_COO"
    assert reasons["model.layers.0.mlp.gate_proj.weight"] == "unsupported tensor type TORCH_QINT8"
    assert reasons.get("extra.nested", "unsupported tensor type TORCH_NESTED") == "unsupported tensor type TORCH_NESTED"


VIEWS = {
    "expand": lambda: torch.zeros(1).expand(1 << 20, 1 << 20),  # 4 TiB if it were materialised
    "overlap": lambda: torch.zeros(100).as_strided((1 << 20, 50), (0, 1)),
    "diagonal-overlap": lambda: torch.zeros(100).as_strided((50, 50), (1, 1)),
}


@FORMATS
@pytest.mark.parametrize("view", list(VIEWS))
def test_broadcast_and_overlapping_views_are_refused_without_expanding(tmp_path, legacy, view):
    _save({"model.layers.0.mlp.up_proj.weight": VIEWS[view]()}, tmp_path / "pytorch_model.bin", legacy)
    assert (tmp_path / "pytorch_model.bin").stat().st_size < 3000
    with pytest.raises(CheckpointFormatError, match=r"broadcast or overlapping view .*\.contiguous\(\)"):
        open_local(tmp_path)


@pytest.mark.e2e
def test_a_broadcast_view_is_one_line_exit_2(tmp_path):
    _save({"w": torch.zeros(1).expand(16384, 16384)}, tmp_path / "pytorch_model.bin", legacy=False)
    out = run_cli("fit", str(tmp_path), "--no-save")
    assert out.returncode == 2
    assert "broadcast or overlapping view" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@FORMATS
def test_strided_views_and_shared_storages_are_read_exactly(tmp_path, legacy):
    base = torch.randn(12, 10, generator=torch.Generator().manual_seed(2))
    emb = torch.randn(20, 8)
    state = {
        "model.layers.0.mlp.up_proj.weight": base.t(),
        "model.layers.0.mlp.down_proj.weight": base[2:9, 1:7],
        "model.embed_tokens.weight": emb,
        "lm_head.weight": emb,  # tied: one storage, two tensors
    }
    _save(state, tmp_path / "pytorch_model.bin", legacy)
    plan, reader = open_local(tmp_path)
    assert len(plan.tensors) == 4
    for ref in plan.tensors:
        raw = np.empty(ref.nbytes, dtype=np.uint8)
        reader.read_into(ref, raw)
        assert np.array_equal(raw.view(np.float32).reshape(ref.shape), state[ref.name].numpy()), ref.name


@FORMATS
def test_a_tensor_reaching_past_its_storage_is_refused(tmp_path, legacy):
    path = _save({"w": torch.zeros(4, 4)}, tmp_path / "pytorch_model.bin", legacy)
    _patch_pickle(path, b"K\x04K\x04\x86", b"K\x28K\x04\x86")  # shape (4, 4) -> (40, 4) over 16 elements
    with pytest.raises(CheckpointFormatError, match="reaches past the end of its storage"):
        open_local(tmp_path)


def test_a_legacy_storage_larger_than_the_file_is_refused_before_allocating(tmp_path):
    path = _save({"w": torch.zeros(16, 16)}, tmp_path / "pytorch_model.bin", legacy=True)
    _patch_pickle(path, b"M\x00\x01", b"J\x00\x00\x00\x7f")  # storage of 256 elements -> 2**30 (4 GiB)
    with pytest.raises(CheckpointFormatError, match="claim more bytes than the file holds"):
        open_local(tmp_path)


def _fuzz_bases(marker: Path) -> list[bytes]:
    rng = torch.Generator().manual_seed(3)
    state = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(8, 6, generator=rng),
        "model.layers.0.mlp.down_proj.weight": torch.randn(6, 8, generator=rng).to(torch.bfloat16),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(6, 8, generator=rng).to(torch.float8_e4m3fn),
        "model.norm.weight": torch.ones(6, dtype=torch.float16),
        "ids": torch.arange(5),
    }
    state["lm_head.weight"] = state["model.layers.0.mlp.up_proj.weight"]
    odd = {"sparse": torch.eye(3).to_sparse(), "q": torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)}
    bases = []
    for legacy in (False, True):
        for extra in ({}, {"x": _Payload(marker)}, odd):
            buf = io.BytesIO()
            torch.save({**state, **extra}, buf, _use_new_zipfile_serialization=not legacy)
            bases.append(buf.getvalue())
    return bases


_EDIT = st.tuples(st.sampled_from(["flip", "insert", "truncate"]), st.floats(0, 1), st.binary(min_size=1, max_size=8))


def _mutate(data: bytes, edits: list[tuple[str, float, bytes]]) -> bytes:
    out = bytearray(data)
    for op, where, payload in edits:
        i = min(int(where * len(out)), max(len(out) - 1, 0))
        if op == "flip" and out:
            out[i] ^= payload[0] or 0xFF
        elif op == "insert":
            out[i:i] = payload
        else:
            del out[i:]
    return bytes(out)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: quantized tensors deprecated
def test_mutated_pickles_are_read_or_refused_as_bad_input(tmp_path):
    marker = tmp_path / "MARKER"
    bases = _fuzz_bases(marker)
    model = tmp_path / "model"
    model.mkdir()

    @settings(max_examples=1000, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
    @given(base=st.integers(0, len(bases) - 1), edits=st.lists(_EDIT, min_size=1, max_size=4))
    def check(base: int, edits: list[tuple[str, float, bytes]]) -> None:
        (model / "pytorch_model.bin").write_bytes(_mutate(bases[base], edits))
        try:
            plan, reader = open_local(model)
            for ref in plan.tensors:
                if ref.dtype.fittable and ref.numel:
                    reader.read_into(ref, np.empty(ref.nbytes, dtype=np.uint8))
            reader.close()
        except BadInputError as exc:
            assert "\n" not in str(exc)
        assert not marker.exists()

    check()


@pytest.mark.e2e
def test_a_mutated_legacy_pickle_is_one_line_exit_2(tmp_path):
    data = _save({"w": torch.zeros(8, 8)}, tmp_path / "pytorch_model.bin", legacy=True).read_bytes()
    # Cut inside the main pickle: torch's own legacy loader raised struct.error/IndexError here (exit 1).
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 3])
    out = run_cli("fit", str(tmp_path), "--no-save")
    assert out.returncode == 2, out.stderr
    assert "pytorch_model.bin" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_a_bin_streams_in_chunks_and_fits_as_its_safetensors_twin(tmp_path):
    """.bin tensors go through the chunk engine like safetensors (laid end to end per shard): a tensor
    cut into several chunks (20 MB > the 16 MiB split), strided views and small tensors coalesced into one
    chunk give the same records as the same tensors saved as safetensors; and `diff` reads .bin."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    base = torch.randn(160, 96, generator=g)
    state = {
        "model.embed_tokens.weight": torch.randn(5000, 1024, generator=g),
        "model.layers.0.mlp.up_proj.weight": base.t(),  # not contiguous: copied in row-major order
        "model.layers.0.mlp.down_proj.weight": torch.randn(96, 160, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": 1 + 0.1 * torch.randn(96, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(96, 96, generator=g).to(torch.float16),
    }
    for side in ("bin", "st", "bin2"):
        (tmp_path / side).mkdir()
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "st" / "model.safetensors")
    rows = [fit_path(str(tmp_path / side), FitOptions(device="cpu")) for side in ("bin", "st")]
    for key in ("matrices", "vectors"):
        by_name = [{m["name"]: m for m in row[key]} for row in rows]
        assert by_name[0] == by_name[1], key
    tuned = {k: v + (0.01 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in state.items()}
    torch.save(tuned, tmp_path / "bin2" / "pytorch_model.bin")
    r = run_cli("diff", str(tmp_path / "bin"), str(tmp_path / "bin2"), "--no-save", "--json")
    assert r.returncode == 0, r.stderr


# --- issue 42, item 6: sizes the file does not back -------------------------------------------------------
# A 2.1 MB .bin whose data.pkl inflated to 2 GiB of zeros fitted at 4.3 GB: torch inflates a zip record whole,
# into a buffer of the size the zip declares. Declared sizes are now checked before torch reads anything.


def _rezip(path: Path, deflate: str = "", zeros: int = 0, twice: str = "") -> Path:
    """The zip checkpoint rewritten: the record ending in `deflate` compressed with `zeros` zero bytes after its
    own (past the pickle's STOP: torch reads them, the unpickler never does), the one ending in `twice` twice."""
    with zipfile.ZipFile(path) as z:
        entries = [(info.filename, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for name, content in entries:
            info = zipfile.ZipInfo(name)
            if deflate and name.endswith(deflate):
                info.compress_type = zipfile.ZIP_DEFLATED
                with z.open(info, "w", force_zip64=True) as w:
                    w.write(content)
                    for _ in range(zeros >> 20):
                        w.write(bytes(1 << 20))
                continue
            z.writestr(info, content)
            if twice and name.endswith(twice):
                with pytest.warns(UserWarning, match="Duplicate name"):
                    z.writestr(zipfile.ZipInfo(name), content)
    return path


HOSTILE_ZIPS = {
    "data.pkl inflating to 64 MiB": (dict(deflate="/data.pkl", zeros=64 << 20), "would inflate to 67109"),
    "byteorder inflating to 64 MiB": (dict(deflate="/byteorder", zeros=64 << 20), "would inflate to 67108"),
    "a compressed storage": (dict(deflate="/data/0"), "its tensor data 'pytorch_model/data/0' is compressed"),
    "a record named twice": (dict(twice="/data.pkl"), "two records are named 'pytorch_model/data.pkl'"),
}


@pytest.mark.parametrize("case", list(HOSTILE_ZIPS))
def test_a_zip_record_larger_than_the_file_backs_is_refused_before_torch_reads_it(tmp_path, monkeypatch, case):
    folder = tmp_path / "archive"
    folder.mkdir()
    changes, message = HOSTILE_ZIPS[case]
    _rezip(_save({"w": torch.randn(16, 16)}, folder / "pytorch_model.bin", legacy=False), **changes)
    assert (folder / "pytorch_model.bin").stat().st_size < 1 << 20
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load ran") or load(*a, **k))
    with pytest.raises(CheckpointFormatError, match=message) as refused:
        open_local(folder)
    assert "the file is damaged or malicious" in str(refused.value)
    monkeypatch.undo()
    out = run_cli("fit", str(folder), "--no-save")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [f"error: {refused.value}"]


def test_a_small_zip_with_a_compressed_pickle_is_read(tmp_path):
    """The bound leaves room for a real checkpoint another zip tool recompressed (a pickle under 16 MiB)."""
    state = {"model.layers.0.mlp.down_proj.weight": torch.randn(16, 16), "b": torch.arange(5.0)}
    path = _rezip(_save(state, tmp_path / "pytorch_model.bin", legacy=False), deflate="/data.pkl", zeros=1 << 20)
    plan, reader = open_local(path)
    for ref in plan.tensors:
        raw = np.empty(ref.nbytes, dtype=np.uint8)
        reader.read_into(ref, raw)
        assert np.array_equal(raw, state[ref.name].numpy().view(np.uint8).reshape(-1)), ref.name
    reader.close()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_bin_that_is_no_file_is_refused_by_name(tmp_path, kind):
    """Issue 42, item 5 for checkpoints: never opened for a blocking read, never read without end."""
    path = tmp_path / "pytorch_model.bin"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    out = run_cli("fit", str(tmp_path), "--no-save", real=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    assert out.stderr.strip().splitlines() == [f"error: {path}: is {what}, not a regular file"]


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssAnon: Linux")
@pytest.mark.parametrize("layout", ["transposed", "permuted 3-D"])
def test_a_strided_tensor_is_copied_a_chunk_at_a_time(tmp_path, layout):
    """A transposed 256 MB weight peaked at 1 GB: each chunk of it copied the whole tensor to row-major order.
    Now a chunk copies its own elements only, and they are the row-major bytes."""
    from weightdiag.source.chunks import Chunk

    g = torch.Generator().manual_seed(1)
    base = torch.randn(4096, 4096, generator=g)  # 64 MiB
    t = base.t() if layout == "transposed" else base.view(64, 64, 4096).permute(2, 0, 1)
    torch.save({"model.layers.0.mlp.down_proj.weight": t}, tmp_path / "pytorch_model.bin")
    expected = t.contiguous().view(torch.uint8).reshape(-1).numpy()
    plan, reader = open_local(tmp_path)
    (ref,) = plan.tensors
    step = 4 << 20
    grown = 0
    for i, lo in enumerate(range(0, ref.nbytes, step)):
        before = _rss_anon()
        hi = min(lo + step, ref.nbytes)
        with reader.chunk(Chunk(i, ref.shard, ref.start + lo, ref.start + hi, ())) as buf:
            grown = max(grown, _rss_anon() - before)
            assert np.array_equal(buf, expected[lo:hi]), lo
    reader.close()
    assert grown < 3 * step, f"a chunk of {step >> 20} MiB took {grown >> 20} MiB"


# --- zip checkpoints of plain tensors, read without torch (weightdiag.source.torch_zip) ------------------------


def _plain_states() -> dict[str, object]:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(12, 10, generator=g)
    cube = torch.randn(4, 5, 6, generator=g)
    linear = torch.nn.Linear(6, 4)
    tensors = {
        f"m.{name}": (torch.randn(6, 5, generator=g) * 4).to(dtype)
        for name, dtype in [
            ("f32", torch.float32),
            ("bf16", torch.bfloat16),
            ("f16", torch.float16),
            ("f64", torch.float64),
            ("i64", torch.int64),
            ("i32", torch.int32),
            ("i8", torch.int8),
            ("u8", torch.uint8),
            ("bool", torch.bool),
            ("fp8", torch.float8_e4m3fn),
            ("fp8e5", torch.float8_e5m2),
            ("c64", torch.complex64),
            ("c128", torch.complex128),
        ]
    }
    tensors |= {
        "m.u16": torch.arange(30).to(torch.uint16).view(6, 5),
        "m.scalar": torch.tensor(2.5),
        "m.empty": torch.zeros(0, 7),
        "m.transposed": base.t(),
        "m.permuted": cube.permute(2, 0, 1),
        "m.stepped": base[::2, 1::3],
        "m.tied": base,  # shares base's storage with the two views above
        "m.row": base[3],
        "m.column": base[:, 4],
        "m.parameter": torch.nn.Parameter(torch.randn(3, 4, generator=g)),
        "note": 7,  # not a tensor: left out
    }
    state = linear.state_dict()  # an OrderedDict with _metadata (set by BUILD in the pickle)
    state.update(tensors)
    return state


@pytest.mark.parametrize("wrapped", [False, True], ids=["state dict", "under state_dict"])
def test_a_plain_zip_is_read_without_torch_exactly_as_torch_reads_it(tmp_path, monkeypatch, wrapped):
    """Every dtype and layout a state dict holds, read by torch_zip, gives the plan and the bytes torch's loader
    gives; nothing of torch is loaded for it (no tensor of it is a torch.Tensor)."""
    from weightdiag.source import torch_bin
    from weightdiag.source.chunks import Chunk
    from weightdiag.source.torch_zip import NotPlain

    state = _plain_states()
    torch.save({"state_dict": state, "epoch": 3} if wrapped else state, tmp_path / "pytorch_model.bin")

    def read_all() -> tuple[list, list[bytes]]:
        plan, reader = open_local(tmp_path)
        out = []
        for ref in plan.tensors:
            if ref.nbytes and ref.dtype.kind != "other":
                for lo in range(0, ref.nbytes, 8):  # every 8-byte cut, as chunks cut tensors
                    with reader.chunk(Chunk(-1, 0, ref.start + lo, min(ref.start + lo + 24, ref.end), ())) as buf:
                        out.append(bytes(buf))
        kinds = {type(t).__name__ for t in reader._states[0].values()}
        reader.close()
        return [plan.tensors, kinds], out

    (refs, kinds), plain = read_all()
    assert kinds == {"Laid"}
    assert {r.name for r in refs} == {k for k in state if k != "note"}

    def refuse(*args):
        raise NotPlain("forced")

    monkeypatch.setattr(torch_bin, "load_plain", refuse)
    (torch_refs, torch_kinds), by_torch = read_all()
    assert torch_kinds == {"Tensor", "Parameter"}
    assert refs == torch_refs and plain == by_torch
    monkeypatch.undo()
    reader = open_local(tmp_path)[1]
    for ref in refs:  # and the bytes are the tensors' own, in row-major order
        if ref.dtype.kind != "other" and ref.nbytes:
            raw = np.empty(ref.nbytes, dtype=np.uint8)
            reader.read_into(ref, raw)
            expected = state[ref.name].detach().contiguous().view(-1).view(torch.uint8).numpy()
            assert raw.tobytes() == expected.tobytes(), ref.name
    reader.close()


def test_a_zip_holding_more_than_plain_tensors_goes_to_torchs_loader(tmp_path):
    """Sparse and quantized tensors (torch's own rebuild functions), and a pickle of other objects, are not
    read by torch_zip: torch's loader reads or refuses them, as before."""
    from weightdiag.source.torch_zip import NotPlain, load_plain

    for name, state in {
        "sparse": {"w": torch.eye(3).to_sparse()},
        "object": {"w": torch.zeros(2), "cls": collections.Counter()},
    }.items():
        path = tmp_path / f"{name}.bin"
        torch.save(state, path)
        with open(path, "rb") as f, zipfile.ZipFile(f) as z, pytest.raises(NotPlain):
            load_plain(path, f, z.infolist())


def test_any_range_of_any_plain_strided_tensor_is_read_exactly(tmp_path):
    """torch_zip.read_elements against torch's own row-major copy: permuted, sliced and stepped views of 1 to 4
    dimensions, every range [lo, hi) drawn at random."""
    import random

    from weightdiag.source.torch_zip import Laid, load_plain, read_elements

    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(120):
        shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 4))]
        steps = [rng.choice([1, 1, 2, 3]) for _ in shape]
        base = torch.randn(*[n * s + rng.randint(0, 2) for n, s in zip(shape, steps, strict=True)], generator=g)
        view = base[tuple(slice(0, n * s, s) for n, s in zip(shape, steps, strict=True))]
        order = list(range(len(shape)))
        rng.shuffle(order)
        state[f"t{i}"] = view.permute(*order)
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        tensors = load_plain(path, f, z.infolist())
    with open(path, "rb") as f:
        for name, t in state.items():
            laid = tensors[name]
            assert isinstance(laid, Laid) and laid.shape == tuple(t.shape) and laid.stride == t.stride()
            expected = t.contiguous().view(-1).numpy()
            for _ in range(4):
                lo = rng.randint(0, t.numel())
                hi = rng.randint(lo, t.numel())
                out = np.empty((hi - lo) * 4, dtype=np.uint8)
                read_elements(f.fileno(), laid, lo, hi, out)
                assert np.array_equal(out.view(np.float32), expected[lo:hi]), (name, lo, hi)
