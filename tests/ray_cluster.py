"""A real multi-node Ray cluster on loopback, for tests and benchmarks of `fit --executor ray`.

Each node is its own `ray start --block` (a raylet, its object store and workers; the head also runs the GCS)
with its own temp dir, one CPU and a small object store, started in a session of its own so that stopping it
ends exactly its processes (its process group), never another Ray on the machine (no `ray stop`, which
stops every Ray of the user). A node may be started without sight of a folder (a tmpfs mounted over it in a
mount namespace of its own): a node that cannot read the checkpoint's path.

    with LocalCluster(tmp_path, nodes=3) as cluster:
        run_cli("fit", path, "--executor", "ray", "--ray-address", cluster.address, ...)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
OBJECT_STORE_BYTES = 100_000_000  # the machine has little memory to spare: results are small anyway


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_hide_paths() -> bool:
    """Whether a node can be started in a mount namespace of its own (root, or unprivileged namespaces)."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


class LocalCluster:
    """A head node and `nodes - 1` worker nodes on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        *,
        cpus: int = 1,
        hide: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.nodes = nodes
        self.cpus = cpus
        self.hide = hide  # the last worker node does not see this folder
        self.env = {**os.environ, **ENV, **(env or {})}
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen] = []
        # Ray's temp dirs hold unix sockets, whose paths must fit 107 bytes: a short folder of their own, not
        # under a test's long tmp_path (logs of the `ray start` commands stay in `root`).
        self._temp = Path(tempfile.mkdtemp(prefix="wd-ray-", dir="/tmp"))

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _common(self, index: int) -> list[str]:
        temp = self._temp / f"n{index}"
        temp.mkdir(parents=True, exist_ok=True)
        return [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.cpus}",
            "--num-gpus=0",
            f"--temp-dir={temp}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--resources={json.dumps({f'node{index}': 1})}",
            "--disable-usage-stats",
            "--block",
        ]

    def _spawn(self, index: int, args: list[str], hidden: bool) -> None:
        command = [str(RAY), "start", *args, *self._common(index)]
        if hidden:
            assert self.hide is not None
            mount = f"mount -t tmpfs tmpfs {_quote(self.hide)}"
            command = ["unshare", "-m", "sh", "-c", f"{mount} && exec " + " ".join(_quote(c) for c in command)]
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"ray-node{index}.log", "wb")  # noqa: SIM115 - the node's lifetime
        self._procs.append(
            subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def start(self) -> None:
        self._spawn(0, ["--head", f"--port={self.port}", "--include-dashboard=false"], hidden=False)
        self.wait_for(1)
        for index in range(1, self.nodes):
            self._spawn(index, [f"--address={self.address}"], hidden=self.hide is not None and index == self.nodes - 1)
        self.wait_for(self.nodes)

    def wait_for(self, nodes: int, timeout: float = 120.0) -> None:
        """Until `nodes` nodes are alive (asked from a subprocess: a test process never joins the cluster)."""
        probe = (
            "import ray, sys, time\n"
            f"ray.init(address={self.address!r}, log_to_driver=False)\n"
            f"deadline = time.time() + {timeout}\n"
            f"while sum(n['Alive'] for n in ray.nodes()) < {nodes} and time.time() < deadline:\n"
            "    time.sleep(0.2)\n"
            f"sys.exit(0 if sum(n['Alive'] for n in ray.nodes()) >= {nodes} else 1)\n"
        )
        deadline = time.time() + timeout
        while True:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Ray node exited ({proc.returncode}): see {self.root}/ray-node*.log")
            out = subprocess.run(
                [sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=timeout + 60
            )
            if out.returncode == 0:
                return
            if time.time() > deadline:
                raise RuntimeError(f"{nodes} Ray nodes did not come up: {out.stderr[-2000:]}")
            time.sleep(0.5)

    def pids(self) -> set[int]:
        """Every process of this cluster's nodes: each `ray start` and its descendants (Ray's workers run in
        process groups of their own, under their node's raylet)."""
        import psutil

        found = set()
        for proc in self._procs:
            try:
                root = psutil.Process(proc.pid)
                found |= {proc.pid, *(child.pid for child in root.children(recursive=True))}
            except psutil.Error:
                continue
        return found

    def stop(self) -> None:
        """End this cluster's processes, nothing else: SIGTERM to each node's process group, then SIGKILL to
        whatever of them (and of their descendants, found before) is left."""
        import psutil

        descendants = self.pids()
        live = [proc for proc in self._procs if proc.poll() is None]
        for proc in self._procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.time() + 5
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):  # then SIGKILL
                proc.wait(max(0.1, deadline - time.time()))
        for proc in self._procs:
            _signal_group(proc.pid, signal.SIGKILL)
        for pid in descendants - {proc.pid for proc in self._procs}:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()  # the same process still (psutil checks its start time)
        for proc in self._procs:
            if proc.poll() is None:
                proc.wait(10)
        self._procs.clear()
        shutil.rmtree(self._temp, ignore_errors=True)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already
        os.killpg(pgid, signum)


def _quote(text: object) -> str:
    import shlex

    return shlex.quote(str(text))
