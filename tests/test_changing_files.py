"""Local shards that change while a fit reads them (issue 19): exit 2 with one line, never a crash or a row.

Each fit runs in its own interpreter (a SIGBUS would otherwise end the test run) with the reader's chunks
made small and one worker, so that a shard is read in several chunks, in order; the change is made at a
fixed point of the fit: after the first chunk, or while the second one is mapped and being reduced.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from weightdiag.errors import CheckpointFormatError
from weightdiag.source import filecheck
from weightdiag.source.chunks import Chunk
from weightdiag.source.local import LocalReader, open_local
from weightdiag.testing import synthetic

# Installs the hook, then runs the command line. argv: mode, then the command line's arguments.
DRIVER = textwrap.dedent(
    """
    import os, sys, threading, time
    from contextlib import contextmanager
    from weightdiag import tuning
    from weightdiag.source import local

    mode, args = sys.argv[1], sys.argv[2:]
    original = local.LocalReader.chunk
    seen = []

    def change(path):
        data = path.read_bytes()
        other = data[:-4096] + bytes(b ^ 0xFF for b in data[-4096:])  # the same header, other values
        if mode == "truncate":
            os.truncate(path, len(data) // 2)
        elif mode == "rewrite":  # in place, same size
            with open(path, "r+b") as f:
                f.write(other)
        elif mode == "save_file":  # truncated, then written anew: what save_file does to an existing file
            with open(path, "wb") as f:
                f.write(other)
        elif mode == "replace":  # written under another name, renamed over it
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(other)
            os.replace(tmp, path)
        elif mode == "rename":
            os.rename(path, path.with_name(path.name + ".old"))

    @contextmanager
    def chunk(self, c):
        path = self._paths[c.shard]
        with original(self, c) as buf:
            seen.append(c)
            if mode == "truncate-mapped" and len(seen) == 2:
                # Truncate while this chunk is in use: the truncation waits for the read lease (or, without
                # one, the bytes were copied); touching every byte afterwards must not be SIGBUS.
                threading.Thread(target=os.truncate, args=(path, 0), daemon=True).start()
                time.sleep(0.3)
                int(buf.sum())
            yield buf
        if len(seen) == 1 and mode not in ("none", "truncate-mapped"):
            change(path)

    local.LocalReader.chunk = chunk
    from weightdiag.cli import main
    with tuning.override(split_bytes=64 << 10, local_chunk_bytes=64 << 10):
        main(args)
    """
)


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    spec = synthetic.ModelSpec(
        n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=5
    )
    return synthetic.write_model(tmp_path / "model", spec)


def _fit(mode: str, model: Path, db: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WEIGHTDIAG_THREADS": "1", "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, mode, "fit", str(model), "--db", str(db), "-q", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_hook_alone_fits(sharded: Path, tmp_path: Path) -> None:
    out = _fit("none", sharded, tmp_path / "db")
    assert out.returncode == 0, out.stderr
    assert list((tmp_path / "db").rglob("*.json")), "the unchanged model's row is written"


@pytest.mark.parametrize("mode", ["truncate", "truncate-mapped", "rewrite", "save_file", "replace", "rename"])
def test_a_shard_changed_during_a_fit_is_exit_2_one_line_no_row(sharded: Path, tmp_path: Path, mode: str) -> None:
    shard = sorted(sharded.glob("*.safetensors"))[0]
    out = _fit(mode, sharded, tmp_path / "db")
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert len(lines) == 1, out.stderr
    assert str(shard) in lines[0] and "changed while being read" in lines[0], lines[0]
    assert "re-run once it is complete" in lines[0], lines[0]
    assert not list((tmp_path / "db").rglob("*.json")), "no row may be written"


def _small_file(tmp_path: Path) -> Path:
    from .conftest import write_safetensors

    rng = np.random.default_rng(1)
    return write_safetensors(
        tmp_path / "model.safetensors",
        {"model.layers.0.mlp.down_proj.weight": ("BF16", rng.standard_normal((64, 64)).astype(np.float32))},
    )


def test_a_file_that_cannot_be_leased_is_copied_not_mapped(tmp_path: Path, monkeypatch) -> None:
    """Where no lease can be had (open for writing elsewhere, not ours, no leases), chunks are read with
    pread: the same bytes, checked before and after."""
    f = _small_file(tmp_path)
    plan, reader = open_local(f)
    ref = plan.tensors[0]
    chunk = Chunk(0, ref.shard, ref.start, ref.end, ())
    with reader.chunk(chunk) as mapped:
        expected = bytes(mapped)
    with open(f, "r+b"), reader.chunk(chunk) as copied:  # held open for writing: no read lease is granted
        assert bytes(copied) == expected
    monkeypatch.setattr("weightdiag.source.local_reader.take_read_lease", lambda fd: False)
    with reader.chunk(chunk) as copied:
        assert bytes(copied) == expected
    os.truncate(f, ref.start + 10)
    with pytest.raises(CheckpointFormatError, match="changed while being read"), reader.chunk(chunk):
        pass


def test_a_lease_break_during_a_chunk_is_a_change(tmp_path: Path) -> None:
    f = _small_file(tmp_path)
    fd = os.open(f, os.O_RDONLY)
    try:
        if not filecheck.take_read_lease(fd):
            pytest.skip("no read leases on this file system")
        assert not filecheck.break_pending(fd)
        opener = subprocess.Popen([sys.executable, "-c", f"open({str(f)!r}, 'r+b').close()"])
        for _ in range(250):  # the opener waits for the lease; its break shows as pending
            if filecheck.break_pending(fd):
                break
            time.sleep(0.02)
        assert filecheck.break_pending(fd)
        filecheck.release_lease(fd)
        assert opener.wait(timeout=30) == 0
    finally:
        os.close(fd)


def test_no_shard_stays_open_between_reads(tmp_path: Path) -> None:
    f = _small_file(tmp_path)
    plan, reader = open_local(f)
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    ref = plan.tensors[0]
    reader.read_into(ref, np.empty(ref.nbytes, dtype=np.uint8))
    with reader.chunk(Chunk(0, ref.shard, ref.start, ref.end, ())):
        pass
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before
    assert isinstance(reader, LocalReader)


def test_300_shards_fit_under_ulimit_256(tmp_path: Path) -> None:
    """Shards are opened only while they are read: a 300-shard model needs a handful of descriptors."""
    spec = synthetic.ModelSpec(
        n_layers=34, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=256, shard_bytes=1, seed=2
    )
    model = synthetic.write_model(tmp_path / "model", spec)
    shards = len(list(model.glob("*.safetensors")))
    assert shards >= 300, shards
    command = f"ulimit -n 256 && exec {sys.executable} -m weightdiag fit {model} --no-save -q --device cpu"
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_a_gguf_file_changed_during_a_fit_is_a_change(tmp_path: Path) -> None:
    """GGUF files are read with pread (no SIGBUS), tensor by tensor: each read is checked against the file
    planned, so a file rewritten or replaced between two tensors stops the fit instead of mixing two files."""
    from weightdiag.source.gguf import open_gguf

    from .test_gguf import gguf_file, llama_kv, write

    rng = np.random.default_rng(3)
    tensors = [
        (f"t{i}.weight", (8, 64), "F32", rng.standard_normal((8, 64)).astype(np.float32).tobytes()) for i in range(3)
    ]
    path = write(tmp_path, gguf_file(llama_kv(), tensors))
    plan, reader = open_gguf(path)
    try:
        out = np.empty(plan.tensors[0].nbytes, dtype=np.uint8)
        reader.read_into(plan.tensors[0], out)
        time.sleep(0.01)  # a later mtime even on coarse clocks
        replacement = tmp_path / "next.gguf"
        replacement.write_bytes(path.read_bytes())
        os.replace(replacement, path)
        with pytest.raises(CheckpointFormatError, match="changed while being read"):
            reader.read_into(plan.tensors[1], out)
    finally:
        reader.close()
    plan, reader = open_gguf(path)
    try:
        reader.read_into(plan.tensors[0], out)
        time.sleep(0.05)  # file times tick every few milliseconds: a write in the same tick would not show
        with open(path, "r+b") as f:  # rewritten in place, same size
            f.seek(-4, os.SEEK_END)
            f.write(b"\0\0\0\0")
        with pytest.raises(CheckpointFormatError, match=r"changed while being read \(it was modified"):
            reader.read_into(plan.tensors[1], out)
    finally:
        reader.close()


def test_a_pytorch_bin_shard_changed_during_a_fit_is_a_change(tmp_path: Path) -> None:
    """.bin shards are memory-mapped by torch.load at open: each tensor copied out is checked against the shard
    loaded, so one replaced (rename) or rewritten afterwards stops the fit instead of mixing two files."""
    import torch

    from weightdiag.source.torch_bin import open_torch_bin

    gen = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(16, 16, generator=gen) for i in range(2)}
    torch.save(state, tmp_path / "pytorch_model.bin")
    plan, reader = open_torch_bin(tmp_path, ["pytorch_model.bin"])
    out = np.empty(plan.tensors[0].nbytes, dtype=np.uint8)
    reader.read_into(plan.tensors[0], out)
    torch.save(state, tmp_path / "next.bin")
    os.replace(tmp_path / "next.bin", tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointFormatError, match=r"changed while being read \(another file now has its name"):
        reader.read_into(plan.tensors[1], out)
    reader.close()
