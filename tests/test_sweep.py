"""Sweeping a training run and reading its trajectory: synthetic runs with known dynamics."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weightdiag.database.store import find_rows, iter_rows, load_row
from weightdiag.diagnose import trajectory as tr
from weightdiag.errors import BadInputError
from weightdiag.run import sweep as sw
from weightdiag.testing import synthetic

from .conftest import default_signals, run_cli
from .ray_cluster import LocalCluster

RUN = synthetic.RunSpec()  # steps 0..8000, peak 1000, 2 stagnant deep blocks, step 8000 == step 4000


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    synthetic.write_training_run(root, RUN)
    return root


def _science(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("created", "run", "model", "files")}


def _rows(db: Path) -> dict[str, dict]:
    return {row["model"]["revision"]: row for _, row in iter_rows(db)}


@pytest.mark.e2e
def test_sweep_a_run_served_from_the_hub_and_read_its_trajectory(fake_hub, run_folder, tmp_path):
    for step in RUN.steps:
        fake_hub.add_folder("EleutherAI/pythia-70m", run_folder / f"step_{step}", branch=f"step{step}")
    db = tmp_path / "db"
    plan = sw.plan_sweep("EleutherAI/pythia-70m", everything=True)
    assert [r.name for r in plan.revisions] == [f"step{s}" for s in RUN.steps]  # ordered by step, not by name
    fake_hub.reset_counters()
    outcomes = sw.run_sweep(plan, db, {"protocol": "hist1024", "device": "cpu"})
    status = {o.revision: o.status for o in outcomes}
    assert status.pop("step8000") == "reused"
    assert set(status.values()) == {"fitted"}
    # The duplicate was recognised from its LFS object ids: its bytes were never requested.
    assert not [r for r in fake_hub.requests if "step8000" in r.path and r.path.endswith(".safetensors")]
    rows = _rows(db)
    assert rows["step8000"]["duplicate_of"] == "step4000"
    assert _science({**rows["step8000"], "duplicate_of": None, "hyperparameters": None}) == _science(
        {**rows["step4000"], "duplicate_of": None, "hyperparameters": None}
    )
    # Pythia's recipe is recognised from the repo name and T comes from each step branch.
    assert rows["step1000"]["hyperparameters"]["steps"] == 1000
    assert rows["step1000"]["hyperparameters"]["t_over_tau"] == pytest.approx(1000 * 1e-3 * 0.01)

    t = tr.trajectory(find_rows("EleutherAI/pythia-70m", db))
    assert t["steps"] == list(RUN.steps)
    assert t["lambda_o_peak"]["peak_step"] == RUN.peak_step  # lambda growth, then retreat
    assert 10 < t["lambda_o_peak"]["retreat_percent"] < 25
    assert t["paired_lambda"]["pearson_r_loglog"] > 0.99
    assert t["drift"]["qkv"]["delta_from_step0"] < -0.1  # Q/K (fused) k falling
    assert abs(t["drift"]["ffn_in"]["delta_from_step0"]) < 0.02  # Transmission k stays put
    assert t["std_pattern"]["pattern"] == "deep-layer stagnation"
    assert t["std_pattern"]["blocks"] == [RUN.n_layers - 2, RUN.n_layers - 1]
    step0 = t["step0"]
    assert step0["k_at_anchor"]
    assert step0["norms_at_sqrt_d"]
    assert step0["lambda_ratio"]["closest"].startswith("small_init + wang_init")
    assert abs(step0["lambda_ratio"]["error_percent"]) < 1  # paper Table 5: within 0.13%
    assert t["duplicates"] == {"step8000": "step4000"}
    assert t["states"][-1]["state"] == "Transition"


def test_resume_skips_existing_rows_and_local_duplicates_are_hard_links(run_folder, tmp_path):
    db = tmp_path / "db"
    plan = sw.plan_sweep(str(run_folder), steps="0,1000,4000,8000")
    first = sw.run_sweep(plan, db, {"protocol": "hist1024", "device": "cpu"})
    assert [o.status for o in first] == ["fitted", "fitted", "fitted", "reused"]
    again = sw.run_sweep(plan, db, {"protocol": "hist1024", "device": "cpu"})
    assert {o.status for o in again} == {"existing"}
    assert len(list((db / "rows").glob("*.json"))) == 4


def test_selection():
    revs = [sw.Revision(f"step{s}", s, f"x@step{s}") for s in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)]
    revs.append(sw.Revision("main", None, "x@main"))
    chosen = sw.select(revs, steps="log:5")
    assert next(r.step for r in chosen) == 0
    assert chosen[-1].step == 1000
    assert len(chosen) == 5
    assert [r.name for r in sw.select(revs, names=["step4", "main"])] == ["step4", "main"]
    assert len(sw.select(revs, everything=True)) == 13
    assert [r.step for r in sw.select(revs, steps="8,64")] == [8, 64]
    with pytest.raises(BadInputError, match="does not exist"):
        sw.select(revs, names=["step3"])
    with pytest.raises(BadInputError, match="step 3 does not exist"):
        sw.select(revs, steps="3")
    with pytest.raises(BadInputError, match="log:N"):
        sw.select(revs, steps="log:x")


def test_cosine_schedule_integral():
    # Constant: T steps. Cosine to 10% after a 1% warm-up: the mean rate over the run is ~0.55.
    assert tr.lr_integral(500, 1000, 0, "constant", 0.1) == 500
    full = tr.lr_integral(143_000, 143_000, 1430, "cosine", 0.1)
    assert full / 143_000 == pytest.approx(0.55 * 0.99 + 0.005, abs=0.01)
    assert tr.lr_integral(1430, 143_000, 1430, "cosine", 0.1) == pytest.approx(715)


# --- the CLI: parallel workers, Ray, interruption ------------------------------------------------------


def _sweep_cli(run_folder: Path, db: Path, *extra: str, env: dict | None = None, real: bool = False):
    return run_cli("sweep", str(run_folder), "--all", "--db", str(db), "--device", "cpu", *extra, env=env, real=real)


@pytest.mark.e2e
def test_jobs_2_gives_the_same_rows_as_a_serial_sweep(run_folder, tmp_path):
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    out = _sweep_cli(run_folder, serial)
    assert out.returncode == 0, out.stderr
    assert "14 fitted, 1 reused" in out.stdout
    # A real process: worker processes (spawn, a resource tracker) are process-wide state.
    out = _sweep_cli(run_folder, parallel, "--jobs", "2", real=True)
    assert out.returncode == 0, out.stderr
    a, b = _rows(serial), _rows(parallel)
    assert set(a) == set(b)
    assert len(a) == len(RUN.steps)
    for rev in a:
        assert _science(a[rev]) == _science(b[rev]), rev


@pytest.mark.e2e
@pytest.mark.slow
def test_ray_executor_gives_the_same_rows(run_folder, tmp_path):
    pytest.importorskip("ray")
    # A node of its own, stopped by its processes: `ray stop --force` would end every Ray on the machine.
    with LocalCluster(tmp_path / "ray-cluster", nodes=1, cpus=2) as cluster:
        serial, ray_db = tmp_path / "serial", tmp_path / "ray"
        assert _sweep_cli(run_folder, serial).returncode == 0
        out = _sweep_cli(
            run_folder,
            ray_db,
            "--executor",
            "ray",
            "--ray-address",
            cluster.address,
            env={"RAY_AUTH_MODE": "disabled"},
            real=True,  # ray.init connects the process to the cluster for good
        )
        assert out.returncode == 0, out.stdout + out.stderr
        a, b = _rows(serial), _rows(ray_db)
        assert set(a) == set(b)
        for rev in a:
            assert _science(a[rev]) == _science(b[rev]), rev


@pytest.mark.e2e
def test_kill_9_in_the_middle_then_rerun_leaves_exactly_one_valid_row_each(tmp_path):
    run = synthetic.RunSpec(
        steps=(0, 10, 20, 30, 40, 50, 60, 70), n_layers=8, d_model=256, ffn_size=1024, duplicate=None, peak_step=40
    )
    root = tmp_path / "run"
    synthetic.write_training_run(root, run)
    db = tmp_path / "db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightdiag", "sweep", str(root), "--all", "--db", str(db), "--device", "cpu"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list((db / "rows").glob("*.json"))) < 2:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list((db / "rows").glob("*.json")))
    assert 2 <= done_before < len(run.steps), "the sweep should be interrupted in the middle"
    out = run_cli("sweep", str(root), "--all", "--db", str(db), "--device", "cpu", "--json")
    assert out.returncode == 0, out.stderr
    statuses = [o["status"] for o in json.loads(out.stdout)]
    assert statuses.count("existing") == done_before
    assert statuses.count("fitted") == len(run.steps) - done_before
    rows = sorted((db / "rows").glob("*.json"))
    assert len(rows) == len(run.steps)
    for path in rows:
        load_row(path)  # each one complete and valid
    revisions = [load_row(p)["model"]["revision"] for p in rows]
    assert sorted(revisions) == sorted(f"step_{s}" for s in run.steps)


@pytest.mark.e2e
def test_trajectory_cli_with_plots_and_json(run_folder, tmp_path):
    db = tmp_path / "db"
    assert _sweep_cli(run_folder, db, "--preset", "pythia-70m").returncode == 0
    name = run_folder.resolve().name
    out = run_cli("trajectory", name, "--db", str(db), "--plot", str(tmp_path / "plots"))
    assert out.returncode == 0, out.stderr
    for text in ("Findings", "deep-layer stagnation", "peaked at step 1000", "small_init + wang_init"):
        assert text in out.stdout, text
    for png in ("k_lambda_vs_step.png", "std_heatmap.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 10_000
    data = json.loads(run_cli("trajectory", name, "--db", str(db), "--json").stdout)
    assert data["lambda_o_peak"]["peak_step"] == 1000
    assert data["states"][-1]["state"] == "Transition"
    cosine = json.loads(
        run_cli(
            "trajectory", name, "--db", str(db), "--json", "--schedule", "cosine", "--total", "8000", "--warmup", "80"
        ).stdout
    )
    assert cosine["states"][-1]["t_over_tau"] < data["states"][-1]["t_over_tau"]
    assert data["protocol"] == "hist1024"
    other = run_cli("trajectory", name, "--db", str(db), "--protocol", "exact")
    assert other.returncode == 2
    assert "found: hist1024" in other.stderr
    missing = run_cli("trajectory", "no/such-run", "--db", str(db))
    assert missing.returncode == 2
    assert "sweep" in missing.stderr


@pytest.mark.e2e
def test_bad_sweep_targets(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_cli("sweep", str(empty), "--db", str(tmp_path / "db"))
    assert out.returncode == 2
    assert "no checkpoint folders" in out.stderr
    assert run_cli("sweep", "org/name@step1", "--db", str(tmp_path)).returncode == 2
    shutil.rmtree(empty)


def test_a_run_of_identical_checkpoints_reads_as_no_movement(tmp_path):
    """Three copies of one checkpoint: no 'evolution' and no λ peak is claimed (red-team finding)."""
    from weightdiag import api
    from weightdiag.errors import OptionError
    from weightdiag.run.measure import FitOptions

    spec = synthetic.ModelSpec(n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=128, seed=3)
    first = synthetic.write_model(tmp_path / "run" / "step_0", spec)
    for step in (100, 1000):
        shutil.copytree(first, tmp_path / "run" / f"step_{step}")
    db = tmp_path / "db"
    api.sweep(str(tmp_path / "run"), db_dir=db, options=FitOptions(device="cpu"), everything=True)
    result = api.trajectory("run", db_dir=db)
    assert result["std_pattern"]["pattern"] == "no movement"
    assert not any("differentiated evolution" in f or "retreated" in f for f in result["findings"])
    with pytest.raises(OptionError, match=r"^warmup 1000: give a warm-up"):
        api.trajectory("run", db_dir=db, schedule="cosine", total=100, warmup=1000)
    cosine = api.trajectory("run", db_dir=db, schedule="cosine", total=2000, warmup=10)
    assert any("cosine schedule was not used" in f for f in cosine["findings"])  # no lr in these rows
    assert not any("cosine schedule was not used" in f for f in result["findings"])


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")],
)
def test_a_signal_stops_a_parallel_sweep_at_once(run_folder, tmp_path, signum, code, said):
    """SIGINT, SIGTERM (`kill PID`, a job runner) or SIGHUP (an ssh drop) to `sweep --jobs 2` ends it with
    128 + the signal and cancels the queued revisions: no row appears after it (each write is slowed to 3 s
    so that the signal lands while rows are in flight), and no worker outlives the sweep."""
    db = tmp_path / "db"
    env = {**os.environ, "WEIGHTDIAG_TEST_ROW_WRITE_DELAY": "3", "WEIGHTDIAG_DB": str(db)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightdiag", "sweep", str(run_folder), "--all", "--jobs", "2", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_signals,  # SIGINT is not ignored, even when the suite runs in a background job
    )
    time.sleep(2.5)  # the workers are started and inside their first slowed write
    workers = _children(proc.pid)
    proc.send_signal(signum)
    interrupted = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert said in err and err.count("\n") == 1, err
    deadline = time.monotonic() + 5  # multiprocessing's resource tracker ends on its own, just after
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.1)
    assert workers and not [pid for pid in workers if _alive(pid)]
    written = [p for p in (db / "rows").glob("*.json")] if (db / "rows").exists() else []
    late = [p.name for p in written if p.stat().st_mtime > time.time() - (time.monotonic() - interrupted) + 0.5]
    assert late == [], late  # nothing finished writing after the interrupt
    assert len(written) < len(list(run_folder.iterdir()))  # the queued revisions never ran


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow  # worker processes started and killed: 6 s
def test_sweep_workers_end_when_the_sweep_is_killed_with_9(run_folder, tmp_path):
    """kill -9 leaves no handler to end the workers: they notice their parent is gone and exit within a
    second, writing nothing after it, instead of fitting on re-parented to pid 1."""
    db = tmp_path / "db"
    env = {**os.environ, "WEIGHTDIAG_TEST_ROW_WRITE_DELAY": "3", "WEIGHTDIAG_DB": str(db)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightdiag", "sweep", str(run_folder), "--all", "--jobs", "2", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    time.sleep(2.5)
    workers = [pid for pid in _children(proc.pid) if "python" in Path(f"/proc/{pid}/cmdline").read_text()]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.time()
    assert workers
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]
    time.sleep(3.5)  # a write that had started would have ended by now
    written = list((db / "rows").glob("*.json")) if (db / "rows").exists() else []
    assert [p.name for p in written if p.stat().st_mtime > killed + 1.0] == []


def test_trajectory_plot_onto_a_file_or_an_unwritable_place_is_bad_input(run_folder, tmp_path):
    pytest.importorskip("matplotlib")
    from weightdiag import api
    from weightdiag.errors import OutputError
    from weightdiag.run.measure import FitOptions

    db = tmp_path / "db"
    api.sweep(str(run_folder), db_dir=db, options=FitOptions(device="cpu"), steps="log:3")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for target in (afile, Path("/proc/weightdiag-plots")):
        with pytest.raises(OutputError):
            api.trajectory(run_folder.name, db_dir=db, plot=target)


def test_an_offline_hub_sweep_says_why_it_cannot_list_revisions(monkeypatch):
    from weightdiag.errors import NotCachedError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NotCachedError, match="HF_HUB_OFFLINE forbids"):
        sw.hub_revisions("acme/run")


def test_a_parallel_sweep_leaves_the_environment_as_it_found_it(run_folder, tmp_path, monkeypatch):
    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    monkeypatch.delenv("WEIGHTDIAG_THREADS", raising=False)
    api.sweep(str(run_folder), db_dir=tmp_path / "db", options=FitOptions(device="cpu"), steps="log:2", jobs=2)
    assert "WEIGHTDIAG_THREADS" not in os.environ


@pytest.mark.slow  # two sweeps of worker processes: 6 s
def test_two_sweeps_of_one_run_share_the_work(run_folder, tmp_path):
    """Two sweeps of the same run into one database at once: each revision is fitted by one of them (a claim
    per revision while it is fitted), the other reports it claimed or existing; every row is written once."""
    db = tmp_path / "db"
    env = {**os.environ, "WEIGHTDIAG_TEST_ROW_WRITE_DELAY": "0.5", "WEIGHTDIAG_DB": str(db)}
    command = [sys.executable, "-m", "weightdiag", "sweep", str(run_folder), "--all", "--json", "-q", "--device", "cpu"]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in (0, 1)
    ]
    results = [proc.communicate(timeout=300) for proc in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    outcomes = [{o["revision"]: o["status"] for o in json.loads(out)} for out, _ in results]
    revisions = set(outcomes[0])
    fitted = [{r for r, s in o.items() if s == "fitted"} for o in outcomes]
    assert not fitted[0] & fitted[1], "a revision was fitted twice"
    reused = {r for o in outcomes for r, s in o.items() if s == "reused"}  # the run's duplicate checkpoint
    assert fitted[0] | fitted[1] | reused == revisions
    assert all(s in ("fitted", "claimed", "existing", "reused") for o in outcomes for s in o.values())
    assert len(list((db / "rows").glob("*.json"))) == len(revisions)
    assert not list((db / "rows" / ".claims").iterdir())  # every claim released


def test_trajectory_of_rows_with_no_step_is_one_line_and_exit_2(tmp_path):
    """Issue 33: rows of a model fitted at no training step (a plain fit) gave an empty trajectory and exit 0."""
    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))
    db = tmp_path / "db"
    assert run_cli("fit", str(model), "--db", str(db), "--name", "acme/plain", "-q").returncode == 0
    out = run_cli("trajectory", "acme/plain", "--db", str(db))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert re.fullmatch(
        r"error: acme/plain: its rows are of no training step \(revisions: local-[0-9a-f]{12}\); a trajectory reads "
        r"checkpoints named stepN, step_N or checkpoint-N, as `weightdiag sweep` fits them",
        line,
    ), line


def test_a_missing_hub_revision_is_one_exit_code_for_fit_and_sweep(fake_hub, tmp_path):
    """Issue 42, item 14: `fit ORG/NAME@step5000` exited 3 naming the nearest steps, `sweep --revisions step3` 2
    listing the first six. Both are a revision the Hub lacks: exit 3 (the README's table), the nearest named."""
    from .conftest import run_cli
    from .hub_server import write_small_model

    model = write_small_model(tmp_path / "m")
    for step in (1000, 2000, 4000):
        fake_hub.add_folder("acme/run", model, branch=f"step{step}")
    db = str(tmp_path / "db")
    runs = {
        "fit": run_cli("fit", "acme/run@step3000", "--db", db),
        "sweep --revisions": run_cli("sweep", "acme/run", "--revisions", "step1000,step3000", "--db", db),
        "sweep --steps": run_cli("sweep", "acme/run", "--steps", "1000,3000", "--db", db),
    }
    for how, out in runs.items():
        assert out.returncode == 3, (how, out.stderr)
        (line,) = out.stderr.splitlines()
        assert line == "error: acme/run: revision 'step3000' not found; nearest existing: step1000, step2000, step4000"
    assert not (tmp_path / "db" / "rows").exists() or not list((tmp_path / "db" / "rows").glob("*.json"))


def test_trajectory_says_which_rows_it_leaves_off_the_step_axis(fake_hub, tmp_path):
    """Issue 42, item 18: a swept Hub run's `main` row was left out of `trajectory` silently."""
    from .conftest import run_cli
    from .hub_server import write_small_model

    for seed, branch in enumerate(("main", "step1000", "step2000", "step4000")):
        fake_hub.add_folder("acme/run", write_small_model(tmp_path / branch, seed=seed), branch=branch)
    db = str(tmp_path / "db")
    assert run_cli("sweep", "acme/run", "--all", "--db", db, "-q").returncode == 0
    out = run_cli("trajectory", "acme/run", "--db", db)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "note: acme/run@main left out: no training step in the revision's name (stepN, step_N, checkpoint-N)"
    ]
    document = run_cli("trajectory", "acme/run", "--db", db, "--json")
    result = json.loads(document.stdout)
    assert result["left_out"] == ["main"] and result["revisions"] == ["step1000", "step2000", "step4000"]
    assert run_cli("trajectory", "acme/run", "--db", db, "-q").stderr == ""


def test_a_revision_with_the_files_of_a_row_in_the_database_is_not_fitted_again(fake_hub, tmp_path):
    """Issue 42, item 18: sweeps deduplicated revisions only within themselves: a revision whose LFS sha256s are
    those of a row already in the database (an earlier sweep's) was fitted again."""
    from .conftest import run_cli
    from .hub_server import write_small_model

    model = write_small_model(tmp_path / "m")
    fake_hub.add_folder("acme/run", model, branch="step1000")
    fake_hub.add_folder("acme/run", write_small_model(tmp_path / "m3", seed=3), branch="step3000")
    db = str(tmp_path / "db")
    first = run_cli("sweep", "acme/run", "--revisions", "step1000", "--db", db, "--json")
    assert [o["status"] for o in json.loads(first.stdout)] == ["fitted"], first.stderr
    commit = fake_hub.add_folder("acme/run", model, branch="step2000")  # the same weights again, later
    fake_hub.reset_counters()
    second = run_cli("sweep", "acme/run", "--revisions", "step2000,step3000", "--db", db, "--json")
    outcomes = {o["revision"]: o for o in json.loads(second.stdout)}
    assert outcomes["step2000"]["status"] == "reused", second.stderr
    assert outcomes["step2000"]["detail"] == "identical files to step1000 (in the database)"
    assert outcomes["step3000"]["status"] == "fitted"  # other files: fitted
    read = [r.path for r in fake_hub.requests_to("/resolve/") if "step2000" in r.path or commit in r.path]
    assert not read and fake_hub.requests_to("/resolve/")  # no file of it asked for (those of step3000 were)
    row = json.loads(Path(outcomes["step2000"]["row_path"]).read_text())
    assert row["duplicate_of"] == "step1000" and row["model"]["revision"] == "step2000"
