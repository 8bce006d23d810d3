"""diff on real training: all-MiniLM-L6-v2 (PyPI) fine-tuned on the CPU for a few dozen steps, and a rank-4 LoRA
merged into its q and v; figures against numpy on the full tensors; the Hub-to-Hub diff (loopback Hub) equal
to the local one; one side FP8-block quantized."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from weightdiag.delta.result import DiffOptions
from weightdiag.run.diff import diff

from .conftest import run_cli
from .quant_checkpoints import FP8_BLOCK_CONFIG, fp8_block, write_pair

STEPS = 20
LORA_RANK = 4


def _pair_script():
    """scripts/make_diff_pair.py, which writes the README's pair: the tests make theirs with its own functions."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "make_diff_pair.py"
    spec = importlib.util.spec_from_file_location("make_diff_pair", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_diff_pair.py"


def _run_script(*args: str, hide_transformers: bool = False, hide_torch: bool = False) -> subprocess.CompletedProcess:
    """The script as the README runs it; hide_transformers, hide_torch: as in an environment that lacks them."""
    hidden = [name for name, hide in (("transformers", hide_transformers), ("torch", hide_torch)) if hide]
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in hidden)  # import then raises, as if absent
    code = f"import runpy, sys; {hide}sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code, str(_SCRIPT), *args], capture_output=True, text=True)


def test_the_pair_script_says_in_one_line_what_to_install_without_transformers(tmp_path):
    """Issue 33: scripts/demo installs no transformers, and the script ended in a ModuleNotFoundError traceback."""
    done = _run_script(str(tmp_path / "out"), hide_transformers=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: the fine-tune needs transformers, which scripts/demo does not install: pip install "
        f"'{_pair_script().TRANSFORMERS}' (into this environment), then run this again"
    ]
    assert not (tmp_path / "out").exists()


def test_the_pair_script_says_in_one_line_to_install_torch_from_the_checkout(tmp_path):
    """Issue 42: the script imported torch before its transformers check, and scripts/demo installs no torch: a
    traceback. Now one line naming both, torch as weightdiag's extra installed from this checkout."""
    done = _run_script(str(tmp_path / "out"), hide_transformers=True, hide_torch=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: the fine-tune needs torch and transformers, which scripts/demo does not install: pip install "
        f"'.[torch]' '{_pair_script().TRANSFORMERS}' (from this checkout, into this environment), then run this again"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_pair_script_says_how_far_the_fine_tune_is(tmp_path):
    """Issue 33: minutes of training printed nothing; now a line every 10 steps and at the last."""
    done = _run_script(str(tmp_path / "out"), "--steps", "12")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("fine-tuning ") and lines[0].endswith(
        "for 12 AdamW steps on the CPU (a line every 10 steps)"
    )
    steps = [line for line in lines if line.startswith("fine-tune step ")]
    assert [line.split(":")[0] for line in steps] == ["fine-tune step 10/12", "fine-tune step 12/12"]
    assert re.fullmatch(r"fine-tune step 12/12: loss \d\.\d{5}, \d+ s so far, 0 s left", steps[-1]), steps[-1]
    assert "base: " in done.stdout
    assert (tmp_path / "out" / "minilm-ft" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "minilm-lora" / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def fine_tuned(minilm_dir, tmp_path_factory) -> Path:
    """STEPS of AdamW on a tiny regression task (mean-pooled embedding of random sentences -> fixed targets).
    The pooler gets no gradient (the task reads the hidden states): it stays bit for bit."""
    script = _pair_script()
    folder = tmp_path_factory.mktemp("ft") / "minilm-ft"
    script.save(folder, minilm_dir, script.fine_tune(minilm_dir, STEPS))
    return folder


@pytest.fixture(scope="module")
def lora_merged(minilm_dir, tmp_path_factory) -> Path:
    """W + (alpha / r) B A merged into every q and v (rank LORA_RANK), everything else as shipped."""
    script = _pair_script()
    folder = tmp_path_factory.mktemp("lora") / "minilm-lora"
    script.save(folder, minilm_dir, script.lora_merge(minilm_dir, LORA_RANK))
    return folder


def _run(base: Path | str, tuned: Path | str, **kw) -> dict:
    return diff(str(base), str(tuned), DiffOptions(device="cpu", **kw)).to_json()


@pytest.fixture(scope="module")
def ft_result(minilm_dir, fine_tuned) -> dict:
    return _run(minilm_dir, fine_tuned)


@pytest.mark.slow  # the fine-tune: a minute or two of CPU
@pytest.mark.kernels  # scripts/test-slow runs it again on the numpy kernels
def test_fine_tune_figures_equal_numpy(minilm_dir, fine_tuned, ft_result):
    base = load_file(str(minilm_dir / "model.safetensors"))
    tuned = load_file(str(fine_tuned / "model.safetensors"))
    records = {m["name"]: m for m in ft_result["matrices"] + ft_result["vectors"]}
    assert len(records) == 103  # every float tensor; position_ids (I64) is listed as skipped
    assert [s["name"] for s in ft_result["skipped"]] == ["embeddings.position_ids"]
    for name, rec in records.items():
        b, t = base[name].to(torch.float64).numpy(), tuned[name].to(torch.float64).numpy()
        if not np.any(b):  # a zero base (an unused bias): relative change 0 or infinite (null in JSON)
            assert rec["relative_change"] == (0.0 if not np.any(t) else None), name
        else:
            rel = np.linalg.norm(t - b) / np.linalg.norm(b)
            assert rec["relative_change"] == pytest.approx(rel, rel=1e-6, abs=0), name
        same = np.count_nonzero(base[name].view(torch.int32).numpy() == tuned[name].view(torch.int32).numpy())
        assert rec["unchanged_fraction"] == same / b.size, name
        if b.ndim == 2:
            s = np.linalg.svd(t - b, compute_uv=False)
            energy = np.cumsum(s**2)
            truth = int(np.searchsorted(energy, 0.9 * energy[-1] * (1 - 1e-9))) + 1 if energy[-1] > 0 else 0
            assert rec["rank90"] == truth, name  # exact path: MiniLM's matrices are at most 1536 wide


@pytest.mark.slow  # the fine-tune: a minute or two of CPU
@pytest.mark.kernels  # scripts/test-slow runs it again on the numpy kernels
def test_fine_tune_findings(ft_result):
    found = {f["code"]: f for f in ft_result["findings"]}
    pooler = {m["name"]: m for m in ft_result["matrices"]}["pooler.dense.weight"]
    assert pooler["untouched"] and pooler["relative_change"] == 0.0 and pooler["rank90"] == 0
    assert "pooler.dense.weight" in found["untouched"]["names"]
    assert "scaled" not in found and "frozen-blocks" not in found
    changed = [m for m in ft_result["matrices"] if not m["untouched"]]
    assert len(changed) >= 36 and all(0 < m["relative_change"] < 0.05 for m in changed)


def test_lora_merge_is_low_rank_in_q_and_v_and_exactly_zero_elsewhere(minilm_dir, lora_merged):
    result = _run(minilm_dir, lora_merged)
    for m in result["matrices"] + result["vectors"]:
        if m["name"].endswith(("self.query.weight", "self.value.weight")):
            assert 1 <= m["rank90"] <= LORA_RANK and m["low_rank"], m["name"]
            assert m["relative_change"] > 0
        else:
            assert m["untouched"] and m["relative_change"] == 0.0 and m["unchanged_fraction"] == 1.0, m["name"]
    found = {f["code"]: f for f in result["findings"]}
    assert len(found["low-rank"]["names"]) == 12
    assert "scaled" not in found


def test_hub_to_hub_equals_local(fake_hub, minilm_dir, lora_merged):
    fake_hub.add_folder("acme/minilm", minilm_dir)
    fake_hub.add_folder("acme/minilm-lora", lora_merged)
    local = _run(minilm_dir, lora_merged)
    remote = _run("acme/minilm", "acme/minilm-lora@main", connections=4)
    science = ("matrices", "vectors", "findings", "blocks", "kinds", "totals", "only_base", "only_tuned", "skipped")
    assert {k: remote[k] for k in science} == {k: local[k] for k in science}
    assert remote["base"]["source"] == remote["tuned"]["source"] == "hub"
    verification = remote["run"]["verification"]
    assert verification == {"base": "sha256 of every shard verified against the Hub"} | {
        "tuned": "sha256 of every shard verified against the Hub"
    }
    assert fake_hub.requests_to("minilm-lora", method="GET")  # the bytes did come from the Hub


def test_a_corrupted_hub_transfer_fails_the_sha256_check(fake_hub, minilm_dir, lora_merged):
    from weightdiag.errors import VerificationError

    fake_hub.add_folder("acme/minilm", minilm_dir)
    fake_hub.add_folder("acme/minilm-lora", lora_merged)
    fake_hub.fail("corrupt", "model.safetensors", times=1, method="GET")
    with pytest.raises(VerificationError, match="sha256"):
        _run("acme/minilm", "acme/minilm-lora")


@pytest.mark.slow  # the fine-tune: a minute or two of CPU
@pytest.mark.kernels  # scripts/test-slow runs it again on the numpy kernels
def test_hub_against_local(fake_hub, minilm_dir, fine_tuned, ft_result):
    fake_hub.add_folder("acme/minilm", minilm_dir)
    mixed = _run("acme/minilm", fine_tuned)
    assert mixed["matrices"] == ft_result["matrices"]


def test_one_side_fp8_block_quantized(minilm_dir, tmp_path):
    """The quantized side is dequantized while streaming exactly as `fit` does: against its float32 twin
    (the dequantized values written out) every tensor is unchanged; against the original, the change is
    the quantization error, as numpy computes it on the twin."""
    qdir, tdir = write_pair(tmp_path, minilm_dir, fp8_block(), FP8_BLOCK_CONFIG)
    twin = _run(tdir, qdir)
    linear = [m for m in twin["matrices"] if m["tuned_dtype"] != "F32"]
    assert len(linear) == 37 and all("FP8" in m["tuned_dtype"] or "fp8" in m["tuned_dtype"].lower() for m in linear)
    assert all(m["untouched"] and m["unchanged_fraction"] == 1.0 for m in twin["matrices"] + twin["vectors"])
    original = _run(minilm_dir, qdir)
    base = load_file(str(minilm_dir / "model.safetensors"))
    deq = load_file(str(tdir / "model.safetensors"))
    for m in original["matrices"]:
        b, t = base[m["name"]].double().numpy(), deq[m["name"]].double().numpy()
        assert m["relative_change"] == pytest.approx(np.linalg.norm(t - b) / np.linalg.norm(b), rel=1e-6)
        assert (
            m["unchanged_fraction"]
            == np.count_nonzero(base[m["name"]].view(torch.int32).numpy() == deq[m["name"]].view(torch.int32).numpy())
            / b.size
        )


def test_cli_json_and_gate_on_the_lora_pair(minilm_dir, lora_merged, tmp_path):
    wide = {"COLUMNS": "200"}
    db = tmp_path / "db"
    r = run_cli("diff", str(minilm_dir), str(lora_merged), "--json", "--db", str(db), "-q", env=wide)
    assert r.returncode == 0, r.stderr
    document = json.loads(r.stdout)
    assert document["schema"] == "weightdiag.diff/1"
    assert {"name", "relative_change", "cosine", "unchanged_fraction", "rank90"} <= set(document["matrices"][0])
    (saved,) = (db / "diffs").glob("*.json")
    assert json.loads(saved.read_text())["matrices"] == document["matrices"]
    assert not (db / "rows").exists() or not list((db / "rows").glob("*.json"))  # never among the fit rows
    # "blocks 0-1 must not change": q and v of every block did -> exit 1 naming them
    r = run_cli(
        "diff", str(minilm_dir), str(lora_merged), "--fail-above", "0", "--blocks", "0-1", "--no-save", env=wide
    )
    assert r.returncode == 1
    assert "FAIL: 4 of 32 tensors" in r.stdout and "encoder.layer.0.attention.self.query.weight" in r.stdout
    # only what LoRA did not touch: nothing moved
    r = run_cli(
        "diff", str(minilm_dir), str(lora_merged), "--fail-above", "0", "--exclude", "*.query.*",
        "--exclude", "*.value.*", "--no-save", env=wide,
    )  # fmt: skip
    assert r.returncode == 0 and "PASS" in r.stdout


def test_diff_tuned_alone_takes_the_base_from_the_model_card(fake_hub, minilm_dir, lora_merged, tmp_path):
    card = tmp_path / "card"
    shutil.copytree(lora_merged, card)
    (card / "README.md").write_text(f"---\nbase_model: {minilm_dir}\nlicense: apache-2.0\n---\n# a LoRA merge\n")
    local = diff(None, str(card), DiffOptions(device="cpu")).to_json()
    assert local["base"]["location"] == str(minilm_dir.resolve())
    assert len([m for m in local["matrices"] if m["low_rank"]]) == 12
    # on the Hub: the card names a Hub repo
    fake_hub.add_folder("acme/minilm", minilm_dir)
    (card / "README.md").write_text("---\nbase_model: acme/minilm\n---\n")
    fake_hub.add_folder("acme/minilm-lora", card)
    remote = diff(None, "acme/minilm-lora", DiffOptions(device="cpu")).to_json()
    assert remote["base"]["id"] == "acme/minilm" and remote["matrices"] == local["matrices"]
    # no card, or one without base_model: one line, exit 2
    from weightdiag.errors import OptionError

    with pytest.raises(OptionError, match="names no base_model"):
        diff(None, str(lora_merged), DiffOptions(device="cpu"))
