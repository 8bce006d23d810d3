"""diff on planted pairs with known answers (untouched block, rank-r update, noise, scaled matrix) and on a
null pair (small full-rank noise everywhere), every per-tensor figure checked against numpy on the full
tensors; pairing (renamed prefixes, one-sided tensors, shape mismatches); BF16 storage; the sketch path."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from weightdiag.delta import paired
from weightdiag.delta.result import DiffOptions
from weightdiag.run.diff import diff
from weightdiag.run.measure import FitOptions

from .conftest import run_cli
from .diff_checkpoints import base_tensors, low_rank_update, noise, stored, values, write

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

Q1 = "model.layers.1.self_attn.q_proj.weight"
O2 = "model.layers.2.self_attn.o_proj.weight"


def run(base: Path, tuned: Path, **options) -> dict:
    return diff(str(base), str(tuned), DiffOptions(device="cpu", **options)).to_json()


def by_name(result: dict) -> dict[str, dict]:
    return {m["name"]: m for m in result["matrices"] + result["vectors"]}


def findings(result: dict) -> dict[str, dict]:
    return {f["code"]: f for f in result["findings"]}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("planted")
    base = base_tensors()
    tuned = noise(base, 1e-3, seed=1, keep=lambda n: n.startswith("model.layers.0."))  # block 0 frozen
    tuned[Q1] = low_rank_update(base[Q1], rank=2, seed=2)  # LoRA-like
    tuned[O2] = (base[O2] * np.float32(1.05)).astype(np.float32)  # scaled
    return write(root / "base", base), write(root / "tuned", tuned)


@pytest.fixture(scope="module")
def planted_result(planted) -> dict:
    return run(*planted)


def test_every_figure_equals_numpy_on_the_full_tensors(planted, planted_result):
    b_all, t_all = values(planted[0]), values(planted[1])
    b_bits, t_bits = stored(planted[0]), stored(planted[1])
    records = by_name(planted_result)
    assert set(records) == set(b_all)
    for name, rec in records.items():
        b, t = b_all[name], t_all[name]
        d = t - b
        rel = np.linalg.norm(d) / np.linalg.norm(b)
        assert rec["relative_change"] == pytest.approx(rel, rel=1e-6, abs=0), name
        cos = np.sum(b * t) / (np.linalg.norm(b) * np.linalg.norm(t))
        assert rec["cosine"] == pytest.approx(cos, rel=1e-9), name
        same = np.count_nonzero(b_bits[name].view(torch.int32).numpy() == t_bits[name].view(torch.int32).numpy())
        assert rec["unchanged_fraction"] == same / b.size, name  # exactly
        assert rec["sign_flip_fraction"] == np.count_nonzero(b * t < 0) / b.size, name
        if rec["delta_norm"]:
            # Bucketed, as docs/diff-schema.md says (issue 42): 2^-7-wide buckets, each quantile its bucket's
            # midpoint, within 2^-8 relative of the exact order statistic.
            for q, key in ((0.5, "q50"), (0.9, "q90"), (0.99, "q99"), (0.999, "q99_9")):
                exact = np.quantile(np.abs(d), q, method="inverted_cdf")
                assert rec["delta_abs_quantiles"][key] == pytest.approx(exact, rel=2**-8), (name, key)
            assert rec["delta_abs_quantiles"]["max"] == pytest.approx(np.abs(d).max(), rel=1e-6), name
            nz = b != 0
            ratio = (np.abs(d[nz]) / np.abs(b[nz])).astype(np.float32)
            for q, key in ((0.5, "q50"), (0.99, "q99")):
                exact = np.quantile(ratio, q, method="inverted_cdf")
                assert exact * (1 - 2**-7) <= rec["ratio_quantiles"][key] <= exact, (name, key)  # bucket's lower edge
        if b.ndim == 2 and rec["spectrum"]["method"] == "exact":
            s = np.linalg.svd(d, compute_uv=False)
            energy = np.cumsum(s**2)
            truth = int(np.searchsorted(energy, 0.9 * energy[-1] * (1 - 1e-9))) + 1 if energy[-1] > 0 else 0
            assert rec["rank90"] == truth, name


def test_untouched_matrices_are_exactly_zero(planted_result):
    for name, rec in by_name(planted_result).items():
        if name.startswith("model.layers.0."):
            assert rec["relative_change"] == 0.0 and rec["unchanged_fraction"] == 1.0 and rec["untouched"], name
            assert rec["cosine"] == 1.0 and rec["sign_flip_fraction"] == 0.0
            if rec["spectrum"]:
                assert rec["rank90"] == 0 and rec["spectrum"]["singular_values"][0] == 0.0
        else:
            assert not rec["untouched"], name


def test_planted_changes_are_found_with_evidence(planted_result):
    found = findings(planted_result)
    assert found["frozen-blocks"]["evidence"]["blocks"] == [0]
    assert list(found["low-rank"]["names"]) == [Q1]
    assert found["low-rank"]["evidence"][Q1]["rank90"] <= 2
    assert list(found["scaled"]["names"]) == [O2]
    assert found["scaled"]["evidence"][O2]["scale"] == pytest.approx(1.05, rel=1e-6)
    o2 = by_name(planted_result)[O2]
    assert o2["cosine"] == pytest.approx(1.0, abs=1e-12) and o2["relative_change"] == pytest.approx(0.05, rel=1e-5)
    assert "untouched" not in found  # block 0's matrices are reported as a frozen block, not one by one
    assert set(found["embeddings"]["names"]) == {"model.embed_tokens.weight", "lm_head.weight"}
    blocks = {b["key"]: b for b in planted_result["blocks"]}
    assert blocks["block 0"]["relative_change"] == 0.0 and blocks["block 0"]["untouched"] == 7
    assert "block 0" not in found["changed-most"]["names"]


def test_a_null_pair_flags_nothing(tmp_path):
    """Full fine-tune-like noise everywhere: no LoRA-like, scaled, frozen or untouched finding."""
    base = base_tensors(seed=3)
    result = run(write(tmp_path / "b", base), write(tmp_path / "t", noise(base, 2e-3, seed=4)))
    found = findings(result)
    assert not {"low-rank", "scaled", "frozen-blocks", "untouched", "nothing-changed"} & set(found), found
    assert all(m["rank90"] > 0.3 * min(m["shape"]) for m in result["matrices"])
    assert all(abs(m["alignment"]) < 0.1 for m in result["matrices"])


def test_identical_checkpoints_changed_nothing(tmp_path):
    base = write(tmp_path / "b", base_tensors())
    result = run(base, base)
    assert [f["code"] for f in result["findings"]] == ["nothing-changed"]
    assert result["totals"]["relative_change"] == 0.0 and result["totals"]["unchanged_fraction"] == 1.0


def test_pairing_lists_one_sided_tensors_shape_mismatches_and_matches_renamed_prefixes(tmp_path):
    base = base_tensors()
    tuned = {("base_model." + k if k.startswith("model.") else k): v for k, v in noise(base, 1e-3, 5).items()}
    del tuned["lm_head.weight"]
    base = dict(base, **{"model.empty.weight": np.zeros((0, 128), dtype=np.float32)})
    tuned["model.empty.weight"] = np.zeros((0, 128), dtype=np.float32)
    tuned["score.weight"] = np.zeros((2, 128), dtype=np.float32)  # a new classification head
    tuned["base_model.model.embed_tokens.weight"] = np.zeros((321, 128), dtype=np.float32)  # a grown vocabulary
    result = run(write(tmp_path / "b", base), write(tmp_path / "t", tuned))
    assert result["only_base"] == ["lm_head.weight"]
    assert result["only_tuned"] == ["score.weight"]
    assert result["shape_mismatches"] == [
        {
            "name": "model.embed_tokens.weight",
            "tuned_name": "base_model.model.embed_tokens.weight",
            "base": [320, 128],
            "tuned": [321, 128],
        }
    ]
    q = by_name(result)[Q1]
    assert q["tuned_name"] == "base_model." + Q1 and q["relative_change"] > 0
    assert {"name": "model.empty.weight", "reason": "empty tensor"} in result["skipped"]


def test_bf16_unchanged_fraction_compares_stored_bits(tmp_path):
    """An update below BF16's resolution leaves most elements bit-identical: counted on the stored bits."""
    base = base_tensors()
    tuned = noise(base, 1e-3, seed=6)
    b, t = write(tmp_path / "b", base, torch.bfloat16), write(tmp_path / "t", tuned, torch.bfloat16)
    result = run(b, t)
    bs, ts = stored(b), stored(t)
    for name, rec in by_name(result).items():
        same = np.count_nonzero(bs[name].view(torch.int16).numpy() == ts[name].view(torch.int16).numpy())
        assert rec["unchanged_fraction"] == same / bs[name].numel(), name
        assert rec["base_dtype"] == rec["tuned_dtype"] == "BF16"
    q = by_name(result)[Q1]
    assert 0.5 < q["unchanged_fraction"] < 1.0  # BF16 rounding hides most of a 1e-3 update


def test_mixed_dtypes_compare_decoded_values(tmp_path):
    base = base_tensors()
    b = write(tmp_path / "b", base)  # F32
    t = write(tmp_path / "t", base, torch.bfloat16)  # the same weights rounded to BF16
    result = run(b, t)
    bv, tv = values(b), values(t)
    for name, rec in by_name(result).items():
        assert rec["unchanged_fraction"] == np.count_nonzero(bv[name] == tv[name]) / bv[name].size
        rel = np.linalg.norm(tv[name] - bv[name]) / np.linalg.norm(bv[name])
        assert rec["relative_change"] == pytest.approx(rel, rel=1e-6)
        if name != "model.norm.weight":  # all ones: exact in BF16
            assert 0 < rec["relative_change"] < 2**-8


def test_the_sketch_path_finds_a_low_rank_update_in_a_wide_matrix(tmp_path, knobs):
    """Small blocks force the one-pass sketch on the 256-wide matrices; a rank-3 update is pinned, the
    noise of the others is not called low rank."""
    knobs(block_elems=4096, gram_cols=64)
    base = base_tensors()
    tuned = noise(base, 1e-3, seed=7)
    down = "model.layers.3.mlp.down_proj.weight"  # 128 x 256
    tuned[down] = low_rank_update(base[down], rank=3, seed=8)
    result = run(write(tmp_path / "b", base), write(tmp_path / "t", tuned), sketch=32)
    rec = by_name(result)[down]
    assert rec["spectrum"]["method"] == "sketch" and rec["rank90"] <= 3 and rec["low_rank"]
    others = [m for m in result["matrices"] if m["name"] != down]
    assert not any(m["low_rank"] for m in others)
    d = values(tmp_path / "t")[down] - values(tmp_path / "b")[down]
    s = np.linalg.svd(d, compute_uv=False)
    np.testing.assert_allclose(rec["spectrum"]["singular_values"][:3], s[:3], rtol=1e-4)


def test_side_reads_tile_every_shard_around_the_blocks_in_file_order():
    from weightdiag.source.chunks import Chunk

    blocks = [Chunk(0, 0, 100, 150, ()), Chunk(1, 0, 150, 170, ()), Chunk(2, 1, 40, 60, ())]
    reads = paired.side_reads(blocks, {0: (10, 300), 1: (8, 64), 2: (8, 30)}, chunk_bytes=64)
    assert reads.verify
    spans = [(c.shard, c.start, c.end) for c in reads.chunks]
    assert [c.index for c in reads.chunks] == list(range(len(spans)))
    for shard, (lo, hi) in {0: (10, 300), 1: (8, 64), 2: (8, 30)}.items():  # tiled without a hole
        mine = [(a, b) for s_, a, b in spans if s_ == shard]
        assert mine[0][0] == lo and mine[-1][1] == hi
        assert all(b == a2 for (_, b), (a2, _) in itertools.pairwise(mine))
        assert all(b - a <= 64 for a, b in mine)
    assert [(c.start, c.end) for c in reads.block] == [(100, 150), (150, 170), (40, 60)]
    assert [(c.start, c.end) for c in reads.before[0]] == [(10, 74), (74, 100)]
    assert reads.before[1] == [] and [(c.shard, c.start) for c in reads.before[2]] == [
        (0, 170),
        (0, 234),
        (0, 298),
        (1, 8),
    ]
    assert [(c.shard, c.start, c.end) for c in reads.after] == [(1, 60, 64), (2, 8, 30)]
    # blocks out of file order (the other side stores its tensors differently): read alone, unverified
    shuffled = paired.side_reads([blocks[1], blocks[0]], {0: (10, 300)}, chunk_bytes=64)
    assert not shuffled.verify and [(c.start, c.index) for c in shuffled.chunks] == [(150, 0), (100, 1)]
    assert not paired.side_reads(blocks, None, 64).verify


def test_plot_and_html_show_relative_change_and_rank_per_block_and_kind(planted, tmp_path):
    pytest.importorskip("matplotlib")
    from weightdiag import api

    page = tmp_path / "out" / "diff.html"
    result = api.diff(
        str(planted[0]),
        str(planted[1]),
        DiffOptions(device="cpu"),
        plot_dir=tmp_path / "plots",
        html_file=page,
        db_dir=tmp_path / "db",
    )
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["diff_blocks.png", "diff_rank90.png", "diff_relative_change.png"]
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 3
    assert Q1 in text and "LoRA-like" in text and result.findings[0].message.split(":")[0] in text


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--blocks", "0-3"], "--blocks selects what --fail-above gates"),
        (["--fail-above", "-1"], "--fail-above -1"),
        (["--fail-above", "0", "--blocks", "x"], "--blocks 'x'"),
        (["--fail-above", "0", "--blocks", "40-41"], "no compared tensor is in the --blocks selection"),
        (["--sketch", "1"], "--sketch 1"),
        (["--include", "nothing.*"], "no tensor in common"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(planted, extra, needle):
    r = run_cli("diff", str(planted[0]), str(planted[1]), "--no-save", *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and needle in r.stderr, r.stderr


def test_the_default_device_is_auto_as_for_fits_and_reads_as_the_cpu(planted, planted_result):
    """DiffOptions' default was "cpu" while FitOptions' (and every command's --device) was "auto": both are "auto"
    now, resolved in one place (reduce.device.resolve_device) to the CPU, so the figures are the same."""
    assert DiffOptions().device == FitOptions().device == "auto"
    by_default = diff(str(planted[0]), str(planted[1])).to_json()
    assert by_default["run"]["device"] == "cpu"
    timing = ("seconds", "created")
    assert {k: v for k, v in by_default["run"].items() if k not in timing} == {
        k: v for k, v in planted_result["run"].items() if k not in timing
    }
    assert {k: v for k, v in by_default.items() if k != "run"} == {
        k: v for k, v in planted_result.items() if k != "run"
    }


def test_all_matrices_lists_every_matrix_and_the_old_all_still_does(planted):
    """`diff --all-matrices` lists all 30 matrices, not the top 15: named so because `--all` is sweep's "every
    revision". `diff --all`, its name before, still works (a hidden alias, for scripts)."""
    wide = {"COLUMNS": "200"}
    top, every, old = (
        run_cli("diff", str(planted[0]), str(planted[1]), "--no-save", *flag, env=wide)
        for flag in ([], ["--all-matrices"], ["--all"])
    )
    assert top.returncode == every.returncode == old.returncode == 0, (top.stderr, every.stderr, old.stderr)
    assert "(top 15 of 30)" in top.stdout and "model.layers.0.mlp.down_proj.weight" not in top.stdout  # frozen
    assert "top 15" not in every.stdout and "model.layers.0.mlp.down_proj.weight" in every.stdout
    assert old.stdout == every.stdout
    help_text = run_cli("diff", "--help", env=wide).stdout
    assert "--all-matrices" in help_text and "--all " not in help_text


def test_a_gguf_against_another_layout_and_missing_models_are_one_line_errors(planted, smollm_gguf, tmp_path):
    r = run_cli("diff", str(smollm_gguf), str(planted[1]), "--no-save")  # a GGUF is read: no shape in common
    assert r.returncode == 2 and "no tensor in common" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli("diff", str(tmp_path / "nothing"), str(planted[1]), "--no-save")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_tensors_named_differently_pair_by_their_layout_role(tmp_path):
    """Meta's native names (layers.N.attention.wq) against the HF ones: paired by block and kind."""
    base = base_tensors()
    native = {
        "q_proj": "attention.wq", "k_proj": "attention.wk", "v_proj": "attention.wv", "o_proj": "attention.wo",
        "gate_proj": "feed_forward.w1", "down_proj": "feed_forward.w2", "up_proj": "feed_forward.w3",
    }  # fmt: skip
    tuned = {}
    for name, v in noise(base, 1e-3, seed=9).items():
        for hf, meta in native.items():
            name = name.replace(f"self_attn.{hf}", meta).replace(f"mlp.{hf}", meta)
        tuned[name.removeprefix("model.")] = v
    result = run(write(tmp_path / "b", base), write(tmp_path / "t", tuned))
    q = by_name(result)[Q1]
    assert q["tuned_name"] == "layers.1.attention.wq.weight" and 0 < q["relative_change"] < 0.01
    assert len(result["matrices"]) == 30 and not result["only_base"] and not result["only_tuned"]


def test_progress_counts_every_byte_and_tensor(planted):
    from weightdiag.progress import Events

    events = Events()
    diff(str(planted[0]), str(planted[1]), DiffOptions(device="cpu"), events)
    ((_, tensors, nbytes),) = events.of("started")
    assert events.calls[0][0] == "started" and tensors == 35
    assert sum(n for (n,) in events.of("read")) == nbytes
    assert len(events.of("measured")) == 35


def test_a_quiet_gate_prints_its_verdict_alone(planted):
    """Issue 33: `diff --fail-above X -q` printed the whole report before PASS/FAIL; -q leaves the verdict."""
    r = run_cli("diff", str(planted[0]), str(planted[1]), "--no-save", "--fail-above", "0", "-q")
    assert r.returncode == 1 and r.stderr == ""
    (line,) = r.stdout.splitlines()
    assert line.startswith("FAIL: 27 of 35 tensors changed more than 0: ") and line.endswith(" and 22 more")
    r = run_cli("diff", str(planted[0]), str(planted[1]), "--no-save", "--fail-above", "1", "-q", "--blocks", "0")
    assert (r.returncode, r.stdout, r.stderr) == (0, "PASS: 8 tensors within relative change 1\n", "")
    wide = {"COLUMNS": "100000"}
    loud = run_cli("diff", str(planted[0]), str(planted[1]), "--no-save", "--fail-above", "0", env=wide)
    assert loud.stdout.count("\n") > 5 and loud.stdout.splitlines()[-1] == line  # without -q: the report, then it


def test_plot_and_html_say_what_they_wrote(planted, tmp_path):
    """Issue 33: `diff --plot/--html` wrote silently; one line each on stderr now (not with -q, as for report)."""
    pytest.importorskip("matplotlib")
    plots, page = tmp_path / "plots", tmp_path / "diff.html"
    args = ("diff", str(planted[0]), str(planted[1]), "--no-save", "--plot", str(plots), "--html", str(page))
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if not line.startswith("note: ")]  # the numpy pass's note
    assert said == [f"3 plots written to {plots}", f"HTML page written to {page}"]
    assert len(list(plots.glob("*.png"))) == 3 and page.is_file()
    assert run_cli(*args, "-q").stderr == ""


def test_cosine_and_alignment_are_null_where_undefined(tmp_path):
    """Issue 33: a zero matrix had cosine 0.0 and an untouched one alignment 0.0, which read as "orthogonal";
    both are undefined there: null in JSON, "-" in the tables, never a scaled finding."""
    base = base_tensors()
    zero = "model.layers.0.mlp.down_proj.weight"
    base[zero] = np.zeros_like(base[zero])
    tuned = {k: v.copy() for k, v in base.items()}
    tuned[zero] = (np.random.default_rng(3).standard_normal(tuned[zero].shape) * 0.01).astype(np.float32)
    tuned[O2] = (base[O2] * np.float32(1.05)).astype(np.float32)
    result = run(write(tmp_path / "b", base), write(tmp_path / "t", tuned))
    records = by_name(result)
    assert records[zero]["cosine"] is None and records[zero]["alignment"] is None  # W_base = 0
    untouched = records[Q1]
    assert untouched["untouched"] and untouched["cosine"] == 1.0 and untouched["alignment"] is None  # ΔW = 0
    assert records[O2]["cosine"] == pytest.approx(1.0) and records[O2]["alignment"] == pytest.approx(1.0)
    both_zero = run(write(tmp_path / "b2", base), write(tmp_path / "t2", base))
    assert by_name(both_zero)[zero]["cosine"] is None  # zero against zero: undefined, not "untouched, 1"
    shown = run_cli(
        "diff", str(tmp_path / "b"), str(tmp_path / "t"), "--no-save", "--all-matrices", env={"COLUMNS": "300"}
    )
    row = next(line for line in shown.stdout.splitlines() if line.startswith(f"│ {zero} "))
    assert re.search(r"│ +- +│ +0\.0% +│", row), row  # the cosine cell, then unchanged
