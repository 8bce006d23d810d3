"""Issue 39: the lineage fingerprint a fit writes (values at shape-seeded positions, gathered from the streamed
chunks), its judging (diagnose.lineage) on derived and independent pairs, the calibration of its p-values under the
null, and `weightdiag lineage` (docs/lineage.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from weightdiag import api, tuning
from weightdiag.diagnose.lineage import Fingerprint, fisher_log_p, judge
from weightdiag.record.lineage import fingerprint_json, read_fingerprint, read_pairs
from weightdiag.reduce.pairs import pair_axis, pair_cosines, pair_lines, pair_positions
from weightdiag.reduce.sample import sample_positions, samples_per_matrix
from weightdiag.run.measure import FitOptions

torch = pytest.importorskip("torch")
lc = pytest.importorskip("weightdiag.testing.lineage_cases")


def _fit(folder) -> dict:
    return api.fit(str(folder), FitOptions(device="cpu"), save=False).row


# --- positions and the fingerprint in the row -----------------------------------------------------------------


def test_positions_depend_on_the_shape_only_and_extend_by_prefix():
    a = sample_positions((512, 128), 64)
    assert np.array_equal(a, sample_positions((512, 128), 64))
    assert np.array_equal(sample_positions((512, 128), 256)[:64], a)  # a larger k keeps the first samples
    assert len(set(a.tolist())) == 64 and a.max() < 512 * 128
    grown = sample_positions((600, 128), 256)  # rows added at the end (600 and 520 share the power of two 1024)
    cut = sample_positions((520, 128), 256)
    shared = set(cut.tolist()) & set(grown.tolist())  # one stream of candidates: most entries sampled in both
    assert len(shared) >= 0.75 * 256
    in_order = [p for p in cut.tolist() if p in shared]
    assert in_order == [p for p in grown.tolist() if p in shared]
    assert not np.array_equal(sample_positions((512, 129), 64), a)
    assert samples_per_matrix(10) == 256 and samples_per_matrix(10_000) == 16


def test_the_fit_gathers_the_sampled_values_across_chunk_boundaries(small_llama):
    """Tensors cut into many chunks (16 KiB): the samples are the tensors' values at the positions, in order."""
    from safetensors.torch import load_file

    with tuning.override(split_bytes=16 << 10, local_chunk_bytes=16 << 10):
        row = _fit(small_llama)
    found = read_fingerprint(row)
    assert found is not None and row["lineage"]["k"] == samples_per_matrix(len(found))
    stored = {}
    for f in small_llama.glob("*.safetensors"):
        stored.update(load_file(str(f)))
    matrices = [m["name"] for m in row["matrices"]]
    assert set(found) == set(matrices)
    for name, values in found.items():
        flat = stored[name].float().numpy().reshape(-1)
        expected = flat[sample_positions(tuple(stored[name].shape), row["lineage"]["k"])].astype(np.float64)
        np.testing.assert_allclose(values, expected, rtol=2e-3, atol=1e-7)
    assert len(json.dumps(row["lineage"])) < 64 << 10
    # the pair cosines of every matrix indexed by hidden units, gathered across the same chunks
    ranks = read_pairs(row)
    kinds = {m["name"]: m["kind"] for m in row["matrices"]}
    paired = {n for n in found if pair_axis(kinds[n]) is not None and pair_lines(tuple(stored[n].shape), 0).size}
    assert paired and set(ranks) == paired
    for name in paired:
        shape, axis = tuple(stored[name].shape), pair_axis(kinds[name])
        flat = stored[name].float().numpy().astype(np.float64).reshape(-1)
        cos = pair_cosines(flat[pair_positions(shape, axis)], pair_lines(shape, axis).size)
        assert stats.spearmanr(cos, ranks[name]).statistic > 0.99, name


def test_pair_cosines_are_unchanged_by_a_rotation_of_the_shared_side():
    """Rows of a reader W [units, d] against W R^T, columns of a writer W [d, units] against R W: the same
    cosines; the other side's, or another matrix's, are not."""
    rng = np.random.default_rng(7)
    q, _ = np.linalg.qr(rng.normal(size=(64, 64)))
    reader, writer = rng.normal(size=(176, 64)), rng.normal(size=(64, 176))

    def cos(w, axis):
        return pair_cosines(w.reshape(-1)[pair_positions(w.shape, axis)], pair_lines(w.shape, axis).size)

    assert pair_axis("up") == 0 and pair_axis("down") == 1 and pair_axis("embed") is None
    assert pair_lines((176, 64), 0).size == 64 and len(set(pair_lines((176, 64), 0).tolist())) == 64  # disjoint
    np.testing.assert_allclose(cos(reader @ q.T, 0), cos(reader, 0), atol=1e-12)
    np.testing.assert_allclose(cos(q @ writer, 1), cos(writer, 1), atol=1e-12)
    assert abs(stats.spearmanr(cos(reader @ q.T, 0), cos(rng.normal(size=(176, 64)), 0)).statistic) < 0.6
    assert np.all(pair_cosines(np.zeros(64 * 64), 64) == 0)  # a zero matrix: ties, no evidence


@pytest.mark.parametrize("shape", [(96, 40), (40, 96), (128, 33), (17, 200)])
@pytest.mark.parametrize("axis", [0, 1])
def test_lines_gathered_piece_by_piece_are_the_paired_lines(shape, axis):
    """The chunk pass gathers rows as slices and columns as 2-D takes (LineGather), pieces cut anywhere (inside
    a row, across one, one element long): in pair order they are the lines pair_positions names."""
    from itertools import pairwise

    from weightdiag.reduce.pairs import as_lines, gather_lines, line_gather

    rng = np.random.default_rng(11)
    flat = rng.normal(size=math.prod(shape)).astype(np.float32)
    spec = line_gather(shape, axis)
    assert spec is not None
    expected = flat[pair_positions(shape, axis)].reshape(pair_lines(shape, axis).size, -1)
    anywhere = [0, *sorted(set(rng.choice(flat.size, 30).tolist()) - {0}), flat.size]
    for cuts in ([0, flat.size], [0, 1, 2, 41, 100, 333, flat.size], anywhere):
        got = np.concatenate([gather_lines(flat[a:b], a, spec) for a, b in pairwise(cuts)])
        np.testing.assert_array_equal(as_lines(got, spec, shape), expected)
    assert line_gather((10, 8), 0) is None and line_gather(shape, None) is None  # too few lines; not paired


def test_rows_without_a_fingerprint_read_and_are_not_judged(minilm_dir):
    row = _fit(minilm_dir)
    old = {k: v for k, v in row.items() if k != "lineage"}
    from weightdiag.record.schema import load_row

    load_row(json.loads(json.dumps(old)))
    assert Fingerprint.of(old) is None
    judged = judge("old", Fingerprint.of(row), Fingerprint.of_or_why(old))
    assert judged.verdict == "not judged" and "refit" in judged.reason


# --- derived and independent pairs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm(minilm_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage")
    base = lc.load_state(minilm_dir)
    return minilm_dir, root, base, _fit(minilm_dir)


DERIVED = {
    "noise": lambda base, cfg: lc.noise(base, 0.01),
    "fp8": lambda base, cfg: lc.fp8_round_trip(base),
    "int4": lambda base, cfg: lc.int4_round_trip(base),
    "lora": lambda base, cfg: lc.lora_merged(base),
    "renamed-f16": lambda base, cfg: lc.restored(base),
    "vocab-added": lambda base, cfg: lc.add_vocab(base),
    "heads-permuted": lambda base, cfg: lc.bert_permute_heads(base, cfg["num_attention_heads"]),
    "residual-permuted": lambda base, cfg: lc.bert_permute_residual(base),
    "ffn-permuted": lambda base, cfg: lc.bert_permute_ffn(base),
}


@pytest.mark.parametrize("case", list(DERIVED))
def test_derivations_of_minilm_are_derived(minilm, case):
    folder, root, base, base_row = minilm
    cfg = json.loads((folder / "config.json").read_text())
    row = _fit(lc.save_state(DERIVED[case](base, cfg), root / case, folder / "config.json"))
    judged = judge("minilm", Fingerprint.of(row), Fingerprint.of(base_row))
    assert judged.verdict == "derived", (case, judged.reason, judged.invariants)
    assert judged.log10_p is not None and judged.log10_p <= -10
    if case == "renamed-f16":
        assert any("renamed" in r for r in judged.relation) and any("F16" in r for r in judged.relation)
    if case == "vocab-added":
        assert any("rows added" in r for r in judged.relation)
    if case == "residual-permuted":
        assert any("permuted" in r for r in judged.relation)
    if case in ("heads-permuted", "ffn-permuted"):  # permuted, not "same weights"
        assert any(r.startswith("permuted") for r in judged.relation), judged.relation
        assert not any("same weights" in r for r in judged.relation), judged.relation


def test_dropped_layers_are_derived_and_said(minilm):
    folder, root, base, base_row = minilm
    cfg = json.loads((folder / "config.json").read_text())
    keep = cfg["num_hidden_layers"] - 2
    row = _fit(lc.save_state(lc.bert_drop_layers(base, keep), root / "dropped", {**cfg, "num_hidden_layers": keep}))
    judged = judge("minilm", Fingerprint.of(row), Fingerprint.of(base_row))
    assert judged.verdict == "derived"
    assert f"fewer layers ({keep} against {cfg['num_hidden_layers']})" in judged.relation


def test_a_random_initialisation_of_the_same_shape_is_not_derived(minilm):
    from transformers import BertConfig, BertModel

    folder, root, base, base_row = minilm
    torch.manual_seed(3)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(folder))).state_dict().items()}
    row = _fit(lc.save_state({k: v for k, v in init.items() if k in base}, root / "init", folder / "config.json"))
    judged = judge("minilm", Fingerprint.of(row), Fingerprint.of(base_row))
    assert judged.verdict == "independent", judged.reason


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three tiny Llamas trained from scratch the same way (the same data, steps and optimiser), seeds 0-2."""
    root = tmp_path_factory.mktemp("tiny-llamas")
    rows = {}
    for seed in range(3):
        state, first, cfg = lc.tiny_llama(seed, steps=40)
        rows[seed] = _fit(lc.save_state(state, root / f"s{seed}", cfg))
        rows[f"init{seed}"] = _fit(lc.save_state(first, root / f"i{seed}", cfg))
        rows[f"folder{seed}"] = root / f"s{seed}"
    return rows


def test_independently_trained_seeds_are_never_derived(trained):
    for a, b in [(0, 1), (0, 2), (1, 2), (0, "init1"), (2, "init0")]:
        judged = judge(str(b), Fingerprint.of(trained[a]), Fingerprint.of(trained[b]))
        assert judged.verdict != "derived", (a, b, judged.log10_p)
        assert judged.log10_p is not None and judged.log10_p > -4


def test_rotated_and_tuned_then_permuted_copies_are_derived(trained, tmp_path):
    """The two derivations the samples cannot see (docs/lineage.md): the residual stream rotated with the norm
    gains folded in, and a fine-tune followed by a residual permutation; both by their pair cosines."""
    from safetensors.torch import load_file

    base = {k: v for k, v in load_file(str(trained["folder0"] / "model.safetensors")).items()}
    tuned, _, cfg = lc.tiny_llama(0, 20, lr=1e-3, init=base)
    for case, state in (("rotated", lc.llama_rotate(base)), ("tuned-permuted", lc.llama_permute_residual(tuned))):
        judged = judge(
            "s0", Fingerprint.of(_fit(lc.save_state(state, tmp_path / case, cfg))), Fingerprint.of(trained[0])
        )
        assert judged.verdict == "derived", (case, judged.log10_p_samples, judged.log10_p_pairs)
        assert judged.log10_p_samples is not None and judged.log10_p_samples > -3  # the samples alone: nothing
        assert any("permuted or rotated" in r for r in judged.relation), judged.relation


def test_a_model_of_many_paired_matrices_pairs_every_few_layers_and_still_tells(trained, tmp_path, monkeypatch):
    """Past MAX_PAIRED matrices with pairs (the gather's cost on a fit), only the layers whose index is a multiple
    of a stride have them: here 8 of the tiny Llama's 28, so layer 0 only; the rotated copy is still derived by
    them, and an independent seed is not."""
    import weightdiag.run.measure as measure
    from weightdiag.reduce.sample import layer_stride

    monkeypatch.setattr(measure, "MAX_PAIRED", 8)
    rows = {seed: _fit(trained[f"folder{seed}"]) for seed in (0, 1)}
    blocks = {m["name"]: m.get("block") for m in rows[0]["matrices"]}
    paired = read_pairs(rows[0])
    assert layer_stride([0] * 7 + [1] * 7 + [2] * 7 + [3] * 7, 8) == 4
    assert len(paired) == 7 and {blocks[n] for n in paired} == {0}
    assert set(read_pairs(trained[0])) > set(paired)  # unpatched: every layer
    from safetensors.torch import load_file

    base = dict(load_file(str(trained["folder0"] / "model.safetensors")))
    cfg = json.loads((trained["folder0"] / "config.json").read_text())
    rotated = Fingerprint.of(_fit(lc.save_state(lc.llama_rotate(base), tmp_path / "rotated", cfg)))
    judged = judge("s0", rotated, Fingerprint.of(rows[0]))
    assert judged.verdict == "derived" and judged.pairs_compared == 7, (judged.log10_p_pairs, judged.pairs_compared)
    assert judge("s1", rotated, Fingerprint.of(rows[1])).verdict != "derived"
    assert judge("s0 unpatched", rotated, Fingerprint.of(trained[0])).verdict == "derived"  # old rows still compare


def test_a_trained_model_derives_from_its_own_initialisation(trained):
    for seed in range(3):
        judged = judge("init", Fingerprint.of(trained[seed]), Fingerprint.of(trained[f"init{seed}"]))
        assert judged.verdict == "derived"


# --- calibration: p-values under the null ---------------------------------------------------------------------


def _synthetic(rng, shapes, k, heavy):
    """A fingerprint of independent values at the sampled positions (Student t with 3 degrees: heavy tails)."""
    records, samples = [], {}
    for i, shape in enumerate(shapes):
        name = f"layers.{i // 4}.m{i % 4}"
        values = rng.standard_t(3, size=k) if heavy else rng.normal(size=k)
        samples[name] = values * 0.02
        records.append({"name": name, "kind": f"m{i % 4}", "block": i // 4, "expert": None, "shape": list(shape)})
    row = {"matrices": records, "lineage": fingerprint_json(samples, k)}
    return Fingerprint.of(row)


@pytest.mark.parametrize("heavy", [False, True])
def test_p_values_are_uniform_under_the_null(heavy):
    """400 pairs of independent fingerprints (12 matrices in 3 shapes, so each matrix is compared with 4):
    the combined p-values are uniform (Kolmogorov-Smirnov), and 5% of them fall below 0.05."""
    rng = np.random.default_rng(20261128 + heavy)
    shapes = [(64, 64)] * 4 + [(176, 64)] * 4 + [(64, 176)] * 4
    ps = []
    for _ in range(400):
        a, b = _synthetic(rng, shapes, 128, heavy), _synthetic(rng, shapes, 128, heavy)
        judged = judge("b", a, b)
        assert judged.verdict != "derived"
        ps.append(10**judged.log10_p)
    assert stats.kstest(ps, "uniform").pvalue > 1e-3
    assert 0.02 <= np.mean(np.array(ps) < 0.05) <= 0.09


def _paired(rng, kinds, k):
    """A fingerprint of independent values and pair cosines (those of independent Gaussian matrices) of tiny-Llama
    shaped matrices of the given kinds."""
    shapes = {"q": (64, 64), "up": (176, 64), "down": (64, 176)}
    records, samples, pairs = [], {}, {}
    for i, kind in enumerate(kinds):
        name, shape = f"layers.{i // len(set(kinds))}.{kind}{i}", shapes[kind]
        w = rng.normal(size=shape) + 0.3 * rng.normal(size=(1, shape[1]))  # a shared mean row: cosines biased
        samples[name] = w.reshape(-1)[sample_positions(shape, k)]
        axis = pair_axis(kind)
        assert axis is not None
        pairs[name] = pair_cosines(w.reshape(-1)[pair_positions(shape, axis)], pair_lines(shape, axis).size)
        records.append({"name": name, "kind": kind, "block": i // 3, "expert": None, "shape": list(shape)})
    return Fingerprint.of({"matrices": records, "lineage": fingerprint_json(samples, k, pairs)})


def test_pair_p_values_are_uniform_under_the_null():
    """300 pairs of independent fingerprints with pair cosines (9 matrices, readers and writers): the pair test's
    combined p-values are uniform (Kolmogorov-Smirnov); the verdict's, the smaller of the two tests' times 2, is
    below 0.05 at most 5% of the time (conservative) and never `derived`."""
    rng = np.random.default_rng(39)
    kinds = ["q", "up", "down"] * 3
    pair_ps, ps = [], []
    for _ in range(300):
        judged = judge("b", _paired(rng, kinds, 64), _paired(rng, kinds, 64))
        assert judged.verdict != "derived" and judged.pairs_compared == 9
        assert judged.log10_p_pairs is not None and judged.log10_p is not None
        pair_ps.append(10**judged.log10_p_pairs)
        ps.append(10**judged.log10_p)
    assert stats.kstest(pair_ps, "uniform").pvalue > 1e-3
    assert 0.02 <= np.mean(np.array(pair_ps) < 0.05) <= 0.09
    assert np.mean(np.array(ps) < 0.05) <= 0.07


def test_fisher_combination_is_exact_and_never_underflows():
    assert math.isclose(fisher_log_p([math.log(0.5)]), math.log(0.5))
    two = [math.log(0.1), math.log(0.2)]
    assert math.isclose(fisher_log_p(two), stats.chi2.logsf(-2 * sum(two), 4), rel_tol=1e-9)
    assert math.isfinite(fisher_log_p([-5000.0] * 40)) and fisher_log_p([-5000.0] * 40) < -1e5


# --- the command ---------------------------------------------------------------------------------------------


def test_lineage_command_json_and_text(minilm_dir, tmp_path):
    from typer.testing import CliRunner

    from weightdiag import cli

    db = tmp_path / "db"
    api.fit(str(minilm_dir), FitOptions(device="cpu"), db_dir=db)
    noisy = lc.save_state(lc.noise(lc.load_state(minilm_dir), 0.01), tmp_path / "noisy", minilm_dir / "config.json")
    runner = CliRunner()
    out = runner.invoke(cli.app, ["lineage", str(noisy), "--db", str(db), "--json", "-q"], prog_name="weightdiag")
    assert out.exit_code == 0, out.output
    (only,) = json.loads(out.stdout)
    assert only["reference"] == "all-MiniLM-L6-v2" and only["verdict"] == "derived"
    assert only["evidence"] and {"candidate", "reference", "rho", "log10_p"} <= set(only["evidence"][0])
    text = runner.invoke(cli.app, ["lineage", str(noisy), "--db", str(db)], prog_name="weightdiag")
    assert text.exit_code == 0 and "derived      all-MiniLM-L6-v2" in text.stdout


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """weightdiag.cli.main in this process, as the console script runs it: (exit code, stdout, stderr)."""
    from weightdiag import cli

    with pytest.raises(SystemExit) as ended:
        cli.main(list(args))
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out, out.err


def test_lineage_bad_input_is_one_line_exit_2(minilm_dir, tmp_path, capsys):
    code, _, err = _main(capsys, "lineage", str(minilm_dir), "--against", str(tmp_path / "nope"), "--db", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no such row" in err, err
    code, _, err = _main(capsys, "lineage", "Qwen2-7B", "--db", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no lineage fingerprint" in err, err


def test_a_model_of_many_matrices_samples_every_few_layers():
    from weightdiag.reduce.sample import MAX_MATRICES, layer_stride

    assert layer_stride([0, 1, None]) == 1
    blocks = [b for b in range(96) for _ in range(9)] + [None, None]  # 866 matrices in 96 layers
    stride = layer_stride(blocks)
    assert sum(b is None or b % stride == 0 for b in blocks) <= MAX_MATRICES + 9


def test_api_lineage_by_row_id_and_against_the_database(minilm_dir, tmp_path):
    """A candidate named by its row id; the database's rows all judged, an old row without a fingerprint listed
    as not judged (last), the candidate's own row left out."""
    from weightdiag.database.store import write_row

    db = tmp_path / "db"
    fitted = api.fit(str(minilm_dir), FitOptions(device="cpu"), db_dir=db)
    old = {k: v for k, v in fitted.row.items() if k != "lineage"}
    old["model"] = {**old["model"], "id": "old-row", "fingerprint": "local-old"}
    write_row(old, db)
    noisy = lc.save_state(lc.noise(lc.load_state(minilm_dir), 0.02), tmp_path / "noisy", minilm_dir / "config.json")
    api.fit(str(noisy), FitOptions(device="cpu"), db_dir=db)
    report = api.lineage("noisy", db_dir=db)
    assert [(j.reference, j.verdict) for j in report.judgements] == [
        ("all-MiniLM-L6-v2", "derived"),
        ("old-row", "not judged"),
    ]
    assert "refit" in report.judgements[1].reason
    named = api.lineage("all-MiniLM-L6-v2", [str(noisy)], db_dir=db)
    assert named.how == "row" and named.judgements[0].verdict == "derived"


def test_declared_base_model_confirmed_contradicted_or_missing(minilm_dir, tmp_path, capsys):
    db = tmp_path / "db"
    api.fit(str(minilm_dir), FitOptions(device="cpu"), db_dir=db)  # the row of id all-MiniLM-L6-v2
    state = lc.load_state(minilm_dir)
    tuned = lc.save_state(lc.noise(state, 0.02), tmp_path / "tuned", minilm_dir / "config.json")
    (tuned / "README.md").write_text("---\nbase_model: all-MiniLM-L6-v2\n---\n# a tune\n")
    report = api.lineage(str(tuned), db_dir=db, declared=True)
    assert (report.declared, report.declaration) == ("all-MiniLM-L6-v2", "confirmed")
    assert report.to_json()[0]["declared"]["verdict"] == "confirmed"
    liar = lc.save_state(lc.int4_round_trip(state), tmp_path / "liar", minilm_dir / "config.json")
    other = lc.save_state(lc.bert_drop_layers(state, 6), tmp_path / "other", minilm_dir / "config.json")
    (other / "README.md").write_text("")
    torch.manual_seed(5)
    from transformers import BertConfig, BertModel

    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm_dir))).state_dict().items()}
    fake = lc.save_state(
        {k: v for k, v in init.items() if k in state}, tmp_path / "fake-base", minilm_dir / "config.json"
    )
    api.fit(str(fake), FitOptions(device="cpu"), db_dir=db)
    (liar / "README.md").write_text("---\nbase_model:\n  - fake-base\n---\n")
    report = api.lineage(str(liar), db_dir=db, declared=True)
    assert (report.declaration, report.nearest) == ("contradicted", "all-MiniLM-L6-v2")
    code, _, err = _main(capsys, "lineage", str(other), "--declared", "--db", str(db))
    assert code == 2 and "names no base_model" in err and "--against" in err, err


@pytest.mark.parametrize("values", ["zero-matrix", "ternary"])
def test_tied_values_are_no_evidence(tmp_path, values):
    """Ranks broken by position made a zero-initialised matrix (a pooler) in two unrelated models correlate
    perfectly (`derived`, p = 1e-2088), and so did independent ternary models ({-1, 0, 1} x 0.02, as BitNet's):
    ties now share their rank, and unrelated models are never `derived`."""
    from .conftest import write_safetensors

    rows = []
    for seed in (3, 4):
        rng = np.random.default_rng(seed)
        tensors = {}
        for layer in range(4):
            for part, shape in (("q_proj", (128, 128)), ("up_proj", (256, 128)), ("down_proj", (128, 256))):
                w = rng.standard_normal(shape) * 0.02
                if values == "ternary":
                    w = rng.integers(-1, 2, size=shape) * 0.02
                tensors[f"model.layers.{layer}.mlp.{part}.weight"] = ("F32", w.astype(np.float32))
        if values == "zero-matrix":
            tensors["pooler.dense.weight"] = ("F32", np.zeros((128, 128), dtype=np.float32))
        folder = tmp_path / f"m{seed}"
        folder.mkdir()
        write_safetensors(folder / "model.safetensors", tensors)
        rows.append(_fit(folder))
    judged = judge("m4", Fingerprint.of(rows[0]), Fingerprint.of(rows[1]))
    assert judged.verdict != "derived", judged.reason


def test_api_lineage_takes_one_reference_as_a_string_and_needs_a_database_without_one(minilm_dir, tmp_path):
    """Red team: against="x" was read a letter at a time; a --db that does not exist answered 'against 0
    references', exit 0, where every other reader of the database exits 2."""
    from weightdiag.errors import DatabaseError

    one = api.lineage(str(minilm_dir), against=str(minilm_dir), db_dir=tmp_path / "db", save=False)
    assert len(one.judgements) == 1 and one.judgements[0].verdict == "derived"
    with pytest.raises(DatabaseError):
        api.lineage(str(minilm_dir), db_dir=tmp_path / "nodb", save=False)


# --- --declared: sampled reads of a base without a row, every base named, the card's values ----------------


def test_declared_base_without_a_row_is_read_by_samples_from_the_hub(fake_hub, minilm_dir, tmp_path, capsys):
    """The base on the loopback Hub, in no database: its samples are read by ranged reads, at most 10% of its
    bytes (what the server sent, and what the report says), and the declaration is confirmed."""
    fake_hub.add_folder("acme/minilm", minilm_dir)
    state = lc.load_state(minilm_dir)
    tuned = lc.save_state(lc.noise(state, 0.02), tmp_path / "tuned", minilm_dir / "config.json")
    (tuned / "README.md").write_text("---\nbase_model: acme/minilm\n---\n")
    weights = sum(p.stat().st_size for p in minilm_dir.glob("*.safetensors"))
    fake_hub.reset_counters()
    report = api.lineage(str(tuned), db_dir=tmp_path / "no-db", declared=True)
    assert report.declaration == "confirmed", report.judgements[0].reason
    (nbytes,) = report.bytes_read.values()
    assert 0 < nbytes <= 0.10 * weights
    assert fake_hub.file_bytes_sent <= 0.10 * weights
    assert report.to_json()[0]["declared"]["bytes_read"] == nbytes
    code, out, _ = _main(capsys, "lineage", str(tuned), "--declared", "--db", str(tmp_path / "no-db"))
    assert code == 0 and "declared base_model acme/minilm: confirmed" in out and "bytes read" in out, out


def test_declared_bases_each_judged_paths_from_the_card_folder_and_bad_values(
    fake_hub, minilm_dir, tmp_path, monkeypatch, capsys
):
    """A list of bases judges each (one contradicted: the declaration is); `./path` resolves against the
    candidate's folder whatever the working directory; a value that names no model is one line, exit 2, and
    nothing is asked of the Hub."""
    from transformers import BertConfig, BertModel

    fake_hub.add_folder("acme/minilm", minilm_dir)
    state = lc.load_state(minilm_dir)
    models = tmp_path / "models"
    tuned = lc.save_state(lc.noise(state, 0.02), models / "tuned", minilm_dir / "config.json")
    torch.manual_seed(6)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm_dir))).state_dict().items()}
    lc.save_state({k: v for k, v in init.items() if k in state}, models / "other", minilm_dir / "config.json")
    (tuned / "README.md").write_text("---\nbase_model:\n  - acme/minilm\n  - ../other\n---\n")
    monkeypatch.chdir(tmp_path)  # not the card's folder: ../other from here is no model
    report = api.lineage(str(tuned), db_dir=tmp_path / "no-db", declared=True)
    verdicts = {base: verdict for base, _, verdict in report.declarations}
    assert verdicts["acme/minilm"] == "confirmed" and report.declaration == "contradicted", verdicts
    assert [v for b, v in verdicts.items() if b.endswith("other")] == ["contradicted"]
    assert len(report.judgements) == 2
    for bad in ("{name: acme/minilm}", "[acme/minilm, ", "a model with spaces"):
        (tuned / "README.md").write_text(f"---\nbase_model: {bad}\n---\n")
        fake_hub.reset_counters()
        code, _, err = _main(capsys, "lineage", str(tuned), "--declared", "--db", str(tmp_path / "no-db"))
        assert code == 2 and len(err.strip().splitlines()) == 1 and "not a model id" in err, (bad, err)
        assert not fake_hub.requests, (bad, [r.path for r in fake_hub.requests])
