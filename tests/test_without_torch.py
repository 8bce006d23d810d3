"""torch is an extra ([torch]: .bin checkpoints and --device cuda), not a dependency: `pip install .` must not
pull a CUDA build of several GB for a safetensors fit that never imports it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from weightdiag.errors import TORCH_INSTALL

REPO = Path(__file__).resolve().parent.parent

# A fresh interpreter in which `import torch` fails, as in an install without the [torch] extra.
_NO_TORCH = "import sys\nsys.modules['torch'] = None\nfrom weightdiag.cli import main\nmain({args!r})\n"


def _run_without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = _NO_TORCH.format(args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_torch_is_an_extra_not_a_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    assert project["optional-dependencies"]["torch"] == ["torch>=2.6"]


@pytest.mark.e2e
def test_a_safetensors_fit_runs_without_torch_and_a_bin_says_what_to_install(tmp_path, minilm_dir):
    fitted = _run_without_torch("fit", str(minilm_dir), "--no-save", "-q", cwd=tmp_path)
    assert fitted.returncode == 0, fitted.stderr
    (tmp_path / "bin").mkdir()
    torch.save({"w": torch.zeros(4, 4)}, tmp_path / "bin" / "pytorch_model.bin")
    refused = _run_without_torch("fit", str(tmp_path / "bin"), "--no-save", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    # weightdiag is not on PyPI: the hint names torch itself and the extra of the checkout (issue 42, item 18)
    assert refused.stderr.count("\n") == 1 and TORCH_INSTALL in refused.stderr
    cuda = _run_without_torch("fit", str(minilm_dir), "--no-save", "--device", "cuda", cwd=tmp_path)
    assert cuda.returncode == 2 and TORCH_INSTALL in cuda.stderr, cuda.stderr
    assert "weightdiag[torch]" not in refused.stderr + cuda.stderr
    env = _run_without_torch("env", cwd=tmp_path)
    assert env.returncode == 0, env.stderr
