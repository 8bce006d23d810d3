"""benchmarks/bench_gpu.py (issue 41's acceptance run) works where there is no GPU: the CPU and auto rows measured,
rows and alphas compared, the CUDA rows saying they are not, and one object with the acceptance's fields appended
to its results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {
    "date", "device_name", "torch", "cpu_gbs", "cuda_gbs", "auto_gbs", "host_rss_mb", "rows_equal",
    "spectrum_16gb_s", "spectrum_16gb_cpu_s", "alphas_equal",
}  # fmt: skip


@pytest.mark.slow
def test_bench_gpu_runs_small_and_says_what_it_could_not_measure(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "bench_gpu.py"
    results = tmp_path / "gpu.json"
    results.write_text('[{"date": "an earlier run"}]')
    args = ["--layers", "2", "--small-layers", "1", "--width", "256", "--repeat", "1", "--data", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, str(script), *args, "--results", str(results)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    devices = ["cpu", "cuda", "auto"] if result["cuda"] else ["cpu", "auto"]
    for name in ("small", "large"):
        fit = result["fit"][name]
        assert list(fit["devices"]) == devices and all(d["s"] > 0 for d in fit["devices"].values())
        assert all(fit["rows_equal_cpu"].values()) and set(fit["rows_equal_cpu"]) == set(devices) - {"cpu"}
    assert result["spectrum"]["alphas_equal"] is True
    assert result["spectrum"]["cpu"]["solver"]["solver"] == "lapack"
    kept = json.loads(results.read_text())
    assert kept[0] == {"date": "an earlier run"} and len(kept) == 2
    assert set(kept[1]) >= FIELDS and kept[1]["rows_equal"] is True
    if not result["cuda"]:
        assert result["device"] == kept[1]["cuda_gbs"] == kept[1]["spectrum_16gb_s"] == "unmeasured: no CUDA GPU"
    assert "| API fit llama-d256-L1-bf16" in out.stderr
