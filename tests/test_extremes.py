"""Issue 40: whether outliers and super weights survived a quantization, and the change of the Weibull k and of
alpha, per matrix of `diff BASE QUANTIZED`. The streamed top-k sets against numpy's sort of the whole matrix
(every storage dtype, NaN and Inf left out, any block cut); null cases (an identical copy, an absmax int4 code:
every outlier kept) and planted ones (a quantizer that clips the tails: the planted super weight lost, named); the
cohort's GGUF files, made by gguf-py's quantizers, diffed on exactly the values gguf-py dequantizes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from weightdiag.delta import extremes
from weightdiag.delta.forensics import power_alpha
from weightdiag.delta.measures import Side
from weightdiag.delta.result import DiffOptions
from weightdiag.fit.esd import fit_power_law
from weightdiag.run.diff import diff

from .conftest import run_cli
from .diff_checkpoints import base_tensors, write, write_gguf

DOWN = "model.layers.{}.mlp.down_proj.weight"
SUPER_AT = (1, 5, 17)  # layer, row, column of the planted super weight


def _side(values: np.ndarray, dtype: str) -> Side:
    """A block as the diff's reader hands it over: stored codes, or float32 values of a decoded side."""
    if dtype == "BF16":
        return Side("BF16", torch.from_numpy(values).bfloat16().view(torch.uint16).numpy().reshape(-1))
    if dtype == "F16":
        return Side("F16", values.astype(np.float16).reshape(-1))
    if dtype == "decoded":
        return Side("F32", None, values.astype(np.float32).reshape(-1))
    return Side(dtype, values.astype(np.float32 if dtype == "F32" else np.float64).reshape(-1))


def _value(side: Side) -> np.ndarray:
    return np.asarray(side.values, dtype=np.float64)


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32", "F64", "decoded"])
@pytest.mark.parametrize("rows", [1, 64, 256])  # blocks of 512 elements (read whole), 32 K and 128 K (by slices)
def test_the_streamed_top_entries_are_numpys_largest(dtype, rows):
    rng = np.random.default_rng(7)
    m, n = 256, 512
    base = rng.standard_normal((m, n)).astype(np.float32)
    base[10, 3], base[20, 47] = np.nan, np.inf  # left out (their blocks read whole)
    base[200, 2] = -9.0  # the largest finite |w|, negative
    base[150, 5] = base[160, 6] = 7.0  # a tie: the earlier position first
    base[100, 100] = -7.0  # and another, of the other sign
    tuned = base + 0.01 * rng.standard_normal(base.shape).astype(np.float32)
    acc = extremes.Accumulator(n, k=6)
    for r0 in range(0, m, rows):
        b, t = _side(base[r0 : r0 + rows], dtype), _side(tuned[r0 : r0 + rows], dtype)
        acc.fold(extremes.block_part(b, t, r0 * n, k=6))
    whole_b, whole_t = _value(_side(base, dtype)), _value(_side(tuned, dtype))
    mag = np.where(np.isfinite(whole_b), np.abs(whole_b), -1)
    expected = np.lexsort((np.arange(mag.size), -mag))[:6]
    got = acc.result(1.0)
    assert [e.index for e in got.base_top] == list(expected)
    assert got.base_top[0].index == 200 * n + 2 and got.base_top[1].index == 100 * n + 100
    assert [e.base for e in got.base_top] == list(whole_b[expected])
    assert [e.tuned for e in got.base_top] == list(whole_t[expected])
    mag_t = np.where(np.isfinite(whole_t), np.abs(whole_t), -1)
    assert [e.index for e in got.tuned_top] == list(np.lexsort((np.arange(mag_t.size), -mag_t))[:6])


def test_a_block_of_one_repeated_value_gives_its_first_positions():
    codes = np.full(1 << 16, 0x3F80, dtype=np.uint16)  # BF16 1.0 everywhere: every slice ties
    codes[5000] = 0xBF80  # -1.0: the same magnitude
    assert list(extremes.top_indices(Side("BF16", codes), k=4)) == [0, 1, 2, 3]


def test_survival_is_sign_and_ten_percent():
    assert extremes.survived(extremes.Entry(0, 2.0, 2.0))
    assert extremes.survived(extremes.Entry(0, -2.0, -1.81))
    assert not extremes.survived(extremes.Entry(0, 2.0, 1.79))  # clipped by 10.5%
    assert not extremes.survived(extremes.Entry(0, 2.0, -2.0))
    assert not extremes.survived(extremes.Entry(0, 2.0, 0.0))


def test_alpha_is_weightwatchers_fit_of_the_squared_singular_values():
    w = np.random.default_rng(1).standard_normal((96, 64)) @ np.diag(np.linspace(1, 10, 64) ** 1.5)
    s = np.linalg.svd(w, compute_uv=False)
    assert power_alpha(s) == fit_power_law(s**2).alpha


def _int4(w: np.ndarray, group: int = 32) -> np.ndarray:
    """Symmetric absmax int4 per group: a group's largest entry is stored exactly (up to float32 rounding)."""
    rows, cols = w.shape
    x = w.reshape(rows, cols // group, group).astype(np.float64)
    scale = np.abs(x).max(axis=-1, keepdims=True) / 7
    return (np.clip(np.round(x / scale), -8, 7) * scale).reshape(rows, cols).astype(np.float32)


def _clip(w: np.ndarray) -> np.ndarray:
    """A quantizer that clips the tails at 4 RMS (as percentile-clipping calibrations do)."""
    c = 4 * float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    return np.clip(w, -c, c)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("extremes")
    base = base_tensors()
    layer, row, col = SUPER_AT
    base[DOWN.format(layer)][row, col] = 2.0  # 100 x the RMS (0.02): a super weight
    quantizable = [k for k, v in base.items() if v.ndim == 2 and "embed" not in k and "lm_head" not in k]
    return {
        "base": write(root / "base", base),
        "identical": write(root / "identical", base),
        "int4": write(root / "int4", {k: (_int4(v) if k in quantizable else v) for k, v in base.items()}),
        "clipped": write(root / "clipped", {k: (_clip(v) if k in quantizable else v) for k, v in base.items()}),
    }


@pytest.mark.parametrize("name", ["identical", "int4"])
def test_every_outlier_and_the_super_weight_survive_an_identical_copy_and_an_absmax_code(pairs, name):
    result = diff(str(pairs["base"]), str(pairs[name]), DiffOptions(device="cpu"))
    s = result.survival
    assert s is not None and s["outliers"] >= 1 and s["outliers_survived"] == s["outliers"] and not s["lost"]
    top = s["super_weights"][0]
    assert (top["name"], top["row"], top["col"]) == (DOWN.format(SUPER_AT[0]), *SUPER_AT[1:])
    assert top["survived"] and top["base"] == pytest.approx(2.0)
    for t in result.matrices:  # an int4 code may round another entry above a matrix's largest one ...
        assert t.extremes is not None and (t.extremes.top_kept or name == "int4")
    planted = next(t for t in result.matrices if t.name == DOWN.format(SUPER_AT[0]))
    assert planted.extremes is not None and planted.extremes.top_kept  # ... but not above a super weight
    if name == "identical":
        assert s["delta_k_median"] == 0 and s["delta_alpha_median"] == 0 and s["delta_alpha_max_abs"] == 0


def test_a_clipping_quantizer_loses_the_super_weight_and_says_where(pairs):
    done = run_cli("diff", str(pairs["base"]), str(pairs["clipped"]), "--json", "--no-save")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    s = doc["survival"]
    assert s["outliers_survived"] < s["outliers"]
    lost = s["lost"][0]
    where = (DOWN.format(SUPER_AT[0]), *SUPER_AT[1:], False)
    assert (lost["name"], lost["row"], lost["col"], lost["survived"]) == where
    assert 0 < lost["tuned"] < 0.1 * lost["base"]  # clipped to 4 RMS (0.09 of 2.0)
    assert s["super_weights_survived"] < len(s["super_weights"])
    record = next(m for m in doc["matrices"] if m["name"] == DOWN.format(SUPER_AT[0]))["extremes"]
    assert record["base_top"][0]["row"] == SUPER_AT[1] and not record["base_top"][0]["survived"]
    assert record["outliers"] >= 1 and record["survived"] < record["outliers"]
    f = next(m for m in doc["matrices"] if m["name"] == DOWN.format(SUPER_AT[0]))["forensics"]
    assert f["delta_alpha"] == pytest.approx(f["alpha_tuned"] - f["alpha_base"])
    text = run_cli("diff", str(pairs["base"]), str(pairs["clipped"]), "--no-save")
    words = " ".join(text.stdout.split())
    assert f"outliers (|w| > 6 RMS): {s['outliers_survived']} of {s['outliers']} kept" in words


def test_without_the_spectrum_the_outliers_are_still_tracked(pairs):
    result = diff(str(pairs["base"]), str(pairs["clipped"]), DiffOptions(device="cpu", spectrum=False))
    s = result.survival
    assert s is not None and s["lost"] and s["delta_alpha_median"] is None


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "MXFP4"])
def test_a_gguf_made_by_gguf_py_is_diffed_on_the_values_gguf_py_dequantizes(tmp_path, qtype):
    """The cohort's GGUF members (benchmarks/quant_cohort.py): written by gguf-py's own quantizer under the base's
    tensor names; the diff's relative error per matrix equals numpy's on gguf-py's dequantized values."""
    pytest.importorskip("gguf")
    base = base_tensors()
    write(tmp_path / "base", base)
    back = write_gguf(tmp_path / "model.gguf", base, qtype, lambda name, w: w.ndim == 2, arch="bert")
    norm = np.linalg.norm
    expected = {name: norm(v - base[name]) / norm(base[name].astype(np.float64)) for name, v in back.items()}
    result = diff(str(tmp_path / "base"), str(tmp_path / "model.gguf"), DiffOptions(device="cpu", spectrum=False))
    got = {t.name: t.relative_change for t in result.matrices}
    assert set(got) == set(expected)
    for name, rel in expected.items():
        assert got[name] == pytest.approx(rel, rel=1e-6), name
