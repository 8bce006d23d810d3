"""--device: `auto` fits on the CPU and imports no torch without a driver (issue 19: CUDA measured 3x slower end to
end); the spectrum goes to a GPU torch sees (issue 41)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from weightdiag import execution as device
from weightdiag.errors import OptionError

from .conftest import run_cli, write_safetensors


def _model(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return write_safetensors(
        tmp_path / "model.safetensors",
        {"model.layers.0.mlp.down_proj.weight": ("BF16", rng.standard_normal((64, 128)).astype(np.float32))},
    )


def _fit_without_torch(model: Path, args: list[str], driver: bool) -> tuple[dict, str]:
    """`weightdiag fit MODEL --no-save --json ARGS` in a fresh interpreter where an NVIDIA driver is (or is not)
    loaded: the row and stderr, after checking that the fit succeeded and never imported torch."""
    code = (
        f"import sys\nfrom weightdiag import execution as device\ndevice.nvidia_present = lambda: {driver}\n"
        "from weightdiag.cli import main\n"
        "try:\n"
        f"    main(['fit', {str(model)!r}, '--no-save', '--json', *{args!r}])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "sys.stderr.write('imported: ' + repr('torch' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.endswith("imported: False"), out.stderr
    return json.loads(out.stdout), out.stderr


def test_auto_is_the_cpu_even_where_a_gpu_driver_is(monkeypatch) -> None:
    monkeypatch.setattr(device, "nvidia_present", lambda: True)
    assert device.resolve_device("auto") == "cpu"
    assert device.resolve_device("") == "cpu"
    assert device.resolve_device("CPU") == "cpu"
    with pytest.raises(OptionError, match="choose auto, cpu, cuda or cuda:N"):
        device.resolve_device("tpu")


@pytest.mark.parametrize("flags", [[], ["--device", "auto"]])
def test_fit_with_auto_or_the_default_imports_no_torch_even_with_a_driver(tmp_path: Path, flags: list[str]) -> None:
    """In a fresh interpreter that believes an NVIDIA driver is loaded: the fit runs on the CPU, says so, records
    it in the row, and torch is never imported."""
    row, stderr = _fit_without_torch(_model(tmp_path), flags, driver=True)
    assert row["run"]["device"] == "cpu"
    assert "reduced on cpu" in stderr


def test_the_device_that_ran_is_said_unless_quiet(tmp_path: Path) -> None:
    model = _model(tmp_path)
    out = run_cli("fit", str(model), "--no-save", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "reduced on cpu" in out.stdout + out.stderr
    quiet = run_cli("fit", str(model), "--no-save", "--device", "cpu", "-q")
    assert "reduced on" not in quiet.stdout + quiet.stderr


def test_env_says_the_cores_and_chunk_workers_even_with_a_bad_setting() -> None:
    out = run_cli("env", env={"WEIGHTDIAG_THREADS": "3"})
    assert out.returncode == 0, out.stderr
    assert "Cores:" in out.stdout and "a fit reads 3 local chunks at once" in out.stdout
    bad = run_cli("env", env={"WEIGHTDIAG_THREADS": "many"})
    assert bad.returncode == 0, bad.stderr
    assert "WEIGHTDIAG_THREADS='many'" in bad.stdout


def test_auto_puts_the_spectrum_on_a_gpu_torch_sees_and_says_so(monkeypatch) -> None:
    """Per pass: the fit on the CPU, the spectrum on CUDA where a driver is loaded and torch sees a GPU; on the
    CPU without a driver (torch not consulted), or where torch sees none; an explicit --device is kept."""
    torch = pytest.importorskip("torch")
    auto = device.Execution.from_settings("auto")
    assert auto.device == "cpu" and auto.requested == "auto"
    monkeypatch.setattr(device, "nvidia_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    spectral = auto.for_spectrum()
    assert (auto.device, spectral.device) == ("cpu", "cuda")
    assert "the spectrum on cuda" in auto.device_choice(spectral) and "the fit on the CPU" in auto.device_choice()
    assert auto.for_node(2).for_spectrum().device == "cpu"  # a cluster node runs on its CPU
    assert device.Execution.from_settings("cpu").for_spectrum().device == "cpu"
    assert device.Execution.from_settings("cpu").device_choice() == "cpu: as asked"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto.for_spectrum().device == "cpu"
    monkeypatch.setattr(device, "nvidia_present", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch asked without a driver"))
    assert auto.for_spectrum().device == "cpu"


def test_a_cpu_only_spectrum_with_auto_imports_no_torch(tmp_path: Path) -> None:
    """No NVIDIA driver: fit --spectrum with --device auto runs both passes on the CPU, says why in the row, and
    torch is never imported (sys.modules after the fit)."""
    row, _ = _fit_without_torch(_model(tmp_path), ["--spectrum", "--device", "auto"], driver=False)
    run = row["run"]
    assert run["device"] == "cpu" and run["spectrum"]["device"] == "cpu"
    assert run["spectrum"]["solver"]["solver"] == "lapack"
    assert run["device_choice"].startswith("auto:") and "no CUDA GPU seen" in run["device_choice"]


def test_the_spectrum_device_is_said_unless_quiet(tmp_path: Path) -> None:
    model = _model(tmp_path)
    out = run_cli("fit", str(model), "--no-save", "--spectrum", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "spectra of 1 matrix taken on cpu in " in out.stdout + out.stderr
