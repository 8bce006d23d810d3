"""Fitting from the Hub: against a real HTTP server on loopback that speaks the Hub protocol."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from weightdiag import api
from weightdiag.api import fit_path
from weightdiag.errors import HubError
from weightdiag.run.measure import FitOptions

from .conftest import run_cli
from .hub_server import write_small_model

pytestmark = pytest.mark.e2e  # the loopback Hub, and the CLI against it

# Fields that say where and when a row was made; everything else must be identical.
_CONTEXT = ("model", "files", "created", "run", "notes")


def _science(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in _CONTEXT}


@pytest.fixture
def small_model(tmp_path_factory) -> Path:
    return write_small_model(tmp_path_factory.mktemp("small"))


def _tensor_bytes(folder: Path) -> int:
    """Sum of every safetensors file's size (headers + tensor bytes)."""
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _fit_hub(spec: str, **kw) -> dict:
    return api.fit_model(spec, FitOptions(device="cpu"), **kw)


def test_streamed_fit_equals_the_local_fit_and_transfers_no_extra_bytes(fake_hub, small_model):
    commit = fake_hub.add_folder("acme/tiny", small_model)
    fake_hub.reset_counters()
    row = _fit_hub("acme/tiny")
    local = fit_path(str(small_model), FitOptions(device="cpu"))
    assert _science(row) == _science(local)
    assert row["model"]["source"] == "hub"
    assert row["model"]["commit"] == commit
    assert row["model"]["revision"] == "main"
    assert "ranged reads" in row["notes"][0]
    assert all(len(f["sha256"]) == 64 for f in row["files"])  # the LFS object ids
    weights = _tensor_bytes(small_model)
    assert (
        fake_hub.file_bytes_sent
        <= 1.02 * weights
        + (small_model / "config.json").stat().st_size
        + (small_model / "model.safetensors.index.json").stat().st_size
    )
    gets = fake_hub.requests_to(".safetensors", method="GET")
    assert all(r.range for r in gets)  # every weight byte through a ranged GET
    # Nothing was written to the HF cache.
    cache = Path(os.environ["HF_HUB_CACHE"])
    assert not any(p.suffix == ".safetensors" for p in cache.rglob("*"))


def test_real_minilm_from_the_hub_equals_local(fake_hub, minilm_dir):
    fake_hub.add_folder("sentence-transformers/all-MiniLM-L6-v2", minilm_dir)
    row = _fit_hub("sentence-transformers/all-MiniLM-L6-v2")
    assert _science(row) == _science(fit_path(str(minilm_dir), FitOptions(device="cpu")))
    assert row["kinds"]["ffn_in"]["count"] == 6


def test_revisions_branches_tags_and_commits(fake_hub, small_model, tmp_path):
    main = fake_hub.add_folder("acme/run", small_model)
    other = write_small_model(tmp_path / "other", seed=5)
    step = fake_hub.add_folder("acme/run", other, branch="step1000")
    fake_hub.add_tag("acme/run", "v1", "main")
    assert _fit_hub("acme/run@step1000")["model"]["commit"] == step
    by_flag = api.fit_model("acme/run", FitOptions(device="cpu"), revision="step1000")
    assert by_flag["model"]["revision"] == "step1000"
    assert _fit_hub("acme/run@v1")["model"]["commit"] == main
    assert _fit_hub(f"acme/run@{main}")["model"]["commit"] == main
    hp = _fit_hub("acme/run@step1000")["hyperparameters"]
    assert hp["steps"] == 1000
    assert hp["source"] == "step 1000 from the revision"


def test_download_mode_fills_the_cache_and_later_runs_read_it(fake_hub, small_model):
    fake_hub.add_folder("acme/tiny", small_model)
    downloaded = api.fit_model("acme/tiny", FitOptions(device="cpu"), download=True)
    cache = Path(os.environ["HF_HUB_CACHE"])
    shards = sorted(p.name for p in small_model.glob("*.safetensors"))
    assert sorted(p.name for p in cache.rglob("*.safetensors")) == shards
    fake_hub.reset_counters()
    cached = _fit_hub("acme/tiny")  # no --download: the cache is used, no weight byte moves
    assert fake_hub.file_bytes_sent == 0
    assert _science(cached) == _science(downloaded)
    assert cached["model"]["source"] == "hub"


@pytest.mark.parametrize(
    ("fault", "params"),
    [
        ("drop", {"after_bytes": 5000}),
        ("429", {"retry_after": 0.2}),
        ("500", {}),
        ("drop", {"after_bytes": 0, "reset": True}),
    ],
)
def test_transient_faults_are_retried_and_the_result_is_identical(fake_hub, small_model, fault, params):
    fake_hub.add_folder("acme/tiny", small_model)
    clean = _fit_hub("acme/tiny")
    fake_hub.fail(fault, "model-00002", times=1, method="GET", **params)
    faulty = _fit_hub("acme/tiny")
    assert _science(faulty) == _science(clean)
    assert not fake_hub._faults  # the fault did fire


def test_expired_cdn_urls_are_resolved_again(fake_hub, small_model):
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import get_session

    from weightdiag.source.ranged import RangedFile, RetryPolicy

    fake_hub.add_folder("acme/tiny", small_model)
    name = sorted(p.name for p in small_model.glob("*.safetensors"))[0]
    data = (small_model / name).read_bytes()
    remote = RangedFile(hf_hub_url("acme/tiny", name), len(data), get_session(), {}, name)
    first = np.empty(100, dtype=np.uint8)
    remote.read(1000, first, RetryPolicy())
    assert first.tobytes() == data[1000:1100]
    fake_hub.reset_counters()
    fake_hub.expire_cdn_urls()  # the remembered signed URL now answers 403
    again = np.empty(64, dtype=np.uint8)
    remote.read(5000, again, RetryPolicy())
    assert again.tobytes() == data[5000:5064]
    statuses = [(r.path.split("/")[1], r.status) for r in fake_hub.requests]
    assert statuses[0] == ("cdn", 403)
    assert ("acme", 302) in statuses
    assert statuses[-1] == ("cdn", 206)


def test_a_server_ignoring_range_fails_clearly_never_wrongly(fake_hub, small_model):
    fake_hub.add_folder("acme/tiny", small_model)
    fake_hub.ignore_range = True
    with pytest.raises(HubError, match="ignored the byte range"):
        _fit_hub("acme/tiny")


def test_persistent_failures_give_up_with_a_clear_error(fake_hub, small_model, monkeypatch):
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0.01")
    fake_hub.add_folder("acme/tiny", small_model)
    fake_hub.fail("503", "model-00001", times=None, method="GET")
    with pytest.raises(HubError, match="failed 6 times"):
        _fit_hub("acme/tiny")


def test_bin_only_revisions(fake_hub, tmp_path):
    state = {
        "gpt_neox.layers.0.mlp.dense_4h_to_h.weight": torch.randn(64, 256),
        "gpt_neox.layers.0.attention.dense.weight": torch.randn(64, 64),
    }
    folder = tmp_path / "binmodel"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "hidden_size": 64}))
    fake_hub.add_folder("EleutherAI/pythia-12b", folder, branch="step3000")
    with pytest.raises(HubError, match="--download"):
        _fit_hub("EleutherAI/pythia-12b@step3000")
    row = api.fit_model("EleutherAI/pythia-12b@step3000", FitOptions(device="cpu"), download=True)
    assert row["model"]["format"] == "torch"
    assert "weights_only=True" in " ".join(row["notes"])
    assert row["kinds"]["o"]["count"] == 1
    assert row["hyperparameters"]["state"] == "Transition"  # preset pythia-12b at step 3000


# --- errors users will hit: one line, exit 3, no traceback ----------------------------------------------


def _cli_env(hub) -> dict[str, str]:
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    return {k: os.environ[k] for k in keys if k in os.environ}


def _expect_exit3(out, *needles: str) -> None:
    assert out.returncode == 3, (out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_gated_repo_not_logged_in_and_not_approved(fake_hub, small_model, tmp_path):
    # As on the real Hub: the metadata of a gated repo is public, only file reads answer 401/403.
    fake_hub.add_folder("meta-llama/Meta-Llama-3-8B", small_model, gated="auto")
    env = _cli_env(fake_hub)
    _expect_exit3(
        run_cli("fit", "meta-llama/Meta-Llama-3-8B", "--db", str(tmp_path), env=env),
        "gated",
        "HF_TOKEN",
        "request access",
    )
    _expect_exit3(
        run_cli("fit", "meta-llama/Meta-Llama-3-8B", "--token", "hf_nope", "--db", str(tmp_path), env=env),
        "no access yet",
    )
    fake_hub.approved_tokens.add("hf_good")
    ok = run_cli(  # a Hub fit in its own process: huggingface_hub reads HF_* and the token from a fresh start
        "fit",
        "meta-llama/Meta-Llama-3-8B",
        "--db",
        str(tmp_path),
        "-q",
        "--device",
        "cpu",
        env={**env, "HF_TOKEN": "hf_good"},
        real=True,
    )
    assert ok.returncode == 0, ok.stderr


def test_gated_file_access_with_public_metadata(fake_hub, small_model):
    fake_hub.add_folder("acme/tiny-restricted", small_model, gated="manual")  # the real Hub gates /resolve only
    with pytest.raises(HubError, match=r"gated .*log in"):
        _fit_hub("acme/tiny-restricted")
    with pytest.raises(HubError, match="no access yet"):
        api.fit_model("acme/tiny-restricted", FitOptions(device="cpu"), token="hf_not_approved")
    assert {r.status for r in fake_hub.requests_to("/api/models/acme/tiny-restricted")} == {200}


def test_missing_repo_revision_and_weights(fake_hub, small_model, tmp_path):
    fake_hub.add_folder("EleutherAI/pythia-70m", small_model, branch="step1000")
    fake_hub.add_folder("EleutherAI/pythia-70m", small_model, branch="step2000")
    fake_hub.add_folder("EleutherAI/pythia-70m", small_model, branch="step4000")
    fake_hub.add_repo("acme/empty", {"README.md": b"# nothing here\n", "config.json": b"{}"})
    env = _cli_env(fake_hub)
    _expect_exit3(run_cli("fit", "nobody/nothing", "--db", str(tmp_path), env=env), "no such model repository")
    _expect_exit3(
        run_cli("fit", "EleutherAI/pythia-70m@step2500", "--db", str(tmp_path), env=env),
        "not found",
        "nearest existing: step1000, step2000, step4000",
    )
    _expect_exit3(run_cli("fit", "acme/empty", "--db", str(tmp_path), env=env), "no weights")
    assert not any(tmp_path.rglob("*.json"))


def test_network_unreachable_and_offline_with_nothing_cached(tmp_path):
    # Real processes: without the fake_hub fixture, huggingface_hub in this process still points at the user's
    # HF home and hf.co (it read them at import); a fresh interpreter reads this environment.
    env = {
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(tmp_path / "home"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    _expect_exit3(run_cli("fit", "acme/tiny", "--db", str(tmp_path), env=env, real=True), "cannot reach the Hub")
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    _expect_exit3(run_cli("fit", "acme/tiny", "--db", str(tmp_path), env=offline, real=True), "not in the local cache")
    bad = run_cli("fit", "acme/ti..ny", "--db", str(tmp_path), env=env, real=True)  # naming rules: input, not network
    assert bad.returncode == 2
    assert "not a valid Hub repo id" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_offline_mode_and_unreachable_hub_use_the_cache(fake_hub, small_model, tmp_path):
    fake_hub.add_folder("acme/tiny", small_model)
    api.fit_model("acme/tiny", FitOptions(device="cpu"), download=True)
    env = _cli_env(fake_hub)
    offline = {**env, "HF_HUB_OFFLINE": "1"}  # in its own process, where huggingface_hub itself starts offline
    out = run_cli("fit", "acme/tiny", "--json", "--no-save", "-q", "--device", "cpu", env=offline, real=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["source"] == "hub"
    fake_hub.stop()
    out = run_cli("fit", "acme/tiny", "--json", "--no-save", "-q", "--device", "cpu", env=env)
    assert out.returncode == 0, out.stderr
    assert "unreachable" in " ".join(json.loads(out.stdout)["notes"])


def test_hf_cache_folder_from_a_download_is_a_local_model_too(fake_hub, small_model):
    fake_hub.add_folder("acme/tiny", small_model)
    api.fit_model("acme/tiny", FitOptions(device="cpu"), download=True)
    repo_cache = Path(os.environ["HF_HUB_CACHE"]) / "models--acme--tiny"
    row = fit_path(str(repo_cache), FitOptions(device="cpu"))
    assert row["model"]["id"] == "acme/tiny"
    assert row["model"]["revision"] == "main"
    assert all(f["sha256"] for f in row["files"])


def test_token_goes_to_the_hub_and_never_to_the_cdn(fake_hub, small_model):
    fake_hub.add_folder("acme/tiny", small_model)
    api.fit_model("acme/tiny", FitOptions(device="cpu"), token="hf_secret")
    cdn = [r for r in fake_hub.requests if r.path.startswith("/cdn/")]
    hub = [r for r in fake_hub.requests if "/resolve/" in r.path]
    assert cdn
    assert hub
    assert all(r.authorized for r in hub)
    assert not any(r.authorized for r in cdn)
    # After the first redirect per file, tensors go straight to the remembered CDN location.
    shards = len(list(small_model.glob("*.safetensors")))
    assert len([r for r in hub if r.path.endswith(".safetensors")]) <= 2 * shards


def test_download_mode_refuses_a_damaged_index(fake_hub, tmp_path):
    from weightdiag.errors import CheckpointFormatError

    fake_hub.add_repo(
        "acme/broken", {"model.safetensors.index.json": json.dumps({"weight_map": {"a": ["x"]}}).encode()}
    )
    with pytest.raises(CheckpointFormatError, match="no valid weight_map"):
        api.fit_model("acme/broken", FitOptions(device="cpu"), download=True)


def test_streaming_refuses_a_damaged_index(fake_hub, small_model):
    files = {p.name: p.read_bytes() for p in small_model.glob("*.safetensors")}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {"a": 3}}).encode()
    fake_hub.add_repo("acme/broken-stream", files)
    with pytest.raises(HubError, match="not a valid safetensors index"):
        api.fit_model("acme/broken-stream", FitOptions(device="cpu"))
