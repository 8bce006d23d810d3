"""The Hub reader's transfer alone: every shard of bench_hub.py's checkpoint A read through RangedFile in 16 MiB
ranged GETs on N threads, into reused buffers, from nginx behind the fake Hub's 302 (bench_hub_origin.Nginx);
no hashing, no fitting. Each variant in its own subprocess (this checkout, and --before DIR's code), interleaved,
--repeat times: wall seconds, GB/s and the subprocess's CPU seconds (user + sys) for the reads only.

    python benchmarks/bench_hub_transfer.py --before /tmp/weightdiag-main --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import bench_hub, bench_hub_origin  # noqa: E402
from tests.hub_server import FakeHub  # noqa: E402

CHILD = """
import json, os, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from huggingface_hub.utils import get_session
from weightdiag.source.ranged import Concurrency, RangedFile, RetryPolicy
endpoint, threads, files = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
chunk, policy, concurrency = 16 << 20, RetryPolicy(), Concurrency(threads)
remotes = [RangedFile(f"{endpoint}/{repo}/resolve/main/{name}", size, get_session(), {}, name)
           for repo, name, size in files]
for r in remotes:
    r.read(0, np.empty(4096, np.uint8), policy, concurrency)  # the 302, as planning does
jobs = [(r, a, min(chunk, r.size - a)) for r in remotes for a in range(0, r.size, chunk)]
buffers = [np.empty(chunk, np.uint8) for _ in range(threads)]
def job(i):
    r, a, n = jobs[i]
    r.read(a, buffers[i % threads][:n], policy, concurrency)
usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
with ThreadPoolExecutor(threads) as pool:
    list(pool.map(job, range(len(jobs))))
seconds, end = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
cpu = end.ru_utime - usage.ru_utime + end.ru_stime - usage.ru_stime
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "bytes": sum(r.size for r in remotes)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the code before, measured too")
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    args = parser.parse_args()
    folder = bench_hub.ensure_checkpoint(args.data, bench_hub.checkpoint_a(1.0))
    shards = bench_hub.shard_files(folder)
    hub = FakeHub().start()
    variants = {"after": str(REPO)} | ({"before": str(args.before.resolve())} if args.before else {})
    results: dict[str, list[dict]] = {k: [] for k in variants}
    try:
        hub.add_folder("bench/A", folder)
        lfs = [hub.blob("bench/A", p.name) for p in sorted(folder.iterdir())]
        blobs = {b.sha256: folder / p.name for b, p in zip(lfs, sorted(folder.iterdir()), strict=True) if b.lfs}
        bench_hub.warm_page_cache(folder)
        nginx = bench_hub_origin.Nginx(blobs, 20e6)
        hub.cdn_origin = nginx.url(False)
        files = json.dumps([("bench/A", p.name, p.stat().st_size) for p in shards])
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        try:
            for _ in range(args.repeat):
                for name, path in variants.items():
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, hub.url, str(args.threads), files],
                        env={**env, "PYTHONPATH": path},
                        cwd=path,  # `python -c` puts the cwd before PYTHONPATH
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    results[name].append(json.loads(out.stdout))
        finally:
            nginx.stop()
    finally:
        hub.stop()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.threads} threads; {shards and len(shards)} shards")
    print("| code | seconds (each) | GB/s | CPU s per GB |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        gb = runs[0]["bytes"] / 1e9
        cpu = statistics.median(r["cpu_s"] for r in runs) / gb
        each = [round(r["seconds"], 2) for r in runs]
        print(f"| {name} | {seconds:.2f} ({each}) | {gb / seconds:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
