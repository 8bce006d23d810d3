"""Local model layouts: file, folder, sharded index, HF cache; and what is refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from weightdiag.errors import BadInputError, CheckpointFormatError
from weightdiag.source.chunks import Chunk
from weightdiag.source.local import open_local

from .conftest import write_safetensors


def _small(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    return write_safetensors(
        path,
        {
            "model.layers.0.self_attn.q_proj.weight": (
                "BF16",
                rng.standard_normal((64, 64)).astype(np.float32),
            ),
            "model.layers.0.input_layernorm.weight": ("F32", np.ones(64, dtype=np.float32)),
        },
    )


def test_single_file_and_its_folder(tmp_path):
    f = _small(tmp_path / "model.safetensors")
    plan_file, r1 = open_local(f)
    plan_dir, r2 = open_local(tmp_path)
    r1.close(), r2.close()
    assert [t.name for t in plan_file.tensors] == [t.name for t in plan_dir.tensors]
    assert plan_dir.shards[0].header_sha256
    assert plan_dir.model_id == tmp_path.name


def test_sharded_folder_reads_index_and_config(small_llama):
    plan, reader = open_local(small_llama)
    reader.close()
    assert len(plan.shards) == len(list(small_llama.glob("*.safetensors"))) > 1
    assert plan.config["model_type"] == "llama"
    index = json.loads((small_llama / "model.safetensors.index.json").read_text())
    assert {t.name for t in plan.tensors} == set(index["weight_map"])


def test_hf_cache_snapshot_layout(tmp_path, small_llama):
    # models--org--name/{blobs,refs/main,snapshots/<sha>/file -> ../../blobs/<sha256>}
    repo = tmp_path / "hub" / "models--acme--tiny-llama"
    commit = "a" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for src in small_llama.iterdir():
        blob = repo / "blobs" / hashlib.sha256(src.read_bytes()).hexdigest()
        shutil.copy(src, blob)
        os.symlink(os.path.relpath(blob, snap), snap / src.name)
    for spec in (repo, snap):
        plan, reader = open_local(spec)
        reader.close()
        assert plan.model_id == "acme/tiny-llama"
        assert plan.commit == commit
        assert plan.revision == "main"
        assert all(s.sha256 and len(s.sha256) == 64 for s in plan.shards)
    for damaged in ("../../../etc", "b" * 40):  # a path, or a commit with no snapshot
        (repo / "refs" / "main").write_text(damaged)
        with pytest.raises(BadInputError, match="does not name a snapshot"):
            open_local(repo)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_index_naming_a_missing_shard(tmp_path, small_llama):
    folder = _copy(small_llama, tmp_path / "m")
    sorted(folder.glob("model-*.safetensors"))[1].unlink()
    with pytest.raises(BadInputError, match="missing"):
        open_local(folder)


def test_index_path_leaving_the_folder_is_refused(tmp_path, small_llama):
    folder = _copy(small_llama, tmp_path / "m")
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    name = next(iter(doc["weight_map"]))
    doc["weight_map"][name] = "../outside.safetensors"
    index.write_text(json.dumps(doc))
    (tmp_path / "outside.safetensors").write_bytes(
        (folder / next(iter(sorted(p.name for p in folder.glob("*.safetensors"))))).read_bytes()
    )
    with pytest.raises(CheckpointFormatError, match="leaves the model folder"):
        open_local(folder)
    doc["weight_map"][name] = "/etc/passwd"
    index.write_text(json.dumps(doc))
    with pytest.raises(CheckpointFormatError, match="leaves the model folder"):
        open_local(folder)


def test_index_that_disagrees_with_the_shards(tmp_path, small_llama):
    folder = _copy(small_llama, tmp_path / "m")
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["model.layers.9.mlp.up_proj.weight"] = sorted(doc["weight_map"].values())[0]
    index.write_text(json.dumps(doc))
    with pytest.raises(CheckpointFormatError, match="no shard holds it"):
        open_local(folder)


def test_empty_folder_and_wrong_files(tmp_path):
    with pytest.raises(BadInputError, match=r"no \.safetensors"):
        open_local(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(BadInputError, match=r"pytorch_model\.bin"):
        open_local(tmp_path)
    with pytest.raises(BadInputError, match="no such file"):
        open_local(tmp_path / "nope")
    with pytest.raises(CheckpointFormatError, match=r"not a readable torch checkpoint"):
        open_local(tmp_path / "pytorch_model.bin")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(BadInputError, match=r"not a weights file"):
        open_local(tmp_path / "notes.txt")


def test_two_checkpoints_in_one_folder_are_refused(tmp_path):
    _small(tmp_path / "a.safetensors", 0)
    _small(tmp_path / "b.safetensors", 1)
    with pytest.raises(CheckpointFormatError, match="appears in both"):
        open_local(tmp_path)


def test_reader_fails_clearly_if_the_file_shrinks(tmp_path):
    f = _small(tmp_path / "model.safetensors")
    plan, reader = open_local(f)
    os.truncate(f, f.stat().st_size - 100)
    ref = plan.tensors[-1]
    with pytest.raises(CheckpointFormatError, match=r"changed while being read \(its size went from"):
        reader.read_into(ref, np.empty(ref.nbytes, dtype=np.uint8))
    chunk = Chunk(0, ref.shard, ref.start, ref.end, ())
    with pytest.raises(CheckpointFormatError, match="changed while being read"), reader.chunk(chunk):
        pass
    reader.close()


def test_checkpoint_folders_are_named_with_their_run(tmp_path):
    from weightdiag.source.files import default_model_id

    assert default_model_id(tmp_path / "run-a" / "checkpoint-1000") == "run-a/checkpoint-1000"
    assert default_model_id(tmp_path / "run-b" / "step143000") == "run-b/step143000"
    assert default_model_id(tmp_path / "runs" / "pythia-70m") == "pythia-70m"


def test_same_shaped_checkpoints_in_two_places_get_different_fingerprints(tmp_path):
    from weightdiag.source.local import content_fingerprint, open_local

    prints = []
    for run in ("a", "b"):
        folder = tmp_path / run / "model"
        folder.mkdir(parents=True)
        write_safetensors(folder / "model.safetensors", {"w": ("F32", np.zeros((4, 4), np.float32))})
        plan, reader = open_local(folder)
        reader.close()
        prints.append(content_fingerprint(plan))
    assert prints[0] != prints[1]


def test_a_model_file_opened_from_inside_its_folder_is_named_by_the_folder(tmp_path, monkeypatch):
    folder = tmp_path / "run-a" / "checkpoint-100"
    folder.mkdir(parents=True)
    write_safetensors(folder / "model.safetensors", {"w": ("F32", np.zeros((4, 4), np.float32))})
    monkeypatch.chdir(folder)
    plan, reader = open_local("model.safetensors")
    reader.close()
    assert plan.model_id == "run-a/checkpoint-100"
