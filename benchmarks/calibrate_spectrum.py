"""The null model behind the report's spectrum rules (weightdiag/diagnose/health/spectrum.py): WeightWatcher's
alpha and the Marchenko-Pastur spike count of i.i.d. Gaussian matrices of several shapes, many seeds.

    python benchmarks/calibrate_spectrum.py [--seeds 30]

prints, per shape, the smallest and median alpha, the share above 6 and the largest spike count (2-core
machine: about 4 minutes for 30 seeds). Measured (30 seeds, 270 matrices; docs/spectrum.md):

    384 x 384     min 4.37  median 7.39  >6 0.67  spikes 0
    768 x 768     min 5.34  median 10.48 >6 0.93  spikes 0
    1024 x 1024   min 4.47  median 12.23 >6 0.97  spikes 0
    768 x 3072    min 6.45  median 13.43 >6 1.00  spikes 0
    3072 x 768    min 8.01  median 13.72 >6 1.00  spikes 0
    512 x 2048    min 6.77  median 12.88 >6 1.00  spikes 0
    2048 x 512    min 6.08  median 11.85 >6 1.00  spikes 0
    1024 x 4096   min 7.68  median 16.92 >6 1.00  spikes 0
    3072 x 384    min 7.35  median 12.59 >6 1.00  spikes 0
"""

from __future__ import annotations

import argparse

import numpy as np

from weightdiag.fit.esd import fit_spectrum
from weightdiag.reduce.gram import matrix_eigenvalues

SHAPES = [(384, 384), (768, 768), (1024, 1024), (768, 3072), (3072, 768), (512, 2048), (2048, 512), (1024, 4096)]
SHAPES += [(3072, 384)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    args = parser.parse_args()
    for m, n in SHAPES:
        alphas, spikes = [], []
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, m, n])
            w = rng.standard_normal((m, n), dtype=np.float32) * np.float32(0.02)
            fit = fit_spectrum(matrix_eigenvalues(w), m, n)
            alphas.append(fit.alpha)
            spikes.append(fit.num_spikes)
        a = np.array(alphas)
        print(
            f"{m} x {n}".ljust(13),
            f"min {a.min():.2f}  median {np.median(a):.2f}  >6 {np.mean(a > 6):.2f}  spikes {max(spikes)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
