"""weightdiag/settings.py: every environment variable, read at call time, bad values are exit 2."""

from __future__ import annotations

import pytest

from weightdiag import settings
from weightdiag.errors import BadInputError


def test_values_are_read_at_call_time(monkeypatch):
    monkeypatch.setenv("WEIGHTDIAG_HTTP_ATTEMPTS", "3")
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0.25")
    assert settings.http_retries() == (3, 0.25)
    monkeypatch.delenv("WEIGHTDIAG_HTTP_ATTEMPTS")
    monkeypatch.delenv("WEIGHTDIAG_HTTP_BACKOFF")
    assert settings.http_retries() == (6, 0.5)
    monkeypatch.setenv("WEIGHTDIAG_DB", "/tmp/some-db")
    assert settings.db_dir() == "/tmp/some-db"
    monkeypatch.delenv("WEIGHTDIAG_DB")
    assert settings.db_dir() == "DATABASE"
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert settings.ray_address() == "ray://head:10001"
    monkeypatch.setenv("HF_HUB_CACHE", "/tmp/hf-cache")
    assert settings.hf_cache_dir() == "/tmp/hf-cache"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    assert settings.progress_bars() is False


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("WEIGHTDIAG_HTTP_ATTEMPTS", "many", settings.http_retries),
        ("WEIGHTDIAG_HTTP_BACKOFF", "soon", settings.http_retries),
        ("WEIGHTDIAG_HTTP_TIMEOUT", "-1", settings.http_timeout),
        ("WEIGHTDIAG_THREADS", "0", settings.threads),
    ],
)
def test_bad_values_are_bad_input_naming_the_variable(monkeypatch, name, value, read):
    monkeypatch.setenv(name, value)
    with pytest.raises(BadInputError, match=name):
        read()


def test_threads_and_chunk_workers_follow_the_cores_this_process_may_use(monkeypatch):
    """Workers come from the CPU affinity (a container's or taskset's share), not the machine's count; one
    per core up to 8 (past 8 the issue 19 measurements got slower), WEIGHTDIAG_THREADS overrides (up to 64)."""
    monkeypatch.delenv("WEIGHTDIAG_THREADS", raising=False)
    monkeypatch.setattr(settings, "cgroup_cpu_quota", lambda: None)  # a CI runner's quota is not this test's
    monkeypatch.setattr(settings.os, "cpu_count", lambda: 64)
    for allowed, workers in ((1, 1), (2, 2), (6, 6), (8, 8), (16, 8), (48, 8)):
        monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid, n=allowed: set(range(n)), raising=False)
        assert settings.available_cores() == allowed
        assert settings.threads() == allowed
        assert settings.chunk_workers() == workers
    monkeypatch.delattr(settings.os, "sched_getaffinity", raising=False)  # macOS: no affinity, the CPU count
    assert settings.available_cores() == 64 and settings.chunk_workers() == 8
    for raw, workers in (("1", 1), ("12", 12), ("1024", 64)):
        monkeypatch.setenv("WEIGHTDIAG_THREADS", raw)
        assert settings.chunk_workers() == workers
    monkeypatch.setenv("WEIGHTDIAG_THREADS", "0")
    with pytest.raises(BadInputError, match="WEIGHTDIAG_THREADS"):
        settings.chunk_workers()


def test_the_execution_takes_its_threads_and_workers_from_the_settings(monkeypatch):
    """Built once per job from the settings (local chunks read at once: the cores, at most 8, unless
    WEIGHTDIAG_THREADS says otherwise); a sweep worker's share of the cores overrides the setting."""
    from weightdiag.execution import Execution

    monkeypatch.setenv("WEIGHTDIAG_THREADS", "5")
    assert (Execution.from_settings().threads, Execution.from_settings().chunk_workers) == (5, 5)
    monkeypatch.delenv("WEIGHTDIAG_THREADS")
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    assert (Execution.from_settings().threads, Execution.from_settings().chunk_workers) == (12, 8)
    assert Execution.from_settings(threads=3).threads == 3
    assert Execution.from_settings("auto").device == "cpu"


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"cpu.max": "150000 100000"}, 1.5),  # v2, this cgroup
        ({"cpu.max": "max 100000", "../cpu.max": "200000 100000"}, 2.0),  # v2, a parent's
        ({"cpu.max": "max 100000"}, None),
    ],
)
def test_the_cgroup_cpu_quota_is_read_along_the_process_path_v2(tmp_path, files, cpus):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job/step\n")
    for name, text in files.items():
        path = (tmp_path / "fs" / "job" / "step" / name).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert settings.cgroup_cpu_quota(proc, tmp_path / "fs") == cpus


def test_the_cgroup_cpu_quota_v1_and_what_it_does_to_the_threads(tmp_path, monkeypatch):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/docker/abc\n0::/\n")
    folder = tmp_path / "fs" / "cpu" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("250000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert settings.cgroup_cpu_quota(proc, tmp_path / "fs") == 2.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert settings.cgroup_cpu_quota(proc, tmp_path / "fs") is None
    assert settings.cgroup_cpu_quota(tmp_path / "absent", tmp_path / "fs") is None
    monkeypatch.delenv("WEIGHTDIAG_THREADS", raising=False)
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(settings, "cgroup_cpu_quota", lambda: 2.5)  # `docker run --cpus 2.5` on 16 cores
    assert settings.available_cores() == 3 and settings.threads() == 3 and settings.chunk_workers() == 3
