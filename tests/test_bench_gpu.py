"""benchmarks/bench_gpu.py (issue 19's table in one run) works where there is no GPU: CPU rows measured, the
CUDA rows saying they are not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_gpu_runs_small_and_says_what_it_could_not_measure(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "bench_gpu.py"
    args = ["--layers", "1", "--f32-layers", "1", "--width", "256", "--repeat", "1", "--data", str(tmp_path)]
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["api_bf16"]["cpu"]["s"] > 0 and result["api_f32"]["cpu"]["GBps"] > 0
    assert set(result["cpu_workers_s"]) == {"1", "2", "4", "8", "16"}
    assert result["command_s"]["cpu"] > 0 and result["command_s"]["auto"] > 0
    if not result["cuda"]:
        assert result["command_s"]["cuda"] == result["device"] == "unmeasured: no CUDA GPU"
    else:
        assert result["cpu_and_cuda_rows_identical"] == {"bf16": True, "f32": True}
    assert "| API fit BF16, --device cpu |" in out.stderr
