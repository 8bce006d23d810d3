"""Vision towers in the report (Gemma-3 with a SigLIP tower, scaled down): their own section, never merged into
the language model's blocks, depth profile or super weights, whether a row marks them with the layout's note
(today) or with a `tower` field (rows written after the layout gains one)."""

from __future__ import annotations

import copy
import io

import pytest
from rich.console import Console

from weightdiag.diagnose.health import health_report
from weightdiag.diagnose.health.towers import split_towers, tower_of
from weightdiag.render.health_view import report_view
from weightdiag.render.html import render_html

from .report_checkpoints import VISION, VISION_OUTLIER, Gemma3Spec, write_gemma3

SPEC = Gemma3Spec()
TOWER_NAMES = ("vision_tower.", "multi_modal_projector.")


@pytest.fixture(scope="module")
def row(tmp_path_factory, cpu_fit) -> dict:
    # The tower holds the model's largest |w| by far (0.5 against ~0.09): it used to top the super weights.
    return cpu_fit(write_gemma3(tmp_path_factory.mktemp("gemma3"), SPEC, vision_outlier=0.5))


def _tensors_named(report: dict) -> set[str]:
    """Every tensor name the language-model sections of a report mention."""
    sw = report["super_weights"]
    names = {t["tensor"] for t in sw["top"]} | {b["tensor"] for b in sw["blocks"]}
    names |= {n for c in sw["channels"] for n in c["tensors"]}
    names |= {n for f in report["findings"] for n in f["tensors"]}
    names |= {k["tensor"] for b in report["blocks"] for k in b["kinds"].values()}
    names |= {v["name"] for v in report["norms"]["vectors"]}
    return names


def _assert_language_model_only(report: dict) -> None:
    assert [b["block"] for b in report["blocks"]] == list(range(SPEC.n_layers))
    assert not any(b["mtp"] for b in report["blocks"])  # the tower's layers 6-8 used to show as "(mtp)"
    assert report["architecture"]["mtp_blocks"] == []
    assert not [n for n in _tensors_named(report) if n.startswith(TOWER_NAMES)]
    assert report["depth"]["n_layers"] == SPEC.n_layers
    for s in report["depth"]["series"].values():
        assert s["blocks"] == list(range(SPEC.n_layers))
    # Block parameters are the text block's own: 7 matrices and 6 norm vectors.
    d, f, hd = SPEC.d_model, SPEC.ffn, SPEC.d_model // SPEC.n_heads
    assert report["blocks"][0]["params"] == 4 * d * d + 3 * d * f + 4 * d + 2 * hd


def _assert_tower_section(report: dict) -> None:
    towers = {t["tower"]: t for t in report["towers"]}
    assert set(towers) == {"vision_tower", "multi_modal_projector"}
    vision = towers["vision_tower"]
    assert vision["n_layers"] == SPEC.vision_layers
    assert [x["layer"] for x in vision["layers"]] == list(range(SPEC.vision_layers))
    assert all(x["matrices"] == 6 for x in vision["layers"])
    assert vision["outside_layers"]["matrices"] == 2  # patch and position embeddings
    assert vision["largest"]["tensor"] == VISION_OUTLIER
    assert vision["largest"]["abs_value"] == pytest.approx(0.5)
    assert vision["layers"][3]["max_over_q99"] > 5
    assert towers["multi_modal_projector"]["matrices"] == 1 and towers["multi_modal_projector"]["n_layers"] == 0
    lines = [o for o in report["observations"] if o.startswith("vision_tower (not the language model")]
    assert (
        len(lines) == 1 and "9 layers, 56 matrices" in lines[0] and "largest |w| 0.5 in mlp.fc2 (layer 3)" in lines[0]
    )


def test_towers_are_their_own_section(row):
    report = health_report(row)
    _assert_language_model_only(report)
    _assert_tower_section(report)
    assert report["findings"] == []  # a tower outlier is listed in its table, not a finding about a text block


def test_rows_with_a_tower_field_read_the_same(row):
    """After the layout records `tower` on each record (and may give tower matrices real kinds), the report is
    the same; a record whose field says None is the language model's, whatever its name."""
    future = copy.deepcopy(row)
    for rec in [*future["matrices"], *future["vectors"]]:
        tower = tower_of(rec)
        rec["tower"] = tower
        if tower:
            rec.pop("note", None)
            if rec["name"].endswith("self_attn.q_proj.weight"):
                rec["kind"] = "q"  # a real kind inside the tower must still stay out of the text blocks
    report = health_report(future)
    _assert_language_model_only(report)
    _assert_tower_section(report)
    assert tower_of({"name": "vision_tower.vision_model.x.weight", "tower": None}) is None
    assert tower_of({"name": "encoder.layers.0.fc1.weight", "tower": "audio_tower"}) == "audio_tower"
    assert tower_of({"name": "x.weight", "note": "buffer or scalar; visual (not the language model)"}) == "visual"
    assert tower_of({"name": "model.visual.blocks.0.attn.qkv.weight"}) == "visual"  # Qwen2.5-VL, no note
    assert tower_of({"name": "model.layers.0.mlp.down_proj.weight"}) is None


def test_a_row_without_towers_is_unchanged():
    row = {"matrices": [{"name": "model.layers.0.mlp.down_proj.weight"}], "vectors": []}
    kept, towers = split_towers(row)
    assert kept is row and towers == {}


def test_tower_tables_in_the_terminal_and_html(row):
    report = health_report(row)
    buffer = io.StringIO()
    Console(file=buffer, width=160, color_system=None).print(report_view(report))
    text = buffer.getvalue()
    assert "vision_tower (not the language model): 9 layers, 56 matrices" in text
    assert "(mtp)" not in text
    super_table = text[text.index("super-weight candidates") : text.index("vision_tower (not the language model):")]
    assert VISION not in super_table
    html = render_html(report, [])
    assert "<h2>vision_tower (not the language model)</h2>" in html
    assert "multi_modal_projector (not the language model)" in html


def test_non_finite_tower_weights_are_findings_without_a_text_block(row):
    broken = copy.deepcopy(row)
    rec = next(m for m in broken["matrices"] if m["name"] == VISION + "encoder.layers.2.mlp.fc1.weight")
    rec["stats"]["n_nan"] = 3
    report = health_report(broken)
    (f,) = report["findings"]
    assert f["category"] == "non-finite" and f["blocks"] == [] and f["tower"] == "vision_tower"
    assert f["text"].startswith("model vision_tower mlp.fc1: matrix ")
