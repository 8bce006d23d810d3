"""How far each changed matrix's ΔW stands out of rounding noise: the `quantized` verdict's noise edge (issue 40).

For each BASE,TUNED pair given, `weightdiag diff` (with the spectrum) and, over the changed matrices that vote
(not embeddings or heads, both sides >= 16), delta/mechanism.py's `noise_excess`: ΔW's top singular value over
the larger of the Marchenko-Pastur edge ||ΔW||_F (sqrt(m) + sqrt(n)) / sqrt(mn) and ΔW's largest row or column
norm. Prints the verdict, the median and largest excess, and how many matrices exceed 2 and NOISE_EDGE.

    python benchmarks/noise_edge.py BASE,TUNED [BASE,TUNED ...]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from weightdiag.delta import mechanism  # noqa: E402
from weightdiag.delta.result import DiffOptions  # noqa: E402
from weightdiag.run.diff import diff  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    pairs = argv if argv is not None else sys.argv[1:]
    if not pairs or any(p.count(",") != 1 for p in pairs):
        sys.exit("usage: python benchmarks/noise_edge.py BASE,TUNED [BASE,TUNED ...]")
    print(f"| tuned | verdict | median excess | largest | > 2 | > {mechanism.NOISE_EDGE:g} | matrices |")
    print("|---|---|---|---|---|---|---|")
    for pair in pairs:
        base, tuned = pair.split(",")
        result = diff(base, tuned, DiffOptions(device="cpu"))
        excess = sorted(
            x
            for t in result.matrices
            if not t.untouched and t.kind not in ("embed", "unembed") and (x := mechanism.noise_excess(t)) is not None
        )
        if not excess:
            print(f"| {tuned} | {result.mechanism.verdict} | - | - | - | - | 0 |")
            continue
        above = sum(x > mechanism.NOISE_EDGE for x in excess)
        print(
            f"| {tuned} | {result.mechanism.verdict} | {statistics.median(excess):.2f} | {excess[-1]:.2f} | "
            f"{sum(x > 2 for x in excess)} | {above} | {len(excess)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
