"""Issue 21's smaller items: `sweep` shows progress while each checkpoint is fitted (a bar per revision, named by
it); titles and captions stay whole; a pipe read in a terminal gets its width."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from weightdiag import api
from weightdiag.progress import Events
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .conftest import run_cli

RUN = synthetic.RunSpec(steps=(0, 10, 100), n_layers=2, d_model=64, ffn_size=128, vocab=128, duplicate=None)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("run") / "tiny-run"
    synthetic.write_training_run(root, RUN)
    return root


def test_a_serial_sweep_reports_each_revisions_fit(run_folder, tmp_path):
    progress = Events()
    events = progress.calls
    outcomes: list[str] = []

    def done(outcome):
        outcomes.append(outcome.revision)
        events.append(("outcome", (outcome.revision,)))

    run = api.sweep(
        str(run_folder), db_dir=tmp_path / "db", options=FitOptions(device="cpu"), everything=True,
        progress=progress, on_outcome=done,
    )  # fmt: skip
    assert [o.status for o in run.outcomes] == ["fitted"] * 3
    starts = progress.of("started")
    assert [model for model, _, _ in starts] == [f"tiny-run@step_{step}" for step in RUN.steps]
    assert all(tensors > 0 and nbytes > 0 for _, tensors, nbytes in starts)
    # each revision's tensors are counted before its outcome is reported
    for revision in outcomes:
        at = events.index(("outcome", (revision,)))
        start = max(i for i, (e, _) in enumerate(events[:at]) if e == "started")
        assert events[start][1][0].endswith("@" + revision)
        assert any(e == "measured" for e, _ in events[start:at])


def test_parallel_sweeps_take_no_callback_into_their_workers(run_folder, tmp_path):
    progress = Events()
    run = api.sweep(
        str(run_folder), db_dir=tmp_path / "db", options=FitOptions(device="cpu"), everything=True, jobs=2,
        progress=progress,
    )  # fmt: skip
    assert [o.status for o in run.outcomes] == ["fitted"] * 3  # a watcher is not pickled into a worker
    assert progress.calls == []


@pytest.mark.e2e
def test_the_sweep_bar_on_a_terminal(run_folder, tmp_path):
    """In a real terminal (tmux), the bar names the revision being fitted; it is gone once the sweep ends."""
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed")
    import sys

    done = tmp_path / "done"
    script = tmp_path / "run.sh"
    script.write_text(
        f"WEIGHTDIAG_TEST_ROW_WRITE_DELAY=0.6 {sys.executable} -m weightdiag sweep {run_folder} --all "
        f"--db {tmp_path / 'db'}; touch {done}\nsleep 120\n"
    )
    socket = tmp_path / "tmux.sock"
    base = [tmux, "-S", str(socket), "-f", os.devnull]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    subprocess.run([*base, "new-session", "-d", "-x", "120", "-y", "40", f"sh '{script}'"], env=env, check=True)
    screens = []
    try:
        for _ in range(1200):
            screens.append(
                subprocess.run([*base, "capture-pane", "-p"], env=env, capture_output=True, text=True).stdout
            )
            if done.exists():
                break
            time.sleep(0.05)
        assert done.exists()
        final = subprocess.run([*base, "capture-pane", "-p", "-S", "-"], env=env, capture_output=True, text=True)
    finally:
        subprocess.run([*base, "kill-server"], env=env, capture_output=True)
    assert any("tiny-run@step_" in s and "tensors" in s for s in screens), screens[-1]
    assert "Traceback" not in final.stdout
    assert "tensors" not in final.stdout.split("sweep tiny-run:")[-1]  # the bar is gone at the end


def test_titles_and_captions_stay_on_one_line_where_the_width_allows(run_folder, tmp_path):
    """Issue 21: a sweep's summary title (and `db show X > file`'s caption) folded under a narrower table."""
    out = run_cli("sweep", str(run_folder), "--all", "--db", str(tmp_path / "db"), env={"COLUMNS": "100000"})
    assert out.returncode == 0, out.stderr
    (title,) = [line for line in out.stdout.splitlines() if line.startswith("sweep tiny-run:")]
    assert title.rstrip().endswith("0 failed"), out.stdout
    out = run_cli("db", "show", "olmo-2-7b", "--db", str(tmp_path / "db"), env={"COLUMNS": "100000"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    bottom = max(i for i, line in enumerate(lines) if line.startswith("└"))
    caption = [line.strip() for line in lines[bottom + 1 :] if line.strip()]
    assert caption[0].startswith("protocol ") and caption[0].count("(") == caption[0].count(")"), caption


@pytest.mark.e2e
def test_a_pipe_read_in_a_terminal_gets_its_width_and_a_file_the_full_width(tmp_path):
    """Issue 21: `weightdiag db show X | head` printed 150-character lines into an 90-column terminal."""
    import fcntl
    import pty
    import struct
    import sys
    import termios

    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 90, 0, 0))
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        command = [sys.executable, "-m", "weightdiag", "db", "show", "pythia-160m", "--db", str(tmp_path / "db")]
        piped = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, env=env, text=True, timeout=120)
        assert piped.returncode == 0
        assert max(len(line) for line in piped.stdout.splitlines()) <= 90, piped.stdout
        with open(tmp_path / "out.txt", "w") as out:
            done = subprocess.run(command, stdout=out, stderr=slave, env=env, timeout=120)
        assert done.returncode == 0
        assert max(len(line) for line in (tmp_path / "out.txt").read_text().splitlines()) > 90  # a file: whole
        no_terminal = subprocess.run(command, capture_output=True, env=env, text=True, timeout=120)
        assert max(len(line) for line in no_terminal.stdout.splitlines()) > 90  # CI: no terminal, full width
    finally:
        os.close(master)
        os.close(slave)


def test_an_offline_sweep_of_named_cached_revisions(fake_hub, run_folder, tmp_path, monkeypatch):
    """Issue 21: HF_HUB_OFFLINE=1, which the unreachable-Hub error suggests, refused every sweep of a Hub repo.
    Revisions named with --revisions need no listing: they are read from the HF cache."""
    for step in RUN.steps:
        fake_hub.add_folder("acme/run", run_folder / f"step_{step}", branch=f"step{step}")
    for step in (0, 100):  # two revisions in the cache (fit --download)
        api.fit_model(f"acme/run@step{step}", FitOptions(device="cpu"), download=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.reset_counters()
    options = FitOptions(device="cpu")
    run = api.sweep("acme/run", db_dir=tmp_path / "db", options=options, revisions=["step100", "step0"])
    assert [(o.revision, o.status) for o in run.outcomes] == [("step0", "fitted"), ("step100", "fitted")]
    assert fake_hub.file_bytes_sent == 0
    # listing still needs the Hub: the error says how to go on
    out = run_cli("sweep", "acme/run", "--steps", "log:2", "--db", str(tmp_path / "db"))
    assert out.returncode == 3 and "--revisions" in out.stderr, out.stderr
    # a revision not in the cache fails alone, with the reason
    out = run_cli("sweep", "acme/run", "--revisions", "step0,step10", "--db", str(tmp_path / "db2"))
    assert out.returncode == 4, out.stderr
    assert "step10: failed" in out.stderr and "not in the local cache" in out.stderr


def test_an_unreachable_hub_does_not_advise_what_cannot_list_revisions(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    out = run_cli("sweep", "acme/run", "--steps", "log:2", "--db", str(tmp_path / "db"))
    assert out.returncode == 3, out.stderr
    assert "sweep lists acme/run's revisions there" in out.stderr and "--revisions" in out.stderr
