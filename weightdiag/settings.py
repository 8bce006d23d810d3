"""Every environment setting weightdiag reads, read at call time (so tests and long-lived processes see changes).

A value that cannot be used is the user's input: OptionError (exit 2) with one line naming the variable.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import OptionError


def _positive_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise OptionError(f"{name}={raw!r}: expected a positive number of seconds", param=name)
    return value


def _whole_number(name: str, default: int, low: int, high: int | None, expected: str) -> int:
    """An integer variable within [low, high] (no upper bound when None); `expected` ends the error line."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise OptionError(f"{name}={raw[:40]!r}: expected {expected}", param=name)
    return value


def _test_delay(name: str) -> float:
    """Seconds a test asks the code to wait somewhere (0 when unset or unreadable)."""
    try:
        return max(0.0, float(os.environ.get(name) or 0))
    except (ValueError, OverflowError):
        return 0.0


def http_timeout() -> float:
    """WEIGHTDIAG_HTTP_TIMEOUT (seconds, default 45): the longest any Hub call may wait for an answer.

    Connect and read timeouts use it; a body read that makes too little progress for half of it is
    abandoned and retried once, so a stalled or trickling server ends the command within about twice it.
    """
    return _positive_float("WEIGHTDIAG_HTTP_TIMEOUT", 45.0)


def http_proxied(url: str) -> bool:
    """Whether HTTP(S)_PROXY / ALL_PROXY (and NO_PROXY) send `url` through a proxy: the Hub's httpx client honours
    them, so the direct connections of source/direct_get.py are not used for such a URL."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    # typeshed lacks proxy_bypass_environment, which urllib.request has had since Python 3.4
    return not urllib.request.proxy_bypass_environment(parts.hostname or "", proxies)  # type: ignore[attr-defined]


MAX_THREADS = 1024


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset, a batch job's
    share), else the machine's CPU count; fewer where its cgroup's CPU quota allows fewer (`docker --cpus 2`,
    a Kubernetes limit: the affinity still lists every core, and threads past the quota wait their turn)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        cores = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cgroup_cpu_quota(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs this process's cgroup may use (quota / period, the smallest along its path), None: no quota.
    cgroup v2 (`cpu.max`: "150000 100000" or "max 100000") and v1 (`cpu.cfs_quota_us`, -1 for none)."""
    try:
        lines = proc.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2
            base, read = root, _v2_quota
        elif "cpu" in controllers.split(","):  # v1
            base, read = root / "cpu", _v1_quota
        else:
            continue
        folder = base / path.strip().lstrip("/")
        while True:
            with contextlib.suppress(OSError, ValueError):
                if (cpus := read(folder)) is not None:
                    found.append(cpus)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(found) if found else None


def _v2_quota(folder: Path) -> float | None:
    quota, period = (folder / "cpu.max").read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())


def threads() -> int:
    """WEIGHTDIAG_THREADS (default: the cores available, see available_cores): threads for the reduction
    kernels, 1 to 1024."""
    return _whole_number(
        "WEIGHTDIAG_THREADS", available_cores(), 1, MAX_THREADS, f"a whole number of threads from 1 to {MAX_THREADS}"
    )


def worker_threads(jobs: int) -> int:
    """Threads for each of `jobs` worker processes: WEIGHTDIAG_THREADS, else a share of the cores."""
    if os.environ.get("WEIGHTDIAG_THREADS", "").strip():
        return threads()
    return max(1, available_cores() // jobs)


# Local chunks read and reduced at once, one per core, at most this many unless WEIGHTDIAG_THREADS says otherwise.
# Measured on 16 cores (issue 19: an 8B-shaped BF16 checkpoint from the page cache), 1 / 2 / 4 / 8 / 16 workers
# took 7.4 / 4.0 / 2.0 / 1.34 / 1.6 s: past 8 it got slower, so more cores than 8 are not used by default.
DEFAULT_CHUNK_WORKERS = 8
# An explicit WEIGHTDIAG_THREADS is followed up to this: each worker keeps two 32 MiB chunks in flight.
MAX_CHUNK_WORKERS = 64


def chunk_workers() -> int:
    """Workers that read and reduce local chunks: WEIGHTDIAG_THREADS (at most 64), else the available
    cores, at most 8."""
    if os.environ.get("WEIGHTDIAG_THREADS", "").strip():
        return min(threads(), MAX_CHUNK_WORKERS)
    return min(available_cores(), DEFAULT_CHUNK_WORKERS)


def _flag(name: str) -> bool:
    """A boolean variable, read as huggingface_hub reads its own (1, true, yes, on; any case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def debug() -> bool:
    """WEIGHTDIAG_DEBUG: any non-empty value lets an error end in its traceback instead of one line."""
    return bool(os.environ.get("WEIGHTDIAG_DEBUG"))


def progress_bars() -> bool:
    """Whether to draw progress bars: not when HF_HUB_DISABLE_PROGRESS_BARS is set, as for huggingface_hub's."""
    return not _flag("HF_HUB_DISABLE_PROGRESS_BARS")


def hf_offline() -> bool:
    """HF_HUB_OFFLINE: read Hub models from the local cache only."""
    return _flag("HF_HUB_OFFLINE")


def hf_endpoint() -> str:
    """HF_ENDPOINT, else huggingface_hub's default (https://huggingface.co)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


_hf_cache_given: list[str] = []  # --cache-dir of the command running (hf_cache_given), innermost last


@contextlib.contextmanager
def hf_cache_given(folder: str | os.PathLike[str] | None) -> Iterator[None]:
    """Within it, hf_cache_dir() is `folder` (a command's --cache-dir, as `hf download --cache-dir` takes it);
    None changes nothing. A plain list, not a ContextVar: the threads that read the Hub see it too."""
    if folder is None:
        yield
        return
    _hf_cache_given.append(os.fspath(folder))
    try:
        yield
    finally:
        _hf_cache_given.pop()


def hf_cache_dir() -> str:
    """The HF hub cache folder: a command's --cache-dir, else HF_HUB_CACHE, else $HF_HOME/hub, else
    huggingface_hub's default."""
    from huggingface_hub import constants

    if _hf_cache_given:
        return _hf_cache_given[-1]
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return str(constants.HF_HUB_CACHE)


def hf_token_env() -> bool:
    """Whether HF_TOKEN is set (a token given that way, or by --token, that lacks access means 403, not 401)."""
    return bool(os.environ.get("HF_TOKEN"))


def hf_token_present() -> bool:
    """Whether a Hub token is available (HF_TOKEN or `hf auth login`); the token itself is never returned."""
    from huggingface_hub import get_token

    return bool(get_token())


def _is_int(raw: str) -> bool:
    try:
        int(raw)
    except ValueError:
        return False
    return True


def http_retries() -> tuple[int, float]:
    """WEIGHTDIAG_HTTP_ATTEMPTS (default 6) and WEIGHTDIAG_HTTP_BACKOFF (seconds, default 0.5): how often a
    failed ranged read is tried and the first wait between tries (doubled each time)."""
    attempts_raw = os.environ.get("WEIGHTDIAG_HTTP_ATTEMPTS", "").strip()
    backoff_raw = os.environ.get("WEIGHTDIAG_HTTP_BACKOFF", "").strip()
    try:
        attempts = max(1, int(attempts_raw)) if attempts_raw else 6
        backoff = max(0.0, float(backoff_raw)) if backoff_raw else 0.5
    except ValueError:
        raise OptionError(
            f"WEIGHTDIAG_HTTP_ATTEMPTS={attempts_raw[:20]!r} / WEIGHTDIAG_HTTP_BACKOFF={backoff_raw[:20]!r}: "
            "expected a whole number of attempts and a number of seconds",
            param="WEIGHTDIAG_HTTP_BACKOFF"
            if not attempts_raw or _is_int(attempts_raw)
            else "WEIGHTDIAG_HTTP_ATTEMPTS",
        ) from None
    return attempts, backoff


def db_dir() -> str:
    """The database folder when --db is not given (db_location says why this one)."""
    return db_location()[0]


DB_FOLDER_NAME = "DATABASE"


def user_data_dir() -> Path | None:
    """$XDG_DATA_HOME/weightdiag, else ~/.local/share/weightdiag (None where no home folder is known)."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is invalid and ignored
        return Path(xdg) / "weightdiag"
    try:
        return Path.home() / ".local" / "share" / "weightdiag"
    except RuntimeError:
        return None


DB_FROM_ENV = "from $WEIGHTDIAG_DB"


def db_location() -> tuple[str, str]:
    """(folder, why) of the database when --db is not given, first rule that applies:
    1. $WEIGHTDIAG_DB;
    2. the nearest folder named DATABASE in the current folder or one above it (as git finds .git), so a
       project's database is found from any of its subfolders (`DATABASE` itself when it is the current one's);
    3. the per-user data folder (user_data_dir), the same from every folder.
    The folder is never chosen by the current folder alone: rows written from one folder are found from another.
    """
    env = os.environ.get("WEIGHTDIAG_DB")
    if env:
        return env, DB_FROM_ENV
    try:
        here = Path.cwd()
    except OSError:  # the current folder was removed
        here = None
    if here is not None:
        if (here / DB_FOLDER_NAME).is_dir():
            return DB_FOLDER_NAME, "./DATABASE, in the current folder"
        for parent in here.parents:
            if (parent / DB_FOLDER_NAME).is_dir():
                return str(parent / DB_FOLDER_NAME), "the nearest DATABASE folder above the current folder"
    user = user_data_dir()
    if user is None:
        return DB_FOLDER_NAME, "no DATABASE folder here or above, and no home folder for the per-user one"
    return str(user), "the per-user data folder: no DATABASE folder here or above"


def numpy_kernels_forced() -> bool:
    """WEIGHTDIAG_KERNELS=numpy: use the pure-numpy kernels even when the C extension is built (read once,
    when weightdiag.kernels is first imported)."""
    return os.environ.get("WEIGHTDIAG_KERNELS", "").strip().lower() == "numpy"


def require_c_kernels() -> bool:
    """WEIGHTDIAG_REQUIRE_C_KERNELS=1 (the test suite, as scripts/test runs it): a C extension that did not build
    fails the run instead of leaving it to the numpy kernels (WEIGHTDIAG_KERNELS=numpy still chooses them)."""
    return _flag("WEIGHTDIAG_REQUIRE_C_KERNELS")


def ray_address() -> str | None:
    """RAY_ADDRESS: the Ray cluster `sweep`/`fit --executor ray` join when --ray-address is not given."""
    return os.environ.get("RAY_ADDRESS") or None


# A cluster task (fit --executor ray) reads consecutive chunks of about this many bytes: whole shards where
# they fit. Large enough that a task's fixed cost (scheduling, reopening its shards) is a few per cent of
# its reading at 1 GB/s, small enough that three nodes share a 10 GB model.
DEFAULT_RAY_TASK_BYTES = 2 << 30


def ray_task_bytes() -> int:
    """WEIGHTDIAG_RAY_TASK_BYTES (default 2 GiB): the bytes one cluster task of `fit --executor ray` reads at
    most (a shard larger than that is cut into runs of chunks, unless its sha256 is verified: then it is read
    whole by one task, which hashes it)."""
    return _whole_number(
        "WEIGHTDIAG_RAY_TASK_BYTES", DEFAULT_RAY_TASK_BYTES, 1 << 16, None, "a whole number of bytes, at least 65536"
    )


def ray_task_cpus() -> int:
    """WEIGHTDIAG_RAY_TASK_CPUS (default 1): the CPUs each cluster task declares to Ray and reduces on; a node
    of N CPUs runs N of them at once (Ray limits it)."""
    return _whole_number(
        "WEIGHTDIAG_RAY_TASK_CPUS", 1, 1, MAX_THREADS, f"a whole number of CPUs from 1 to {MAX_THREADS}"
    )


def test_ray_task_delay() -> float:
    """WEIGHTDIAG_TEST_RAY_TASK_DELAY (tests only): seconds a cluster task waits after each chunk, so that a
    test can kill its worker mid-task."""
    return _test_delay("WEIGHTDIAG_TEST_RAY_TASK_DELAY")


def test_write_delay() -> float:
    """WEIGHTDIAG_TEST_ROW_WRITE_DELAY (tests only): seconds between a row's temp write and its rename."""
    return _test_delay("WEIGHTDIAG_TEST_ROW_WRITE_DELAY")


def weightdiag_variables() -> dict[str, str]:
    """Every WEIGHTDIAG_* variable that is set, by name (what `weightdiag env` prints)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("WEIGHTDIAG_")}


def columns() -> int | None:
    """COLUMNS, when it is a positive whole number: the width to render for (rich reads it the same way)."""
    raw = os.environ.get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None
