"""The local reader's two ways to a chunk, through the API: mapped under a read lease, or copied with pread.

    python benchmarks/bench_fit.py --scale 1 --repeat 1          # writes benchmarks/data/llama-d2048-L9-bf16
    python benchmarks/bench_reader.py benchmarks/data/llama-d2048-L9-bf16 [--pread] [--fits 5]

Prints the seconds of each fit (imports and tables warmed by a first fit of one layer). --pread forces the
fallback taken where no lease can be had. To compare with an older reader, run this file with PYTHONPATH set
to a checkout of that commit, alternating with this one (figures in RESULTS.md, issue 19).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--pread", action="store_true", help="copy every chunk with pread (no lease, no mapping)")
    parser.add_argument("--fits", type=int, default=5)
    args = parser.parse_args()
    if args.pread:
        import weightdiag.source.local_reader as local

        local.take_read_lease = lambda fd: False
    from weightdiag.api import fit_path
    from weightdiag.run.measure import FitOptions

    fit_path(args.model, FitOptions(device="cpu", include=["*.layers.0.*"]))
    seconds = []
    for _ in range(args.fits):
        started = time.perf_counter()
        fit_path(args.model, FitOptions(device="cpu"))
        seconds.append(time.perf_counter() - started)
    mode = "pread" if args.pread else "mapped"
    shown = " ".join(f"{s:.3f}" for s in seconds)
    print(f"{mode}: {shown}  min {min(seconds):.3f}  median {statistics.median(seconds):.3f}")


if __name__ == "__main__":
    main()
