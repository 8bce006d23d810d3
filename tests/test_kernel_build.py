"""The C kernels' build: CI fails without it (scripts/test's check, and WEIGHTDIAG_REQUIRE_C_KERNELS=1 ending the
suite at once), a user without it is told once, in one line, that the numpy kernels run (same results, slower);
`weightdiag env` says which run and why; and the C code alone never writes or reads past its buffers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from weightdiag import kernels
from weightdiag.testing import synthetic

from .conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
NOTE = re.compile(r"^note: .*: the pure-numpy kernels are used \(the same results, several times slower\)$", re.M)


@pytest.fixture(scope="module")
def unbuilt(tmp_path_factory) -> Path:
    """A copy of the checkout without its C build: the package, and the suite's conftest and helpers."""
    root = tmp_path_factory.mktemp("unbuilt")
    shutil.copytree(ROOT / "weightdiag", root / "weightdiag", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (root / "tests").mkdir()
    for name in ("__init__.py", "conftest.py", "hub_server.py"):
        shutil.copy(ROOT / "tests" / name, root / "tests" / name)
    (root / "tests" / "test_one.py").write_text("def test_one():\n    pass\n")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WEIGHTDIAG_KERNELS")}
    return {**env, **extra}


def test_scripts_test_fails_in_one_line_when_the_c_kernels_did_not_build(unbuilt):
    script = (ROOT / "scripts" / "test").read_text()
    check = re.search(r"env -u WEIGHTDIAG_KERNELS python -c '(.*?)'\n", script, re.S)
    assert check is not None
    assert script.index("export WEIGHTDIAG_REQUIRE_C_KERNELS=1") < script.index("python -m pytest")
    out = subprocess.run(
        [sys.executable, "-c", check.group(1)], cwd=unbuilt, env=_env(), capture_output=True, text=True
    )
    assert out.returncode == 1
    assert out.stderr == (
        "scripts/test: the C extension is not built; python setup.py build_ext --inplace says why\n"
    ), out.stderr
    here = subprocess.run([sys.executable, "-c", check.group(1)], cwd=ROOT, env=_env(), capture_output=True)
    assert here.returncode == 0 and here.stderr == b""


def test_the_suite_stops_at_once_without_the_c_kernels_when_they_are_required(unbuilt):
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_one.py"]
    required = subprocess.run(
        run, cwd=unbuilt, env=_env(WEIGHTDIAG_REQUIRE_C_KERNELS="1"), capture_output=True, text=True
    )
    assert required.returncode == 1, required.stdout + required.stderr
    said = required.stdout + required.stderr
    assert "WEIGHTDIAG_REQUIRE_C_KERNELS=1, but the C extension is not built" in said, said
    assert "1 passed" not in said
    chosen = _env(WEIGHTDIAG_REQUIRE_C_KERNELS="1", WEIGHTDIAG_KERNELS="numpy")  # on purpose: the run goes on
    out = subprocess.run(run, cwd=unbuilt, env=chosen, capture_output=True, text=True)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    spec = synthetic.ModelSpec(n_layers=1, d_model=32, n_heads=2, ffn_size=64, vocab=64, seed=1)
    return synthetic.write_model(tmp_path_factory.mktemp("tiny"), spec)


@pytest.mark.kernels
def test_the_numpy_kernels_are_said_once_in_one_line_and_c_not_at_all(tiny, tmp_path, monkeypatch):
    db = str(tmp_path / "db")
    if kernels.HAVE_C:
        out = run_cli("fit", str(tiny), "--device", "cpu", "--db", db)
        assert out.returncode == 0 and "pure-numpy" not in out.stderr, out.stderr
        monkeypatch.setattr(kernels, "HAVE_C", False)
        monkeypatch.setattr(kernels, "WHY_NUMPY", "the C extension is not built")
    out = run_cli("fit", str(tiny), "--device", "cpu", "--db", db, "--no-save")
    assert out.returncode == 0, out.stderr
    assert len(NOTE.findall(out.stderr)) == 1, out.stderr
    assert out.stderr.startswith("note: " + kernels.WHY_NUMPY), out.stderr
    quiet = run_cli("fit", str(tiny), "--device", "cpu", "--db", db, "--no-save", "-q")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # once a process: two models fitted by one `compare` are one note
    other = synthetic.write_model(tmp_path / "other", synthetic.ModelSpec(n_layers=1, d_model=32, vocab=64, seed=2))
    both = run_cli("compare", str(tiny), str(other), "--device", "cpu", "--db", db, "--no-save")
    assert both.returncode == 0, both.stderr
    assert len(NOTE.findall(both.stderr)) == 1, both.stderr


def test_env_says_which_kernels_run_and_why(monkeypatch):
    out = run_cli("env", env={"WEIGHTDIAG_KERNELS": ""})
    assert out.returncode == 0
    assert f"- Kernels: {'C extension' if kernels.HAVE_C else 'numpy (' + kernels.WHY_NUMPY + ')'}\n" in out.stdout
    monkeypatch.setattr(kernels, "HAVE_C", False)
    monkeypatch.setattr(kernels, "WHY_NUMPY", "WEIGHTDIAG_KERNELS=numpy")
    assert "- Kernels: numpy (WEIGHTDIAG_KERNELS=numpy)\n" in run_cli("env").stdout


@pytest.mark.skipif(not kernels.HAVE_C, reason="calls the C module itself")
@pytest.mark.parametrize("bits", [8, 4])
def test_the_c_code_alone_never_counts_or_reads_past_its_buffers(bits):
    """Called directly (none of weightdiag.kernels' checks before it), a code of ncodes or more in the last slot is
    an error, not a write past `out` or a read past `wanted`; a negative first column is refused."""
    codes = np.full((1, 16), 0xFF, dtype=np.uint8)
    slots = np.array([[1]], dtype=np.int32)  # the last of two slots
    out = np.zeros(2 * 8, dtype=np.int64)
    with pytest.raises(ValueError, match="count_slots: code out of range"):
        kernels._c.count_slots(codes, slots, 0, 32, bits, 8, out)
    wanted = np.zeros(2 * 8, dtype=np.uint8)
    wanted[-1] = 1
    with pytest.raises(ValueError, match="locate_slots: code out of range"):
        kernels._c.locate_slots(codes, slots, 0, 32, bits, 8, wanted, False)
    with pytest.raises(ValueError, match="count_slots: inconsistent shapes"):
        kernels._c.count_slots(codes, slots, -32, 32, bits, 8, out)
