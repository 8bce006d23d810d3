"""Benchmark `weightdiag fit --executor ray` (issue 30): one checkpoint from a Hub, fitted by 1, 2 and 3 nodes.

A synthetic BF16 checkpoint (written once under --data) is served by the test suite's fake Hub
(tests/hub_server.py) from this process on loopback, each TCP connection's file bodies capped at --cap-mb
MB/s (FakeHub.connection_bandwidth, as CDN edges cap each connection). A real Ray cluster of N nodes runs on
loopback (tests/ray_cluster.py: `ray start` nodes with their own temp dirs, one CPU each, so each node runs one
task at a time with --connections ranged GETs: the per-node connection limit). Measured, each command a
subprocess with a fresh HF_HOME and the same --connections:
  weightdiag fit REPO --no-save -q --json                                  one machine (the baseline)
  weightdiag fit REPO --no-save -q --json --executor ray --ray-address A   on 1, 2 and 3 nodes
with wall seconds, the driver's peak RSS (VmHWM of the `weightdiag` process: the machine that plans and folds,
never reads a weight byte), the rows checked byte-identical to the baseline's (all but `created` and `run`,
every shard verified), and how the tasks spread over the nodes (the row's run.cluster). Derived: throughput
(shard bytes / seconds) and its ratio to one node's.

    python benchmarks/bench_ray.py                      # 300 MB in 6 shards, 10 MB/s per connection, 2 each
    python benchmarks/bench_ray.py --nodes 1,3 --cap-mb 20 --connections 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_hub import (  # noqa: E402
    MB,
    Run,
    console_script,
    hf_env,
    machine,
    run_script,
    shard_files,
    warm_page_cache,
)
from tests.hub_server import FakeHub  # noqa: E402
from tests.ray_cluster import LocalCluster  # noqa: E402
from weightdiag.testing import synthetic  # noqa: E402

DRIVER_RSS_TARGET = 300 * MB


def checkpoint(shards: int) -> synthetic.ModelSpec:
    """Llama-shaped BF16, 310 MB: d_model 1024, 8 layers, untied 32000 x 1024 embeddings, in `shards` files."""
    spec = synthetic.ModelSpec(
        family="llama",
        n_layers=8,
        d_model=1024,
        n_heads=16,
        n_kv_heads=4,
        ffn_size=2816,
        vocab=32000,
        dtype="BF16",
        tied_embeddings=False,
        seed=5,
    )
    # Greedy sharding: each embedding (66 MB) alone, the layers in between; 50 MB gives 6 shards of 40-66 MB.
    sizes = [math.prod(t.shape) * 2 for t in spec.tensors()]
    return dataclasses.replace(spec, shard_bytes=max(max(sizes) * 3 // 4, math.ceil(sum(sizes) / shards)))


def ensure(root: Path, spec: synthetic.ModelSpec) -> Path:
    folder = root / f"ray-bench-d{spec.d_model}-L{spec.n_layers}-v{spec.vocab}-s{spec.shard_bytes}-bf16"
    if not (folder / "config.json").exists():
        partial = folder.with_suffix(".partial")
        synthetic.write_model(partial, spec)
        partial.rename(folder)
    return folder


def _science(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in ("created", "run")}, sort_keys=True)


def fit(hub: FakeHub, repo: str, connections: int, env: dict[str, str], extra: list[str]) -> tuple[Run, dict]:
    args = ["fit", repo, "--no-save", "-q", "--json", "--connections", str(connections), *extra]
    run = run_script(hub, console_script("weightdiag"), args, env, timeout=3600)
    row = json.loads(run.stdout)
    if not all(f["verified"] is True for f in row["files"]):
        raise RuntimeError("weightdiag fit: not every shard verified")
    return run, row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mb", type=float, default=10.0, help="MB/s (10^6 bytes) per TCP connection")
    parser.add_argument("--connections", type=int, default=2, help="fit --connections (per node on a cluster)")
    parser.add_argument("--nodes", default="1,2,3", help="cluster sizes to measure")
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--json", type=Path, help="write the JSON summary here too")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    info = machine()
    args.data.mkdir(parents=True, exist_ok=True)
    folder = ensure(args.data, checkpoint(args.shards))
    total = sum(p.stat().st_size for p in shard_files(folder))
    print(f"{folder.name}: {total / 1e6:.0f} MB in {len(shard_files(folder))} shards", file=sys.stderr, flush=True)
    hub = FakeHub().start()
    results: list[dict] = []
    try:
        repo = f"bench/{folder.name}"
        hub.add_folder(repo, folder)
        warm_page_cache(folder)
        hub.connection_bandwidth = args.cap_mb * MB
        with hf_env(hub) as (env, _):
            print("  one machine", file=sys.stderr, flush=True)
            local, baseline = fit(hub, repo, args.connections, env, [])
            results.append(_result("local", None, local, baseline, total, baseline))
            for n in sizes:
                with (
                    tempfile.TemporaryDirectory(prefix="bench_ray-") as tmp,
                    LocalCluster(Path(tmp), nodes=n, env=env) as cluster,
                ):
                    print(f"  {n} node(s)", file=sys.stderr, flush=True)
                    run, row = fit(
                        hub, repo, args.connections, env, ["--executor", "ray", "--ray-address", cluster.address]
                    )
                    results.append(_result("ray", n, run, row, total, baseline))
                time.sleep(1)
    finally:
        hub.stop()
    one = next((r for r in results if r["nodes"] == 1), None)
    for r in results:
        r["throughput_vs_1_node"] = round(r["MBps"] / one["MBps"], 2) if one else None
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {
        "command": shlex.join(["python", "benchmarks/bench_ray.py", *sys.argv[1:]]),
        "machine": info,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "checkpoint": {"name": folder.name, "bytes": total, "shards": len(shard_files(folder))},
        "results": results,
    }
    print(json.dumps(summary, indent=1))
    print()
    print(markdown(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


def _result(executor: str, nodes: int | None, run: Run, row: dict, total: int, baseline: dict) -> dict:
    cluster = row["run"].get("cluster")
    return {
        "executor": executor,
        "nodes": nodes,
        "seconds": round(run.seconds, 2),
        "MBps": round(total / run.seconds / MB, 1),
        "driver_peak_rss": run.peak_rss,
        "identical_to_local": _science(row) == _science(baseline),
        "tasks": cluster["tasks"] if cluster else None,
        "per_node": [(n["tasks"], round(n["bytes"] / MB)) for n in cluster["nodes"]] if cluster else None,
        "ranged_gets": run.hub["ranged_gets"],
        "connections": run.hub["connections"],
    }


def markdown(summary: dict) -> str:
    m, a, c = summary["machine"], summary["args"], summary["checkpoint"]
    lines = [
        "## One checkpoint on a Ray cluster (issue 30)",
        "",
        f"Command: `{summary['command']}` ({m['date']}; {m['cpu']}, **{m['cores']} cores** shared by every node, "
        f"the fake Hub and the driver, {m['memory']}, Python {m['python']}, weightdiag {m['weightdiag']} at "
        f"{m['commit']}; load average {m['load_average_start'][0]} at the start, {m['load_average_end'][0]} at "
        "the end).",
        "",
        f"A synthetic BF16 checkpoint of {c['bytes'] / 1e6:.0f} MB in {c['shards']} shards on the test suite's "
        f"fake Hub (loopback, 302 to a CDN origin), each TCP connection's bodies capped at {a['cap_mb']:g} MB/s; "
        f"every fit keeps {a['connections']} ranged GETs in flight per machine (`--connections "
        f"{a['connections']}`: on the cluster each node runs one task at a time, one CPU each), verifies every "
        "shard's sha256 where it is read, and its row is compared with the one-machine fit's (all but `created` "
        "and `run`). The nodes are `ray start` processes on this one machine (tests/ray_cluster.py): what "
        "scales here is the number of capped connections, as with machines that each pull their own shards; "
        "the cores are not multiplied. Driver peak RSS = VmHWM of the `weightdiag` process.",
        "",
        "| executor | nodes | seconds | throughput | vs 1 node | driver peak RSS | identical row | tasks "
        "| per node (tasks, MB) | ranged GETs / connections |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["results"]:
        rss = f"{r['driver_peak_rss'] / MB:.0f} MB" if r["driver_peak_rss"] else "-"
        per_node = ", ".join(f"({t}, {b})" for t, b in r["per_node"]) if r["per_node"] else "-"
        ratio = f"{r['throughput_vs_1_node']:.2f}" if r["throughput_vs_1_node"] is not None else "-"
        lines.append(
            f"| {r['executor']} | {r['nodes'] or '-'} | {r['seconds']:.2f} s | {r['MBps']:.1f} MB/s | {ratio} "
            f"| {rss} | {'yes' if r['identical_to_local'] else '**no**'} | {r['tasks'] or '-'} | {per_node} "
            f"| {r['ranged_gets']} / {r['connections']} |"
        )
    drivers = [r["driver_peak_rss"] for r in summary["results"] if r["executor"] == "ray" and r["driver_peak_rss"]]
    if drivers:
        ok = max(drivers) <= DRIVER_RSS_TARGET
        lines += [
            "",
            f"Driver peak RSS <= 300 MB: {'**yes**' if ok else 'no'} ({max(drivers) / MB:.0f} MB at most).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
