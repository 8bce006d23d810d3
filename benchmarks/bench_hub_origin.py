"""Benchmark the Hub path from a fast origin: the fake Hub redirects every shard to nginx, as huggingface.co does
to its CDN.

The loopback fake Hub of the test suite (tests/hub_server.py) answers the metadata and each LFS file's /resolve
with a 302 to `http://127.0.0.1:PORT/<sha256>` (FakeHub.cdn_origin), served by nginx from Debian's packages
(`apt-get install nginx-light`), started here with a temporary configuration: one worker, sendfile, byte ranges,
keep-alive, no logs; a second port caps every request at --cap-mb MB/s (`limit_rate`, one request at a time
per connection: a per-connection cap, as CDN edges have). Checkpoint A of bench_hub.py (1.26 GB BF16, 4
shards, 524 MB embeddings). In one interleaved run, --repeat times each:

  curl -o /dev/null http://127.0.0.1:PORT/<largest shard>     one stream straight from nginx, no Hub
  hf download REPO --local-dir TMP                           huggingface_hub's CLI (8 workers, one GET per file)
  weightdiag fit REPO --device cpu --no-save -q --json       this checkout; every shard's sha256 verified
  the same with --before DIR's weightdiag                    (a checkout of the code before, for the ratio)

first uncapped, then with the cap (hf download and the fits). Wall seconds of each subprocess, its peak RSS
(VmHWM), median over the repeats; bytes/s = shard bytes / seconds. Prints JSON and a markdown section for
benchmarks/RESULTS.md.

    python benchmarks/bench_hub_origin.py --before /tmp/weightdiag-main --repeat 3
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import bench_hub  # noqa: E402
from tests.hub_server import FakeHub  # noqa: E402

NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    keepalive_timeout 120s;
    default_type application/octet-stream;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{ listen 127.0.0.1:{port}; root {root}; }}
    server {{ listen 127.0.0.1:{capped_port}; root {root}; limit_rate {cap}; }}
}}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx:
    """nginx on loopback serving `files` (name -> path, linked into a folder), uncapped and capped ports."""

    def __init__(self, files: dict[str, Path], cap: float) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(binary).exists():
            raise SystemExit("bench_hub_origin: nginx not found (Debian: apt-get install -y nginx-light)")
        self.tmp = Path(tempfile.mkdtemp(prefix="bench_hub_origin-"))
        root = self.tmp / "root"
        root.mkdir()
        for name, path in files.items():
            (root / name).symlink_to(path.resolve())
        os.chmod(self.tmp, 0o755)  # nginx's worker may run as another user
        self.port, self.capped_port = free_port(), free_port()
        user = "user root;" if os.geteuid() == 0 else ""  # a root master's workers read the files as root
        conf = self.tmp / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(
                user=user, tmp=self.tmp, port=self.port, capped_port=self.capped_port, root=root, cap=int(cap)
            )
        )
        self.process = subprocess.Popen([binary, "-c", str(conf), "-p", str(self.tmp)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not self._up():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench_hub_origin: nginx did not start: {self.process.stderr.read().decode()}")
            time.sleep(0.05)

    def _up(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.capped_port), timeout=0.2):
                return True
        except OSError:
            return False

    def url(self, capped: bool) -> str:
        return f"http://127.0.0.1:{self.capped_port if capped else self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def curl(url: str) -> float:
    start = time.perf_counter()
    subprocess.run(["curl", "-sS", "--fail", "-o", "/dev/null", url], check=True)
    return time.perf_counter() - start


def fit(hub: FakeHub, repo: str, folder: Path, pythonpath: str | None, timeout: float) -> bench_hub.Run:
    """bench_hub.weightdiag_fit, with PYTHONPATH pointing at another checkout when given."""
    saved, cwd = os.environ.get("PYTHONPATH"), bench_hub.REPO
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
        bench_hub.REPO = Path(pythonpath)  # run_script's cwd: `python -c` puts the cwd before PYTHONPATH
    try:
        return bench_hub.weightdiag_fit(hub, repo, folder, None, timeout)
    finally:
        bench_hub.REPO = cwd
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def cpu_seconds(call):
    """call()'s result, with the user + system CPU seconds of the subprocesses it waited for set on it as .cpu_s
    (load-independent, unlike wall seconds on a shared machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = call()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return run


def median(runs: list[bench_hub.Run], total: int) -> dict[str, object]:
    seconds = statistics.median(r.seconds for r in runs)
    peaks = [r.peak_rss for r in runs if r.peak_rss is not None]
    return {
        "seconds": seconds,
        "runs_s": [round(r.seconds, 3) for r in runs],
        "cpu_s": statistics.median(r.cpu_s for r in runs),  # type: ignore[attr-defined]
        "GBps": total / seconds / 1e9,
        "peak_rss": max(peaks) if peaks else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mb", type=float, default=20.0, help="MB/s (10^6 bytes) per connection, capped runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="shrink checkpoint A about this many times")
    parser.add_argument("--before", type=Path, help="a checkout of the code before: its fit is measured too")
    parser.add_argument("--no-capped", action="store_true", help="skip the capped runs")
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--json", type=Path, help="write the JSON summary here too")
    args = parser.parse_args()
    bench_hub.console_script("hf")
    bench_hub.console_script("weightdiag")
    info = bench_hub.machine()
    ckpt = bench_hub.checkpoint_a(args.scale)
    args.data.mkdir(parents=True, exist_ok=True)
    folder = bench_hub.ensure_checkpoint(args.data, ckpt)
    shards = bench_hub.shard_files(folder)
    total = sum(p.stat().st_size for p in shards)
    repo = f"bench/{folder.name}"
    hub = FakeHub().start()
    variants = {"after": str(REPO)} | ({"before": str(args.before.resolve())} if args.before else {})
    runs: dict[str, list] = {}
    try:
        hub.add_folder(repo, folder)
        blobs = {hub.blob(repo, p.name).sha256: p for p in sorted(folder.iterdir()) if hub.blob(repo, p.name).lfs}
        bench_hub.warm_page_cache(folder)
        nginx = Nginx(blobs, args.cap_mb * 1e6)
        largest = max(blobs, key=lambda sha: blobs[sha].stat().st_size)  # a shard
        try:
            for capped in (False, True) if not args.no_capped else (False,):
                hub.cdn_origin = nginx.url(capped)
                timeout = 600 + (20 * total / (args.cap_mb * 1e6) if capped else 0)
                tag = "capped" if capped else "uncapped"
                for i in range(args.repeat):
                    if not capped:
                        print(f"  curl ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
                        runs.setdefault("curl", []).append(curl(f"{nginx.url(False)}/{largest}"))
                    print(f"  {tag}: hf download ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
                    runs.setdefault(f"{tag} hf", []).append(
                        cpu_seconds(functools.partial(bench_hub.hf_download, hub, repo, folder, timeout))
                    )
                    for name, path in variants.items():
                        print(f"  {tag}: fit {name} ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
                        runs.setdefault(f"{tag} fit {name}", []).append(
                            cpu_seconds(functools.partial(fit, hub, repo, folder, path, timeout))
                        )
        finally:
            nginx.stop()
    finally:
        hub.stop()
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    largest_bytes = blobs[largest].stat().st_size
    results: dict[str, object] = {
        "curl": {
            "bytes": largest_bytes,
            "runs_s": [round(t, 3) for t in runs["curl"]],
            "GBps": largest_bytes / statistics.median(runs["curl"]) / 1e9,
        }
    }
    for key, value in runs.items():
        if key != "curl":
            results[key] = median(value, total)
    summary = {
        "command": shlex.join(["python", "benchmarks/bench_hub_origin.py", *sys.argv[1:]]),
        "machine": info,
        "bytes": total,
        "shards": len(shards),
        "cap_MBps": args.cap_mb,
        "results": results,
    }
    print(json.dumps(summary, indent=1))
    print()
    print(markdown(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


def markdown(summary: dict) -> str:
    m, r = summary["machine"], summary["results"]
    lines = [
        f"Command: `{summary['command']}` ({m['date']}; {m['cpu']}, {m['cores']} cores, {m['memory']}; load "
        f"average {m['load_average_start'][0]} at the start, {m['load_average_end'][0]} at the end; weightdiag at "
        f"{m['commit']}). {summary['bytes'] / 1e9:.2f} GB in {summary['shards']} shards.",
        "",
        "| run | seconds (each) | GB/s | CPU seconds (user + sys) | peak RSS |",
        "|---|---|---|---|---|",
        f"| curl of one shard ({r['curl']['bytes'] / 1e6:.0f} MB), one stream | {r['curl']['runs_s']} "
        f"| {r['curl']['GBps']:.2f} | - | - |",
    ]
    for key, v in r.items():
        if key == "curl":
            continue
        rss = f"{v['peak_rss'] / 1e6:.0f} MB" if v["peak_rss"] else "-"
        lines.append(f"| {key} | {v['seconds']:.2f} ({v['runs_s']}) | {v['GBps']:.3f} | {v['cpu_s']:.2f} | {rss} |")
    for tag in ("uncapped", "capped"):
        hf, after = r.get(f"{tag} hf"), r.get(f"{tag} fit after")
        if hf and after:
            lines.append(f"\n{tag}: fit / hf download time = {after['seconds'] / hf['seconds']:.2f}")
        before = r.get(f"{tag} fit before")
        if before and after:
            lines.append(
                f"{tag}: fit after / before bytes/s = {before['seconds'] / after['seconds']:.2f}, CPU seconds "
                f"before / after = {before['cpu_s'] / after['cpu_s']:.2f}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
