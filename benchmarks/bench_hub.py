"""Benchmark streaming from a Hub: fit time against the time to just download the same bytes.

Serves the synthetic 1 GB BF16 checkpoint of bench_fit.py from the test suite's fake Hub on
loopback, throttled to a fixed bandwidth, and measures in one run:
  (d) downloading every shard whole with one plain GET each, bytes thrown away (no processing);
  (w) `weightdiag fit ORG/NAME --device cpu --no-save -q` streaming the same repo (a subprocess),
      with its peak RSS (VmHWM).
The target of issue 3 is w <= 1.15 d: reading and reducing overlap with the transfer.

    python benchmarks/bench_hub.py                       # 100 MB/s
    python benchmarks/bench_hub.py --bandwidth-mb 50 --size-gb 0.3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_fit import layers_for, make_checkpoint  # noqa: E402
from tests.hub_server import FakeHub  # noqa: E402

CHILD = """
import sys
from weightdiag.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    print('VmHWM', next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')), file=sys.stderr)
    raise
"""


def plain_download(hub: FakeHub, repo: str, files: list[str]) -> float:
    import httpx2

    start = time.perf_counter()
    with httpx2.Client(follow_redirects=True, timeout=600) as client:
        for name in files:
            with client.stream("GET", f"{hub.url}/{repo}/resolve/main/{name}") as response:
                for _ in response.iter_raw(1 << 20):
                    pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--bandwidth-mb", type=float, default=100.0, help="MB/s (10^6 bytes)")
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    args = parser.parse_args()

    folder = make_checkpoint(args.data, layers_for(args.size_gb * 1e9))
    repo = "bench/llama-synthetic"
    hub = FakeHub().start()
    try:
        hub.add_folder(repo, folder)
        hub.bandwidth = args.bandwidth_mb * 1e6
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
        total = sum((folder / s).stat().st_size for s in shards)
        download_s = plain_download(hub, repo, shards)
        with tempfile.TemporaryDirectory() as home:
            env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": home, "HF_HUB_DISABLE_TELEMETRY": "1",
                   "HF_HUB_OFFLINE": "0"}
            hub.reset_counters()
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, "fit", repo, "--device", "cpu", "--no-save", "-q"],
                                 capture_output=True, text=True, env=env, cwd=REPO)
            fit_s = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        peak = next(int(line.split()[1]) * 1024 for line in out.stderr.splitlines() if line.startswith("VmHWM"))
        result = {
            "checkpoint": folder.name,
            "bytes": total,
            "bandwidth_MBps": args.bandwidth_mb,
            "download_s": download_s,
            "weightdiag_fit_s": fit_s,
            "ratio": fit_s / download_s,
            "bytes_transferred_by_fit": hub.file_bytes_sent,
            "transfer_overhead": hub.file_bytes_sent / total - 1,
            "requests": len(hub.requests),
            "peak_rss": peak,
        }
        print(json.dumps(result, indent=1))
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
