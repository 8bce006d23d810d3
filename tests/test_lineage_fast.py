"""Issue 39, acceptance 3: `lineage` against the database reads each row's packed fingerprint from the index
(database/index.py, diagnose/lineage_packed.py) and judges references in chunks (diagnose/lineage_batch.py).
Both must give the judgements diagnose.lineage.judge gives, reference by reference; the index's copy must be
the row's, rebuilt where it is missing, and never believed when damaged."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest

from weightdiag import api
from weightdiag.diagnose import lineage_batch
from weightdiag.diagnose.lineage import Fingerprint, judge_all
from weightdiag.diagnose.lineage_batch import judge_packed
from weightdiag.diagnose.lineage_packed import pack, unpack
from weightdiag.run.measure import FitOptions

torch = pytest.importorskip("torch")
lc = pytest.importorskip("weightdiag.testing.lineage_cases")


def _fit(folder) -> dict:
    return api.fit(str(folder), FitOptions(device="cpu"), save=False).row


@pytest.fixture(scope="module")
def rows(minilm_dir, tmp_path_factory):
    """MiniLM, copies of it changed in the ways judging tells apart (noise, re-stored and renamed, rows added,
    layers dropped: another k, so matched across sample counts; permuted: the position-free statistics), a random
    initialisation of its shape, and a row without a fingerprint."""
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("lineage-fast")
    base = lc.load_state(minilm_dir)
    cfg = json.loads((minilm_dir / "config.json").read_text())
    out = {"minilm": _fit(minilm_dir)}
    for name, state, config in [
        ("noise", lc.noise(base, 0.02), cfg),
        ("renamed-f16", lc.restored(base), cfg),
        ("vocab-added", lc.add_vocab(base), cfg),
        ("dropped", lc.bert_drop_layers(base, 4), {**cfg, "num_hidden_layers": 4}),
        ("residual-permuted", lc.bert_permute_residual(base), cfg),
    ]:
        out[name] = _fit(lc.save_state(state, root / name, config))
    torch.manual_seed(3)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm_dir))).state_dict().items()}
    out["random-init"] = _fit(lc.save_state({k: v for k, v in init.items() if k in base}, root / "init", cfg))
    out["old"] = {k: v for k, v in out["minilm"].items() if k != "lineage"}
    return out


def _same(a: list, b: list) -> None:
    """The same judgements: every field as printed, and the p-values to the last digits."""
    for x, y in zip(a, b, strict=True):
        jx, jy = x.to_json(), y.to_json()
        for key in jx:
            if key == "evidence":
                for ex, ey in zip(jx[key], jy[key], strict=True):
                    assert ex == ey, (jx["reference"], ex, ey)
            assert jx[key] == jy[key], (jx["reference"], key, jx[key], jy[key])
    for x, y in zip(a, b, strict=True):
        assert (x.log10_p is None) == (y.log10_p is None)
        if x.log10_p is not None:
            assert math.isclose(x.log10_p, y.log10_p, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("candidate", ["minilm", "noise", "vocab-added", "dropped", "random-init"])
def test_chunked_judging_of_packed_rows_is_judge_reference_by_reference(rows, candidate, monkeypatch):
    """Every candidate against every row (the candidate's own included): the same verdicts, p-values, evidence,
    relations, invariants and order; chunks of 2 references of interleaved layouts, and of CHUNK."""
    cand = Fingerprint.of(rows[candidate])
    assert cand is not None
    refs = list(rows.items()) * 2  # each layout more than once: chunks of one layout hold several rows
    expected = judge_all(cand, [(label, Fingerprint.of_or_why(row)) for label, row in refs])
    assert {j.verdict for j in expected} >= {"derived", "not judged"}
    packed = [(label, pack(row) or Fingerprint.of_or_why(row)) for label, row in refs]
    _same(expected, judge_packed(cand, packed))
    monkeypatch.setattr(lineage_batch, "CHUNK", 2)
    _same(expected, judge_packed(cand, iter(packed)))


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    """The derivations only the pair cosines see (docs/lineage.md): a tiny Llama, its residual stream rotated with
    the norm gains folded in, a fine-tune of it then permuted; and a second seed trained alike (independent)."""
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("lineage-fast-llamas")
    state, _, cfg = lc.tiny_llama(0, steps=40)
    folder = lc.save_state(state, root / "s0", cfg)
    base = dict(load_file(str(folder / "model.safetensors")))
    tuned, _, _ = lc.tiny_llama(0, 20, lr=1e-3, init=base)
    other, _, _ = lc.tiny_llama(1, steps=40)
    out = {"llama": _fit(folder)}
    for name, st in [
        ("rotated", lc.llama_rotate(base)),
        ("tuned-permuted", lc.llama_permute_residual(tuned)),
        ("llama-seed1", other),
    ]:
        out[name] = _fit(lc.save_state(st, root / name, cfg))
    return out


@pytest.mark.parametrize("candidate", ["rotated", "tuned-permuted", "llama", "minilm"])
def test_the_pair_cosines_judged_in_chunks_are_judge_reference_by_reference(rows, llamas, candidate, monkeypatch):
    """With the pair cosines' test in: a rotated copy and a fine-tuned-then-permuted one (derived by their pair
    cosines alone), references of two architectures interleaved; the same log10_p_pairs, Bonferroni and relations."""
    every = {**llamas, "minilm": rows["minilm"], "residual-permuted": rows["residual-permuted"], "old": rows["old"]}
    cand = Fingerprint.of(every[candidate])
    assert cand is not None
    refs = [(label, every[label]) for label in ("llama", "minilm", "rotated", "old", "tuned-permuted")]
    refs += [(label, every[label]) for label in ("llama-seed1", "residual-permuted", "llama", "rotated")]
    expected = judge_all(cand, [(label, Fingerprint.of_or_why(row)) for label, row in refs])
    if candidate in ("rotated", "tuned-permuted"):
        (base,) = {j.reference: j for j in expected if j.reference == "llama"}.values()
        assert base.verdict == "derived" and base.log10_p_pairs is not None, base.to_json()
        assert any("permuted or rotated" in r for r in base.relation), base.relation
    assert any(j.pairs_compared for j in expected)
    packed = [(label, pack(row) or Fingerprint.of_or_why(row)) for label, row in refs]
    _same(expected, judge_packed(cand, packed))
    monkeypatch.setattr(lineage_batch, "CHUNK", 2)
    _same(expected, judge_packed(cand, iter(packed)))


def test_a_packed_fingerprint_decodes_to_the_rows_values(rows):
    from weightdiag.record.lineage import read_fingerprint, read_pairs

    row = rows["vocab-added"]
    packed = unpack([pack(row)])
    samples = read_fingerprint(row)
    assert samples is not None
    for i, name in enumerate(packed.layout.names):
        got = packed.values(i, __import__("numpy").arange(packed.layout.sizes[i]))[0]
        assert got.tobytes() == samples[name].tobytes()  # bit for bit
    pairs = read_pairs(row)
    assert pairs and list(pairs) == packed.layout.pair_names
    for name, at in zip(packed.layout.pair_names, packed.layout.pair_offsets, strict=True):
        got = packed.pairs[0, at : at + pairs[name].size].astype("float64") / 2
        assert got.tobytes() == pairs[name].tobytes()  # as read_pairs gives them
    assert pack(rows["old"]) == b"" and len(pack(row)) < 64 << 10


def _db_with(rows, tmp_path, names):
    from weightdiag.database.store import write_row

    db = tmp_path / "db"
    for name in names:
        row = json.loads(json.dumps(rows[name]))
        row["model"] = {**row["model"], "id": name, "fingerprint": f"local-{name}"}
        write_row(row, db)
    return db


def test_lineage_against_the_database_reads_the_index_not_the_rows(rows, tmp_path, monkeypatch):
    """Written with the row, the packed fingerprint answers: no row file is read whole. Without the index (an
    index of an older schema is made again: the same), rows are read once, and the index written for the next."""
    from weightdiag.database import store

    db = _db_with(rows, tmp_path, ["noise", "minilm", "random-init", "old", "dropped"])
    reads = []
    real = store._summary_and_lineage_from_file
    monkeypatch.setattr(store, "_summary_and_lineage_from_file", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    first = api.lineage("noise", db_dir=db)
    assert reads == []
    assert [(j.reference, j.verdict) for j in first.judgements] == [
        ("minilm", "derived"),
        ("dropped", "derived"),
        ("random-init", "independent"),
        ("old", "not judged"),
    ]
    assert "refit" in first.judgements[-1].reason
    (db / "rows" / ".index.sqlite").unlink()
    again = api.lineage("noise", db_dir=db)
    assert len(set(reads)) == 5 and [j.to_json() for j in again.judgements] == [j.to_json() for j in first.judgements]
    before = len(reads)
    api.lineage("noise", db_dir=db)
    assert len(reads) == before  # the index was written on the way


def test_a_damaged_packed_fingerprint_is_never_believed(rows, tmp_path):
    """An entry whose fingerprint was changed (the seal covers it by hash) is passed over: the row answers."""
    db = _db_with(rows, tmp_path, ["noise", "minilm", "random-init"])
    expected = [j.to_json() for j in api.lineage("noise", db_dir=db).judgements]
    index = db / "rows" / ".index.sqlite"
    with sqlite3.connect(index) as connection:
        (blob,) = connection.execute("SELECT lineage FROM rows WHERE model_id = ?", (b"random-init",)).fetchone()
        forged = pack(rows["minilm"])  # a well-formed fingerprint, of another row
        assert forged != blob
        connection.execute("UPDATE rows SET lineage = ? WHERE model_id = ?", (forged, b"random-init"))
    assert [j.to_json() for j in api.lineage("noise", db_dir=db).judgements] == expected
