"""Issue 39: lineage fingerprints of matrices stored quantized (docs/lineage.md, "Quantized weights").

Each format's checkpoint is written by tests/quant_checkpoints.py and tests/quant_gptq_checkpoints.py (the
formats' own tools where they run here: bitsandbytes, compressed-tensors; the published packers otherwise) from
all-MiniLM-L6-v2 and from an independent model of its shape (a random initialisation). The quantized copy's
samples are its dequantized values at the logical [out, in] matrix's positions: equal bit for bit to those of
its dequantized twin (the format's own dequantizer, saved as F32), within the format's error of the base's, and
`derived` from the base by the samples and the pair cosines; the quantized independent model is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weightdiag import api, tuning
from weightdiag.decode.formats import FACTORIES, decoded_positions
from weightdiag.diagnose.lineage import Fingerprint, judge, quantization_error
from weightdiag.record.lineage import read_fingerprint, read_pairs
from weightdiag.reduce import stream
from weightdiag.run.measure import FitOptions

from . import quant_checkpoints as qc
from . import quant_gptq_checkpoints as gq

torch = pytest.importorskip("torch")
lc = pytest.importorskip("weightdiag.testing.lineage_cases")

# format -> (quantizer, quantization_config, bits); GPTQ with act-order (desc_act) reorders groups across inputs
FORMATS = {
    "gptq": (lambda: gq.gptq(), gq.GPTQ_CONFIG, 4),
    "gptq-act-order": (lambda: gq.gptq(desc_act=True), {**gq.GPTQ_CONFIG, "desc_act": True}, 4),
    "gptq-8bit": (lambda: gq.gptq(bits=8), {**gq.GPTQ_CONFIG, "bits": 8}, 8),
    "awq": (lambda: gq.awq(), gq.AWQ_CONFIG, 4),
    "fp8-block": (lambda: qc.fp8_block(), qc.FP8_BLOCK_CONFIG, 8),
    "ct-int4": (lambda: qc.ct_pack(), qc.ct_pack_config(), 4),
    "nvfp4": (lambda: qc.nvfp4_ct(), qc.NVFP4_CT_CONFIG, 4),
    "mxfp4": (lambda: qc.mxfp4_ct(), qc.MXFP4_CT_CONFIG, 3),  # power-of-two scales: a bit of the grid lost
    "bnb-nf4": (lambda: qc.bnb_4bit(), qc.BNB_4BIT_CONFIG, 4),
    "bnb-int8": (lambda: qc.bnb_int8(), qc.BNB_8BIT_CONFIG, 8),
}


def _fit(folder: Path) -> dict:
    return api.fit(str(folder), FitOptions(device="cpu"), save=False).row


@pytest.fixture(scope="module")
def models(minilm_dir, tmp_path_factory):
    """MiniLM's row, and an independent model of its shape (a random initialisation) saved as MiniLM is."""
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("lineage-quant")
    base = lc.load_state(minilm_dir)
    torch.manual_seed(11)
    init = BertModel(BertConfig.from_pretrained(str(minilm_dir))).state_dict()
    state = {k: v.detach() for k, v in init.items() if k in base}
    other = lc.save_state(state, root / "other", minilm_dir / "config.json")
    return root, minilm_dir, _fit(minilm_dir), other


def _quantized(models, fmt: str, source: Path | None = None) -> tuple[Path, Path]:
    root, minilm_dir, _, _ = models
    quantize, config, _ = FORMATS[fmt]
    folder = root / f"{fmt}-{'base' if source is None else source.name}"
    if (folder / "quantized").exists():
        return folder / "quantized", folder / "twin"
    return qc.write_pair(folder, source or minilm_dir, quantize(), config)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_quantized_samples_are_the_dequantized_values_at_the_logical_positions(models, fmt, monkeypatch):
    """Read in 16 KiB pieces (samples cut across pieces and stored rows), with every sampled unit of a counted
    piece decoded on its own (no runs merged): the samples and pair cosines equal the twin's bit for bit, and
    the base's within the format's error (and not equal: the values really are quantized)."""
    _, _, base_row, _ = models
    qdir, tdir = _quantized(models, fmt)
    monkeypatch.setattr(stream, "SAMPLE_RUN_GAP", 0)
    with tuning.override(split_bytes=16 << 10, local_chunk_bytes=16 << 10):
        row = _fit(qdir)
    twin_row = _fit(tdir)
    got, twin, base = read_fingerprint(row), read_fingerprint(twin_row), read_fingerprint(base_row)
    assert got is not None and twin is not None and base is not None
    quantized = {m["name"] for m in row["matrices"] if m.get("quantization")}
    assert len(quantized) == 37 and quantized <= set(got)  # 36 linear weights and the pooler; embeddings stay F32
    assert set(got) == set(twin) == set(base)
    pairs, twin_pairs = read_pairs(row), read_pairs(twin_row)
    assert set(pairs) == set(twin_pairs) and quantized & set(pairs)
    _, _, bits = FORMATS[fmt]
    for name in quantized:
        assert np.array_equal(got[name], twin[name]), name
        assert np.array_equal(pairs.get(name, []), twin_pairs.get(name, [])), name
        change = np.linalg.norm(got[name] - base[name]) / np.linalg.norm(base[name])
        assert 1e-4 < change <= quantization_error(bits), (name, change)


@pytest.mark.parametrize("fmt", ["gptq-act-order", "awq"])  # decoded pieces, counted pieces
def test_sampling_leaves_the_quantized_records_as_they_were(models, fmt):
    qdir, _ = _quantized(models, fmt)
    rows = []
    for on in (True, False):
        with tuning.override(lineage_fingerprint=on):
            rows.append(_fit(qdir))
    assert rows[0]["matrices"] == rows[1]["matrices"] and rows[0]["lineage"]["matrices"]


@pytest.mark.parametrize("fmt", ["gptq-act-order", "awq"])  # decoded pieces, counted pieces
def test_the_torch_pipeline_gathers_the_same_quantized_samples(models, fmt, monkeypatch):
    """The device path (issue 41) on torch's CPU device: the same samples and pair cosines as the CPU path."""
    qdir, _ = _quantized(models, fmt)
    rows = []
    for on_torch in (True, False):
        monkeypatch.setattr(stream, "uses_torch", lambda device, on=on_torch: on)
        with tuning.override(split_bytes=16 << 10, local_chunk_bytes=16 << 10):
            rows.append(_fit(qdir))
    assert rows[0]["lineage"] == rows[1]["lineage"] and len(rows[0]["lineage"]["matrices"]) == 40


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_quantized_copy_is_derived_and_a_quantized_independent_model_is_not(models, fmt):
    _, _, base_row, other = models
    base = Fingerprint.of(base_row)
    qdir, tdir = _quantized(models, fmt)
    row = _fit(qdir)  # read as a fit reads it: sampled units of a counted piece decoded in merged runs
    got, twin = read_fingerprint(row) or {}, read_fingerprint(_fit(tdir)) or {}
    assert set(got) == set(twin) and all(np.array_equal(got[n], twin[n]) for n in twin)
    judged = judge("minilm", Fingerprint.of(row), base)
    assert judged.verdict == "derived", judged.reason
    assert judged.log10_p_samples is not None and judged.log10_p_samples <= -10
    assert judged.log10_p_pairs is not None and judged.log10_p_pairs <= -10  # the pair cosines alone too
    assert any(r.startswith("quantized (") and "quantization error's level" in r for r in judged.relation)
    assert not any(r.startswith("re-stored") for r in judged.relation), judged.relation
    independent = judge("minilm", Fingerprint.of(_fit(_quantized(models, fmt, other)[0])), base)
    assert independent.verdict == "independent", independent.reason
    assert not any(r.startswith("quantized") for r in independent.relation)


def test_quantized_after_other_changes_is_said_and_an_unquantized_copy_never_reads_quantized(models, tmp_path):
    _, minilm_dir, base_row, _ = models
    base = Fingerprint.of(base_row)
    noised = lc.save_state(lc.noise(lc.load_state(minilm_dir), 0.15), tmp_path / "noised", minilm_dir / "config.json")
    qdir, _ = qc.write_pair(tmp_path / "q", noised, qc.bnb_int8(), qc.BNB_8BIT_CONFIG)
    judged = judge("minilm", Fingerprint.of(_fit(qdir)), base)
    assert judged.verdict == "derived"
    assert any(r.startswith("quantized (bitsandbytes LLM.int8) and changed besides") for r in judged.relation)
    plain = judge("minilm", Fingerprint.of(_fit(noised)), base)
    assert plain.verdict == "derived" and not any(r.startswith("quantized") for r in plain.relation), plain.relation


def test_a_quantized_copy_against_its_own_dequantized_values_is_the_same_weights_stored_quantized(models):
    qdir, tdir = _quantized(models, "gptq")
    judged = judge("twin", Fingerprint.of(_fit(qdir)), Fingerprint.of(_fit(tdir)))
    assert judged.verdict == "derived"
    assert judged.relation[:2] == [
        "same weights (median relative change 0.00%)",
        "stored quantized (GPTQ int4, group 128)",
    ]
    unquantized = judge("twin", Fingerprint.of(_fit(tdir)), Fingerprint.of(_fit(tdir)))
    assert not any("stored quantized" in r for r in unquantized.relation), unquantized.relation


def test_lineage_command_against_a_database_says_quantized(models, tmp_path):
    """The database's packed path (lineage_batch) and the text: the relation names the format."""
    from typer.testing import CliRunner

    from weightdiag import cli

    _, minilm_dir, _, _ = models
    db = tmp_path / "db"
    api.fit(str(minilm_dir), FitOptions(device="cpu"), db_dir=db)
    qdir, _ = _quantized(models, "awq")
    runner = CliRunner()
    out = runner.invoke(cli.app, ["lineage", str(qdir), "--db", str(db), "--json", "-q"], prog_name="weightdiag")
    assert out.exit_code == 0, out.output
    (found,) = json.loads(out.stdout)
    assert found["verdict"] == "derived" and found["matrices_compared"] == 40 and found["pairs_compared"] >= 36
    assert found["relation"][0].startswith("quantized (AWQ int4"), found["relation"]
    assert any(e["candidate"].endswith("attention.self.query.weight") for e in found["evidence"])
    text = runner.invoke(cli.app, ["lineage", str(qdir), "--db", str(db)], prog_name="weightdiag")
    assert text.exit_code == 0 and "relation: quantized (AWQ int4" in text.stdout, text.stdout


@pytest.mark.parametrize("fmt", sorted({"gptq", "awq"} | {f for f in FACTORIES if f.startswith(("fp8", "bnb"))}))
def test_decoded_positions_invert_the_decoders_logical_index(fmt):
    """Where each logical position is met in the stream: a decoder's logical_index of it gives it back."""
    from weightdiag.decode.scheme import Quantized, QuantSpec
    from weightdiag.dtypes import DTYPES
    from weightdiag.source.plan import TensorRef

    out, inputs, bits = 64, 256, 4
    spec = QuantSpec(fmt, fmt, bits, "test", "test", "test", group=128)
    q = Quantized(spec, TensorRef("m.qweight", DTYPES["I32"], (inputs * bits // 32, out), 0, 0, 1), {}, (out, inputs))
    logical = np.random.default_rng(0).choice(out * inputs, 500, replace=False)
    decoded = decoded_positions(q, logical)
    assert decoded.min() >= 0 and decoded.max() < out * inputs and np.unique(decoded).size == 500
    decoder = object.__new__(FACTORIES[fmt])  # logical_index needs the shape only
    decoder.__dict__.update(out=out, inputs=inputs, per=32 // bits)
    assert [decoder.logical_index(int(d)) for d in decoded] == logical.tolist()
    if fmt not in ("gptq", "awq"):  # row-major formats: decoded order is the logical one
        assert np.array_equal(decoded, logical)
