"""fit and diff --executor ray (issue 30): one checkpoint's chunks reduced by tasks on a real multi-node Ray cluster
on loopback (tests/ray_cluster.py: `ray start` nodes with their own temp dirs), the row byte-identical to the
local fit's (all but `created` and `run`) on 1 and 3 nodes: BF16, F32 with a tensor cut into several tasks,
FP8 and INT4 checkpoints (decoded on the nodes), from local files and from the loopback Hub (verified there);
a worker killed with SIGKILL mid-task (Ray runs the task again); an interrupted fit resumed; a node that
cannot see the path (one line naming the node and the file, exit 2); Ray missing (the install hint, exit 2).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weightdiag.executor import balanced_runs, task_bytes
from weightdiag.source.chunks import Chunk
from weightdiag.testing import synthetic

from .conftest import CLI_ENV, run_cli
from .hub_server import write_small_model
from .ray_cluster import LocalCluster, can_hide_paths

_CONTEXT = ("created", "run")  # run metadata: when, how long, where (the cluster's nodes)
SMALL_TASKS = str(1 << 16)  # bytes per task: a model of four 0.4 MB shards becomes four tasks
SPLIT_TASKS = str(16 << 20)  # a 34 MB F32 tensor's 32 MiB chunk alone exceeds it: the tensor spans tasks


def _science(row: dict) -> str:
    """The row as bytes, but run metadata: what must be identical whatever the executor."""
    return json.dumps({k: v for k, v in row.items() if k not in _CONTEXT}, sort_keys=True)


# --- the plan's tasks (no cluster) -----------------------------------------------------------------------


def _chunks(sizes: list[tuple[int, int]]) -> list[Chunk]:
    """Chunks of (shard, bytes), consecutive in each shard."""
    out, at = [], {}
    for shard, size in sizes:
        start = at.get(shard, 0)
        out.append(Chunk(len(out), shard, start, start + size, ()))
        at[shard] = start + size
    return out


def _chunk_runs(chunks: list[Chunk], budget: int, verify: bool) -> list[list[int]]:
    """The runs of chunks a Ray executor makes of a fit's chunk pass (executor.py: balanced by bytes, cut where
    the pass allows)."""
    from weightdiag.reduce.stream import ChunkPass

    job = ChunkPass((), tuple(chunks), verify)
    return [list(r) for r in balanced_runs(job.weights(), budget, job.cuts())]


def test_tasks_take_runs_of_chunks_within_the_budget_and_whole_shards_when_they_are_hashed():
    chunks = _chunks([(0, 30), (0, 30), (1, 40), (2, 10), (3, 50), (3, 50), (3, 50), (4, 5)])
    runs = _chunk_runs(chunks, 100, verify=False)
    # runs of consecutive chunks of at most the budget, across shards: shard 3 is cut
    assert runs == [[0, 1, 2], [3, 4], [5, 6], [7]]
    # every chunk once, in plan order: the driver folds tasks in order and so merges chunks in order
    assert [i for r in runs for i in r] == list(range(len(chunks)))
    # a verified plan: shards whole, so that shard 3 (150 bytes) is hashed by the one task that reads all of it
    assert _chunk_runs(chunks, 100, verify=True) == [[0, 1, 2], [3], [4, 5, 6], [7]]
    # one chunk larger than the budget is a task of its own
    assert _chunk_runs(_chunks([(0, 500), (0, 10)]), 100, verify=False) == [[0], [1]]


def test_task_size_gives_every_cpu_about_two_tasks_within_the_budget():
    assert task_bytes(100 << 30, slots=4, budget=2 << 30) == 2 << 30  # large model: the budget
    assert task_bytes(4 << 30, slots=4, budget=2 << 30) == 512 << 20  # 8 tasks for 4 CPUs
    assert task_bytes(100 << 20, slots=8, budget=2 << 30) == 64 << 20  # never tiny tasks
    assert task_bytes(100 << 20, slots=8, budget=1 << 20) == 1 << 20  # unless the budget says so


def test_spectrum_and_diff_tasks_take_whole_items_balanced_and_cut_only_where_allowed():
    from weightdiag.delta.compare import PairsPass
    from weightdiag.delta.pairing import Pair
    from weightdiag.delta.result import DiffOptions
    from weightdiag.dtypes import DTYPES
    from weightdiag.source.plan import TensorRef

    # whole items, consecutive, about the share each; an item larger than the share is a task of its own
    assert [list(r) for r in balanced_runs([4, 4, 4, 10, 1, 1], 8)] == [[0, 1], [2], [3], [4, 5]]
    # a run may start only where allowed: before item 2 it may not, so items 1-2 stay together
    assert [list(r) for r in balanced_runs([4, 4, 4, 4], 4, [True, True, False, True])] == [[0], [1, 2], [3]]

    def ref(name: str, shard: int) -> TensorRef:
        return TensorRef(name, DTYPES["F32"], (4, 4), shard, 0, 64)

    # base: shards 0 0 1 2; tuned: one shard for the first three pairs, then 1 (shard 2 holds no pair)
    pairs = [
        Pair(f"t{i}", ref(f"t{i}", b), ref(f"t{i}", t)) for i, (b, t) in enumerate([(0, 0), (0, 0), (1, 0), (2, 1)])
    ]

    def diff_pass(base: set[int] | None, tuned: set[int] | None) -> PairsPass:
        return PairsPass(tuple(pairs), None, DiffOptions(), (base, tuned), (3, 3))  # type: ignore[arg-type]

    hashed = {0, 1, 2}  # a verified side (the shards it hashes), the other not
    assert diff_pass(hashed, None).cuts() == [True, False, True, True]  # both pairs of base shard 0 in one task
    assert diff_pass(hashed, hashed).cuts() == [True, False, False, True]  # tuned shard 0 too
    job = diff_pass(hashed, hashed)
    # each task hashes the shards after its predecessor's last, up to its own last; the last one to the end
    assert [job.owned(r, 1) for r in (range(0, 3), range(3, 4))] == [frozenset({0}), frozenset({1, 2})]
    assert [job.owned(r, 0) for r in (range(0, 3), range(3, 4))] == [frozenset({0, 1}), frozenset({2})]
    assert diff_pass(hashed, None).owned(range(0, 3), 1) is None  # an unverified side hashes nothing


@pytest.mark.e2e
@pytest.mark.slow
def test_a_node_with_other_kernels_is_refused_before_any_task(tmp_path, models):
    """Issue 42 item 9: the nodes are checked for the driver's weightdiag build and kernels before any task: a node
    on the numpy kernels (its F32 sums differ in the last digits) fails the fit in one line naming it, exit 2."""
    pytest.importorskip("ray")
    with LocalCluster(tmp_path / "ray", nodes=1, env={"WEIGHTDIAG_KERNELS": "numpy"}) as other:
        out = run_cli(
            "fit", str(models["bf16"]), "--no-save", "-q", "--executor", "ray", "--ray-address", other.address,
            real=True, timeout=300,
        )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --executor ray: node "), out.stderr
    assert "with the numpy kernels, this machine" in lines[0] and "with the c kernels" in lines[0]


@pytest.mark.parametrize("command", ["fit", "diff"])
def test_ray_missing_says_how_to_install_it(command, tmp_path, small_llama):
    """No Ray: the [ray] extra's hint, exit 2, before anything is read (fit and diff)."""
    blocker = tmp_path / "no_ray" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    path = os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])
    models = [str(small_llama)] * (2 if command == "diff" else 1)
    out = run_cli(command, *models, "--executor", "ray", "--no-save", env={"PYTHONPATH": path}, real=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "pip install '.[ray]'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_cluster_that_does_not_answer_is_one_line_and_exit_3_at_once(small_llama):
    """Nothing listens at the address: one line, exit 3, in seconds (ray.init alone retries for minutes)."""
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free: nothing answers there once the socket is closed
    started = time.monotonic()
    out = run_cli(
        "fit", str(small_llama), "--no-save", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
        real=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 60


def test_options_that_cannot_go_with_a_cluster_are_refused(small_llama):
    out = run_cli("fit", str(small_llama), "--executor", "ray", "--device", "cuda", "--no-save")
    assert out.returncode == 2 and "--executor ray" in out.stderr
    out = run_cli("fit", "acme/tiny", "--executor", "ray", "--download", "--no-save")
    assert out.returncode == 2 and "--download" in out.stderr
    out = run_cli("fit", str(small_llama), "--executor", "slurm", "--no-save")
    assert out.returncode == 2 and "--executor" in out.stderr


# --- a real cluster ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ray-models")
    out = {
        # BF16, four shards
        "bf16": synthetic.write_model(
            root / "bf16",
            synthetic.ModelSpec(
                n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=7
            ),
        ),
        # F32, one shard: a 34.6 MB embedding (three 16 MiB pieces, two chunks), more than a task's 16 MiB
        "f32": synthetic.write_model(
            root / "f32",
            synthetic.ModelSpec(
                n_layers=1, d_model=1024, n_heads=8, n_kv_heads=8, ffn_size=1024, vocab=8448, dtype="F32",
                tied_embeddings=True, seed=11,
            ),
        ),
    }  # fmt: skip
    pytest.importorskip("torch")
    from benchmarks.bench_quant import write

    quantized = write(root / "quant", layers=1)
    out["fp8"], out["int4"] = quantized["fp8"], quantized["int4"]
    return out


@pytest.fixture(scope="module")
def local_rows(models) -> dict[str, dict]:
    """Each model fitted locally: the rows every cluster fit must equal."""
    return {name: _fit(path) for name, path in models.items()}


def _fit(spec: str | Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    out = run_cli("fit", str(spec), "--no-save", "--json", "-q", *extra, env=env, real=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _ray_fit(spec: str | Path, cluster: LocalCluster, *extra: str, env: dict[str, str] | None = None) -> dict:
    return _fit(spec, "--executor", "ray", "--ray-address", cluster.address, *extra, env=env)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory, models) -> LocalCluster:
    """A running cluster, by the test's parameter: "1-node", "2-nodes", "3-nodes", or "3-nodes-one-blind" (the last node
    does not see the BF16 model's folder). One at a time: tests are grouped by it, the machine is small."""
    pytest.importorskip("ray")
    kind = request.param
    hide = None
    if kind.endswith("blind"):
        if not can_hide_paths():
            pytest.skip("cannot start a node in a mount namespace of its own here")
        hide = models["bf16"]
    with LocalCluster(tmp_path_factory.mktemp("ray"), nodes=int(kind[0]), hide=hide) as running:
        yield running


ONE_AND_THREE = pytest.mark.parametrize("cluster", ["1-node", "3-nodes"], indirect=True)
ONE_TWO_AND_THREE = pytest.mark.parametrize("cluster", ["1-node", "2-nodes", "3-nodes"], indirect=True)
THREE = pytest.mark.parametrize("cluster", ["3-nodes"], indirect=True)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", ["bf16", "f32", "fp8", "int4"])
@ONE_TWO_AND_THREE
def test_rows_are_byte_identical_to_the_local_fit(name, cluster, models, local_rows):
    budget = SPLIT_TASKS if name == "f32" else SMALL_TASKS
    row = _ray_fit(models[name], cluster, env={"WEIGHTDIAG_RAY_TASK_BYTES": budget})
    assert _science(row) == _science(local_rows[name])
    spread = row["run"]["cluster"]
    assert spread["executor"] == "ray" and spread["tasks"] >= 1
    assert sum(n["tasks"] for n in spread["nodes"]) == spread["tasks"]
    assert sum(n["bytes"] for n in spread["nodes"]) == row["run"]["bytes_read"]
    assert len(spread["nodes"]) <= cluster.nodes
    if name == "f32":  # one shard, yet several tasks: its 34.6 MB embedding was cut between tasks
        assert len(row["files"]) == 1 and spread["tasks"] >= 2
    if name == "bf16" and cluster.nodes == 3:
        assert spread["tasks"] == 4 and len(spread["nodes"]) >= 2  # spread over the nodes


@pytest.fixture(scope="module")
def local_spectrum_rows(models) -> dict[str, dict]:
    """`fit --spectrum` of each model, locally: what the cluster's spectrum pass must give, byte for byte."""
    return {name: _fit(models[name], "--spectrum") for name in ("bf16", "int4")}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", ["bf16", "int4"])
@ONE_AND_THREE
def test_spectrum_rows_are_byte_identical_to_the_local_fit(name, cluster, models, local_spectrum_rows):
    """fit --spectrum --executor ray: the matrices' spectra are taken on the nodes (whole matrices per task,
    the BLAS threads of the driver), every record's `spectrum` the local pass's to the last bit: tall and wide
    matrices (BF16) and a quantized format decoded on the nodes (INT4)."""
    local = local_spectrum_rows[name]
    row = _ray_fit(models[name], cluster, "--spectrum", env={"WEIGHTDIAG_RAY_TASK_BYTES": SMALL_TASKS})
    assert _science(row) == _science(local)
    taken = [m for m in row["matrices"] if "spectrum" in m]
    assert taken and len(taken) == row["run"]["spectrum"]["matrices"]
    spread = row["run"]["cluster"]
    # the spectrum's tasks read every matrix again on the nodes: more bytes than the fit pass alone
    assert sum(n["bytes"] for n in spread["nodes"]) > row["run"]["bytes_read"]
    if cluster.nodes == 3:
        assert len(spread["nodes"]) >= 2


def _workers_running_tasks(cluster: LocalCluster) -> list[int]:
    import psutil

    found = []
    for pid in cluster.pids():
        try:
            if "ray::run_task" in " ".join(psutil.Process(pid).cmdline()):
                found.append(pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.e2e
@pytest.mark.slow
@THREE
def test_a_worker_killed_mid_task_is_run_again_and_the_row_is_the_same(cluster, models, local_rows):
    env = {
        **os.environ,
        **CLI_ENV,
        "WEIGHTDIAG_RAY_TASK_BYTES": SMALL_TASKS,
        "WEIGHTDIAG_TEST_RAY_TASK_DELAY": "1.5",  # each task holds its worker a while
    }
    command = [sys.executable, "-m", "weightdiag", "fit", str(models["bf16"]), "--no-save", "--json", "-q"]
    command += ["--executor", "ray", "--ray-address", cluster.address]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as fit:
        killed = None
        deadline = time.time() + 120
        while killed is None and time.time() < deadline and fit.poll() is None:
            running = _workers_running_tasks(cluster)
            if running:
                killed = running[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.1)
        stdout, stderr = fit.communicate(timeout=300)
    assert killed is not None, "no task was seen running"
    assert fit.returncode == 0, stderr[-3000:]
    assert stdout.strip(), stderr[-3000:]
    assert _science(json.loads(stdout)) == _science(local_rows["bf16"])


@pytest.mark.e2e
@pytest.mark.slow
@THREE
def test_an_interrupted_cluster_fit_resumes(cluster, models, local_rows, tmp_path):
    """The driver journals each tensor as it is folded: a fit stopped half way (Ctrl-C) is resumed by the
    next one, on the cluster too, and the row is the uninterrupted one's."""
    db = tmp_path / "db"
    script = f"""
import sys
from weightdiag import api
from weightdiag.run.measure import FitOptions
from weightdiag.progress import Silent
class Stop(Silent):
    done = 0
    def measured(self, tensor):
        self.done += 1
        if self.done == 10:
            raise KeyboardInterrupt
stop = Stop()
options = FitOptions(executor="ray", ray_address={cluster.address!r})
try:
    api.fit({str(models["bf16"])!r}, options, stop, db_dir={str(db)!r})
except KeyboardInterrupt:
    sys.exit(130)
"""
    env = {**os.environ, **CLI_ENV, "WEIGHTDIAG_RAY_TASK_BYTES": SMALL_TASKS}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 130, out.stderr[-3000:]
    assert not list((db / "rows").glob("*.json"))
    again = run_cli(
        "fit", str(models["bf16"]), "--db", str(db), "--json", "-q", "--executor", "ray",
        "--ray-address", cluster.address, env={"WEIGHTDIAG_RAY_TASK_BYTES": SMALL_TASKS}, real=True,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    row = json.loads(again.stdout)
    assert row["run"]["resumed"]["tensors"] >= 10
    assert _science(row) == _science(local_rows["bf16"])


@pytest.mark.e2e
@pytest.mark.slow
@ONE_AND_THREE
def test_a_hub_model_is_verified_on_the_nodes_and_its_row_is_the_local_one(cluster, fake_hub, tmp_path):
    """From the loopback Hub each node streams its own byte ranges and hashes the shards it reads whole: the
    row (every shard verified) is the local streamed fit's."""
    model = write_small_model(tmp_path / "model", shard_bytes=50_000)
    fake_hub.add_folder("acme/tiny", model)
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    env = {k: os.environ[k] for k in keys if k in os.environ} | {"WEIGHTDIAG_RAY_TASK_BYTES": str(1 << 16)}
    local = _fit("acme/tiny", env=env)
    assert all(f["verified"] for f in local["files"])
    row = _ray_fit("acme/tiny", cluster, env=env)
    assert _science(row) == _science(local)
    assert row["run"]["verification"] == local["run"]["verification"]
    assert 2 <= row["run"]["cluster"]["tasks"] <= len(row["files"])  # a verified shard is one task's, whole


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["3-nodes-one-blind"], indirect=True)
@pytest.mark.parametrize("command", ["fit", "diff"])
def test_a_node_that_cannot_read_the_path_fails_with_one_line_naming_it(cluster, models, tmp_path, command):
    """The last node sees an empty folder where the checkpoint is (a tmpfs over it in its own mount
    namespace): the fit, or a diff of the model against itself, stops with one line naming that node and the
    file, exit 2, no row."""
    model, db = models["bf16"], tmp_path / "db"
    args = ["fit", str(model), "--db", str(db)] if command == "fit" else ["diff", str(model), str(model), "--no-save"]
    out = run_cli(
        *args, "--executor", "ray", "--ray-address", cluster.address,
        env={"WEIGHTDIAG_RAY_TASK_BYTES": SMALL_TASKS, "WEIGHTDIAG_TEST_RAY_TASK_DELAY": "0.5"}, real=True,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert re.search(rf"node \S+ \([0-9a-f]{{8}}\): cannot read {re.escape(str(model))}/model-0000", lines[0])
    assert not list((db / "rows").glob("*.json"))


# --- diff --executor ray --------------------------------------------------------------------------------------

_DIFF_CONTEXT = ("seconds", "created", "cluster", "saved")  # run metadata of a diff: when, how long, where
DIFF_TASKS = str(1 << 20)  # a pair of 2.9 MB checkpoints becomes about six tasks of whole tensor pairs


def _diff_science(result: dict) -> str:
    run = {k: v for k, v in result["run"].items() if k not in _DIFF_CONTEXT}
    return json.dumps({**result, "run": run}, sort_keys=True)


def _diff(base: str | Path, tuned: str | Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    out = run_cli("diff", str(base), str(tuned), "--no-save", "--json", "-q", *extra, env=env, real=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def diff_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A base and a tuned checkpoint with planted changes (a frozen block, a rank-2 update, a scaled matrix),
    the tuned one stored in BF16: mixed dtypes, exact figures and spectra (Gram and whole-matrix paths)."""
    import torch

    from .diff_checkpoints import base_tensors, low_rank_update, noise, write

    root = tmp_path_factory.mktemp("ray-diff")
    base = base_tensors()
    tuned = noise(base, 1e-3, seed=1, keep=lambda n: n.startswith("model.layers.0."))
    q1 = "model.layers.1.self_attn.q_proj.weight"
    tuned[q1] = low_rank_update(base[q1], rank=2, seed=2)
    return write(root / "base", base), write(root / "tuned", tuned, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def local_diff(diff_pair) -> dict:
    return _diff(*diff_pair)


@pytest.mark.e2e
@pytest.mark.slow
@ONE_AND_THREE
def test_diff_on_the_cluster_is_the_local_diff(cluster, diff_pair, local_diff):
    """diff --executor ray: whole tensor pairs compared by tasks on the nodes, put together in pair order: the
    result JSON is the local diff's (all but times and run.cluster) on 1 and 3 nodes."""
    result = _diff(
        *diff_pair, "--executor", "ray", "--ray-address", cluster.address, env={"WEIGHTDIAG_RAY_TASK_BYTES": DIFF_TASKS}
    )
    assert _diff_science(result) == _diff_science(local_diff)
    spread = result["run"]["cluster"]
    assert spread["tasks"] >= 3 and sum(n["tasks"] for n in spread["nodes"]) == spread["tasks"]
    assert sum(n["bytes"] for n in spread["nodes"]) == result["run"]["bytes_read"]
    if cluster.nodes == 3:
        assert len(spread["nodes"]) >= 2


@pytest.mark.e2e
@pytest.mark.slow
@ONE_AND_THREE
def test_report_histograms_are_the_chunk_pass_on_the_nodes_and_the_local_ones(cluster, models, local_rows):
    """`report --plot`'s matrices re-read for their |w| histograms: the fit's chunk pass, on whichever executor the
    report's options name (a quantized model: decoded on the nodes), the same histograms as a local re-read."""
    from weightdiag.execution import Execution
    from weightdiag.run.histograms import read_histograms

    for name in ("bf16", "int4"):
        row = local_rows[name]
        names = [m["name"] for m in row["matrices"]][:3]
        here = Execution.build("cpu")
        there = Execution.build("cpu", executor="ray", ray_address=cluster.address)
        try:
            got, note = read_histograms(row, names, str(models[name]), None, there)
        finally:
            there.close()
        want, _ = read_histograms(row, names, str(models[name]), None, here)
        assert note is None and set(got) == set(want) == set(names)
        for matrix in names:
            assert (got[matrix]["hist1024"] == want[matrix]["hist1024"]).all()
            assert got[matrix]["n"] == want[matrix]["n"] and (got[matrix]["counts"] == want[matrix]["counts"]).all()
        assert there.executor.summary()["tasks"] >= 1  # it ran on the cluster


@pytest.mark.e2e
@pytest.mark.slow
@THREE
def test_a_hub_diff_is_verified_on_the_nodes_and_is_the_local_one(cluster, fake_hub, tmp_path):
    """Two Hub checkpoints of several shards: each task hashes whole shards of both sides (tasks cut where
    both move on to later shards), every shard verified as in the local diff, the same result."""
    fake_hub.add_folder("acme/base", write_small_model(tmp_path / "base", shard_bytes=50_000, seed=1))
    fake_hub.add_folder("acme/tuned", write_small_model(tmp_path / "tuned", shard_bytes=50_000, seed=2))
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    env = {k: os.environ[k] for k in keys if k in os.environ} | {"WEIGHTDIAG_RAY_TASK_BYTES": str(1 << 16)}
    local = _diff("acme/base", "acme/tuned", env=env)
    assert all(v.startswith("sha256 of every shard verified") for v in local["run"]["verification"].values())
    result = _diff("acme/base", "acme/tuned", "--executor", "ray", "--ray-address", cluster.address, env=env)
    assert _diff_science(result) == _diff_science(local)
    assert result["run"]["cluster"]["tasks"] >= 2


# --- progress per node ----------------------------------------------------------------------------------------


def test_node_progress_needs_a_cluster_and_counts_per_node():
    """--node-progress without --executor ray is refused (exit 2); its lines count each node's tasks and bytes."""
    import io

    from rich.console import Console

    from weightdiag.render.tables import NodeProgress

    out = run_cli("fit", "acme/tiny", "--node-progress", "--no-save")
    assert out.returncode == 2 and "--executor ray" in out.stderr
    from weightdiag.progress import Events

    class Bar(Events):
        def close(self):
            self.calls.append(("closed", ()))

    bar = Bar()
    text = io.StringIO()
    progress = NodeProgress(bar, Console(file=text, width=200))
    progress.node_done("node 10.0.0.1 (0123abcd)", 3_000_000, False)
    progress.node_done("node 10.0.0.2 (4567ef01)", 1_000_000, False)
    progress.node_done("node 10.0.0.1 (0123abcd)", 2_000_000, True)
    progress.read(10)
    progress.close()
    assert text.getvalue().splitlines() == [
        "node 10.0.0.1 (0123abcd): 1 task done, 3.0 MB read",
        "node 10.0.0.2 (4567ef01): 1 task done, 1.0 MB read",
        "node 10.0.0.1 (0123abcd): 2 tasks done, 5.0 MB read (the last one a spectrum task)",
    ]
    assert [name for name, _ in bar.calls] == ["node_done"] * 3 + ["read", "closed"]  # the bar gets every call


@pytest.mark.e2e
@pytest.mark.slow
@THREE
def test_node_progress_prints_each_nodes_tasks_and_bytes(cluster, models, diff_pair):
    """fit and diff --node-progress on 3 nodes: a line per task handed back; each node's last line holds the
    tasks and bytes run.cluster records for it."""
    for command in (
        ["fit", str(models["bf16"])],
        ["diff", *map(str, diff_pair)],
    ):
        out = run_cli(
            *command, "--no-save", "--json", "--node-progress", "--executor", "ray", "--ray-address", cluster.address,
            env={"WEIGHTDIAG_RAY_TASK_BYTES": SMALL_TASKS if command[0] == "fit" else DIFF_TASKS}, real=True,
            timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        spread = json.loads(out.stdout)["run"]["cluster"]
        lines = re.findall(r"^(node \S+ \([0-9a-f]{8}\)): (\d+) tasks? done, ([\d.]+) MB read", out.stderr, re.M)
        assert len(lines) == spread["tasks"], out.stderr
        last = {node: (int(tasks), float(mb)) for node, tasks, mb in lines}
        assert {n["node"]: n["tasks"] for n in spread["nodes"]} == {node: t for node, (t, _) in last.items()}
        for n in spread["nodes"]:
            assert last[n["node"]][1] == pytest.approx(n["bytes"] / 1e6, abs=0.051)
