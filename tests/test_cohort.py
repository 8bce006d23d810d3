"""The paper's numbers from the cohort data alone; compare, check and db end to end."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from weightdiag.diagnose import lambda_axis
from weightdiag.diagnose.classes import BAND, k_class
from weightdiag.diagnose.cohort import architecture_group, load_cohort
from weightdiag.diagnose.compare import compare
from weightdiag.diagnose.functions import (
    attention_arch,
    cross_family_band,
    k_drift,
    lambda_paired_correlation,
    lambda_scaling,
)

from .conftest import run_cli
from .docs_text import user_docs

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO.parent / "shared" / "reference"
PAPER_TABLE4 = {
    "pythia-70m": 0.0224,
    "pythia-160m": 0.0200,
    "pythia-410m": 0.0190,
    "pythia-1b": 0.0191,
    "pythia-6.9b": 0.0149,
}


def _pythia():
    return [r for r in load_cohort("v9_1") if r["model"]["id"].startswith("pythia")]


def test_the_cohort_is_complete_and_attributed():
    assert len(load_cohort("v9_1")) == 12
    assert len(load_cohort("qwen")) == 11
    for row in load_cohort("v9_1") + load_cohort("qwen"):
        assert row["schema"] == "weightdiag.row/1"
        assert row["model"]["source"] == "cohort"
        assert row["provenance"]["license"] == "CC BY 4.0"
        assert "Tiexin Ding" in row["provenance"]["copyright"]


def test_f4_every_entry_in_the_band_with_the_papers_cv():
    band = cross_family_band(load_cohort("v9_1"))
    assert len(band["entries"]) == 12
    for entry, k in band["entries"].items():
        assert 1.186 <= k <= 1.205, entry
    assert band["cv_percent"] < 0.6
    assert band["cv_percent"] == pytest.approx(0.461, abs=0.002)  # population std / mean
    assert band["cv_percent_sample"] == pytest.approx(0.482, abs=0.002)
    assert band["band"][0] == pytest.approx(1.1872, abs=1e-4)
    assert band["band"][1] == pytest.approx(1.2039, abs=1e-4)


def test_f5_lambda_scaling_from_the_csv_and_from_table4():
    fit = lambda_scaling(_pythia())
    assert fit["n"] == 5
    assert fit["slope"] == pytest.approx(0.0854, abs=5e-5)
    assert fit["pearson_r"] == pytest.approx(0.941, abs=5e-4)
    table4 = lambda_scaling(_pythia(), lambdas=PAPER_TABLE4)
    assert table4["slope"] == pytest.approx(0.0871, abs=5e-5)
    assert table4["pearson_r"] == pytest.approx(0.940, abs=5e-4)


PAPER_SELECTION = {  # paper Sec. 4.3: the class of each entry's Q/K (or fused W_qkv)
    "pythia-70m": "selection-mild",
    "pythia-160m": "selection-mild",
    "pythia-410m": "selection-mild",
    "pythia-1b": "selection-mild",
    "pythia-6.9b": "selection-mild",
    "olmo-1-7b": "selection-deep",
    "olmo-2-7b": "selection-deep",
    "llama-3-8b": "selection-mild",
    "mistral-7b": "selection-mild",
    "qwen2.5-7b": "selection-mild",
    "qwen2.5-14b": "selection-mild",
    "qwen3-8b": "selection-mild",
}


@pytest.mark.parametrize("entry", sorted(PAPER_SELECTION))
def test_selection_class_of_every_entry(entry):
    row = next(r for r in load_cohort("v9_1") if r["model"]["id"] == entry)
    kinds = [k for k in ("q", "k", "qkv") if k in row["kinds"]]
    assert kinds
    for kind in kinds:
        assert k_class(row["kinds"][kind]["k_median"]) == PAPER_SELECTION[entry], (entry, kind)
    report = compare(row)
    assert not report["selection"]["departs"]  # every entry matches its architecture group


def test_ffn_kinds_of_every_entry_are_transmission():
    for row in load_cohort("v9_1"):
        for kind in ("gate", "up", "down", "ffn_in", "ffn_out"):
            if kind in row["kinds"]:
                assert row["kinds"][kind]["k_class"] == "transmission", (row["model"]["id"], kind)
    assert BAND == (1.186, 1.204)


def test_f7_and_groups():
    groups = {r["model"]["id"]: architecture_group(r["architecture"]) for r in load_cohort("v9_1")}
    assert groups["pythia-410m"] == "MHA (fused qkv)"
    assert groups["olmo-2-7b"] == "MHA (separate Q/K)"
    assert groups["qwen2.5-7b"] == "GQA"
    smol = attention_arch({"n_heads": 9, "n_kv_heads": 3})
    assert (smol["label"], smol["heads"], smol["ratio"]) == ("GQA 3:1", "9:3", 3)
    assert attention_arch({"n_heads": 8, "n_kv_heads": 1})["type"] == "MQA"


def test_f6_and_f8():
    row = next(r for r in load_cohort("v9_1") if r["model"]["id"] == "olmo-1-7b")
    drift = k_drift(row)
    assert drift["k"]["delta_k"] == pytest.approx(0.7601 - 1.2054, abs=1e-3)
    assert drift["k"]["reference"].startswith("half-normal")
    init = {"kinds": {"k": {"k_median": 1.20}}}
    assert k_drift(row, init)["k"]["k_init"] == 1.20
    lam = np.array([0.01, 0.02, 0.03, 0.05])
    assert lambda_paired_correlation(lam, 1.3 * lam)["pearson_r_loglog"] == pytest.approx(1.0)


def test_lambda_axis_states_reproduce_the_papers_pythia_states():
    for row in _pythia():
        reported = row["hyperparameters"]["reported"]
        assert row["hyperparameters"]["state"] == reported["Physical_State"], row["model"]["id"]
        assert row["hyperparameters"]["t_over_tau"] == pytest.approx(reported["T_over_tau"], abs=6e-4)  # CSV: 3 digits
    hp = lambda_axis.resolve("EleutherAI/pythia-410m-deduped", "step3000")
    assert (hp.lr, hp.steps, hp.source) == (3e-4, 3000, "preset:pythia-410m + step 3000 from the revision")
    assert lambda_axis.state_of(hp.t_over_tau) == "Transition"
    assert lambda_axis.resolve("my/model").to_json()["state"] == "unknown"


@pytest.mark.parametrize("entry", [r["model"]["id"] for r in load_cohort("v9_1")])
def test_compare_on_a_cohort_entry_names_the_others_nearest(entry):
    from weightdiag.diagnose.compare import distance

    row = next(r for r in load_cohort("v9_1") if r["model"]["id"] == entry)
    assert distance(row, row)[0] == 0  # itself would be nearest, at 0: issue 11 asks for the others
    report = compare(row)
    assert report["nearest"]
    assert all(n["entry"] != entry and n["distance"] > 0 for n in report["nearest"])


def test_qwen_regime_test_on_fitted_matrices():
    from weightdiag.diagnose.compare import shallow_ffn_regime

    def matrix(kind, block, k):
        return {"kind": kind, "block": block, "fits": {"mid80": {"k": k, "ok": True}}}

    clean = {"matrices": [matrix("gate", b, 1.19) for b in range(12)]}
    bimodal = {"matrices": [matrix("gate", b, 0.55 if b == 2 else 1.19) for b in range(12)]}
    assert shallow_ffn_regime(clean)["regime"] == "A"
    assert shallow_ffn_regime(bimodal)["regime"] == "B"


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/reference is not beside the repo")
def test_shipped_cohort_rows_are_regenerated_identically(tmp_path):
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_cohort.py"),
            "--reference",
            str(REFERENCE),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    shipped = REPO / "weightdiag" / "data" / "cohort"
    for sub in ("v9_1", "qwen"):
        names = sorted(p.name for p in (shipped / sub).glob("*.json"))
        assert names == sorted(p.name for p in (tmp_path / sub).glob("*.json"))
        for name in names:
            assert (shipped / sub / name).read_text() == (tmp_path / sub / name).read_text(), name
    assert (REPO / "DATABASE" / "cohort" / "v9_1" / "pythia-70m.json").is_file()  # DATABASE/cohort links there


# --- the CLI -----------------------------------------------------------------------------------

BASELINE = REPO / "DATABASE" / "baselines" / "all-MiniLM-L6-v2.json"


@pytest.mark.e2e
def test_compare_cli_on_minilm_runs_end_to_end(minilm_dir, tmp_path):
    out = run_cli("compare", str(minilm_dir), "--db", str(tmp_path), "-q", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    for text in ("vs the 12-entry cohort", "Findings", "nearest cohort entry", "CC BY 4.0"):
        assert text in out.stdout
    out = run_cli("compare", str(minilm_dir), "--db", str(tmp_path), "--json", "-q", "--device", "cpu")
    (report,) = json.loads(out.stdout)  # a list, one report per model, even for one (issue 33)
    assert report["transmission"]["position"] == "below"
    assert report["group"] == "MHA (separate Q/K)"
    assert report["shallow_ffn"]["regime"] == "A"


@pytest.mark.e2e
def test_compare_cli_on_cohort_entries(tmp_path):
    out = run_cli("compare", "olmo-1-7b", "--json", "--db", str(tmp_path))
    (report,) = json.loads(out.stdout)
    both = json.loads(run_cli("compare", "olmo-1-7b", "pythia-70m", "--json", "--db", str(tmp_path)).stdout)
    assert [r["model"] for r in both] == ["olmo-1-7b", "pythia-70m"]  # the same shape for several
    assert report["model"] == "olmo-1-7b"
    assert report["nearest"]  # the others, never itself at distance 0
    assert all(n["entry"] != "olmo-1-7b" and n["distance"] > 0 for n in report["nearest"])
    assert run_cli("compare", "--db", str(tmp_path)).returncode == 2  # empty database: one-line error


@pytest.mark.e2e
def test_check_passes_on_the_shipped_minilm_baseline(minilm_dir, tmp_path):
    junit = tmp_path / "junit.xml"
    out = run_cli(
        "check",
        str(minilm_dir),
        "--baseline",
        str(BASELINE),
        "--junit",
        str(junit),
        "-q",
        "--db",
        str(tmp_path / "db"),
        "--device",
        "cpu",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("PASS: all 40 matrices")
    assert 'failures="0"' in junit.read_text()
    assert junit.read_text().count("<testcase") == 40
    assert not (tmp_path / "db").exists()  # check does not write rows unless --save


@pytest.mark.e2e
def test_check_fails_when_one_matrix_is_scaled(minilm_dir, tmp_path):
    copy = Path(shutil.copytree(minilm_dir, tmp_path / "minilm"))
    st = copy / "model.safetensors"
    blob = bytearray(st.read_bytes())
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    name = "encoder.layer.3.intermediate.dense.weight"
    start, end = (8 + n + o for o in header[name]["data_offsets"])
    values = np.frombuffer(bytes(blob[start:end]), dtype=np.float32) * np.float32(1.05)
    blob[start:end] = values.tobytes()
    st.write_bytes(bytes(blob))
    junit = tmp_path / "junit.xml"
    out = run_cli("check", str(copy), "--baseline", str(BASELINE), "--junit", str(junit), "-q", "--device", "cpu")
    assert out.returncode == 1, out.stdout + out.stderr
    assert name in out.stdout
    assert "moved" in out.stdout
    # The README quotes this run's lambda change; it must be what `check` prints (issue 11: +4.951%).
    claimed = re.search(r"matrix \(λ ([+-][\d.]+%)[:)]", user_docs())
    assert claimed, out.stdout
    assert claimed.group(1) in out.stdout, out.stdout
    xml = junit.read_text()
    assert 'failures="1"' in xml
    assert name in xml


@pytest.mark.e2e
def test_check_refuses_a_summary_baseline(minilm_dir):
    cohort_file = REPO / "DATABASE" / "cohort" / "v9_1" / "pythia-70m.json"
    out = run_cli("check", str(minilm_dir), "--baseline", str(cohort_file), "-q", "--device", "cpu")
    assert out.returncode == 2
    assert "no per-matrix fits" in out.stderr


@pytest.mark.e2e
def test_db_list_show_export(minilm_dir, tmp_path):
    db = tmp_path / "db"
    assert run_cli("fit", str(minilm_dir), "--db", str(db), "-q", "--device", "cpu").returncode == 0
    listing = json.loads(run_cli("db", "list", "--db", str(db), "--json").stdout)
    assert len(listing) == 12 + 11 + 1
    assert json.loads(run_cli("db", "list", "--db", str(db), "--json", "--fitted").stdout)[0]["matrices"] == 40
    shown = run_cli("db", "show", "pythia-160m", "--db", str(db))
    assert shown.returncode == 0
    assert "qkv" in shown.stdout
    assert "CC BY 4.0" in shown.stdout
    assert (
        json.loads(run_cli("db", "show", "all-MiniLM-L6-v2", "--db", str(db), "--json").stdout)["model"]["source"]
        == "local"
    )
    csv_text = run_cli("db", "export", "--format", "csv", "--db", str(db)).stdout
    assert csv_text.splitlines()[0].startswith("id,revision,source")
    assert len(csv_text.splitlines()) == 25
    out_file = tmp_path / "rows.jsonl"
    assert run_cli("db", "export", "--format", "jsonl", "--output", str(out_file), "--db", str(db)).returncode == 0
    assert len(out_file.read_text().splitlines()) == 24
    assert run_cli("db", "show", "no-such-model", "--db", str(db)).returncode == 2
    assert run_cli("db", "export", "--format", "xml", "--db", str(db)).returncode == 2


def test_compare_reads_a_row_fitted_at_another_trim_at_the_cohorts_mid80():
    from weightdiag.diagnose.compare import compare
    from weightdiag.diagnose.kinds import at_trim

    row = json.loads(BASELINE.read_text())
    assert at_trim(row, "mid80") is row
    mid90 = at_trim(row, "mid90")
    assert mid90["protocol"]["trim"] == "mid90"
    assert mid90["kinds"]["ffn_in"]["k_median"] != row["kinds"]["ffn_in"]["k_median"]
    assert compare(mid90)["kinds"] == compare(row)["kinds"]


@pytest.mark.e2e
def test_check_refuses_bad_tolerances(minilm_dir):
    for flag, value in (("--tol-k", "nan"), ("--tol-lambda", "-0.1"), ("--tol-k", "inf")):
        out = run_cli("check", str(minilm_dir), "--baseline", str(BASELINE), flag, value, "-q")
        assert out.returncode == 2, out.stderr
        assert flag in out.stderr, out.stderr


def test_compare_names_cohort_entries_as_db_show_does():
    """Exact ids first (DATABASE_v9_1's qwen3-8b and the companion's Qwen3-8B are two entries); an id
    equal to several only when ignoring case is refused, listing them."""
    from weightdiag import api
    from weightdiag.database.store import AmbiguousRowError

    assert api.compare(["Qwen3-8B"])[0]["model"] == "Qwen3-8B"
    assert api.compare(["qwen3-8b"])[0]["model"] == "qwen3-8b"
    with pytest.raises(AmbiguousRowError, match="Qwen3-8B"):
        api.compare(["QWEN3-8B"])


def test_check_with_nothing_comparable_is_bad_input_not_a_regression(minilm_dir, tmp_path):
    """A cohort summary, or a baseline of another model (no matrix name in common): exit 2, not 1."""
    out = run_cli("check", "pythia-70m", "--baseline", str(BASELINE), "-q", "--device", "cpu")
    assert out.returncode == 2, out.stdout
    assert "no per-matrix fits" in out.stderr
    other = tmp_path / "other.json"
    row = json.loads(BASELINE.read_text())
    for m in row["matrices"]:
        m["name"] = "bert." + m["name"]
    other.write_text(json.dumps(row))
    out = run_cli("check", str(minilm_dir), "--baseline", str(other), "-q", "--device", "cpu")
    assert out.returncode == 2, out.stdout
    assert "share no matrix name" in out.stderr
