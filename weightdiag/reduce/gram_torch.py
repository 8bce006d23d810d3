"""The Gram spectrum of reduce/gram.py with torch on a device (`--device cuda`): the products and the
eigensolve run where the device is, the rows arrive from the CPU as they stream.

The same two cases as `GramSpectrum`, the same float64 accumulation and therefore the same error bound
(see reduce/gram.py); only the summation order differs (a GPU's GEMM blocks its sums its own way), so the
eigenvalues agree with the CPU path's to rounding (within 1e-12·λ_max in tests on torch's CPU device), not
bit for bit:

- tall (m >= n): G (n x n, float64, on the device) += Bᵀ B for each row block B, as one GEMM (`addmm_`: the
  full product, 2·k·n² flops per block of k rows, where the CPU's dsyrk computes one triangle);
- wide (m < n): the rows are held on the device (float32, m·n·4 bytes) and WWᵀ is summed over column
  panels in float64 at the end.

`torch.linalg.eigvalsh` solves in float64 on the device (cuSOLVER's syevd on CUDA), several Grams of one size
at once and on a thread of their own (`BatchedSolves`, issue 41): the caller's thread goes on feeding the next
matrices' rows while the device solves. Which call solves is chosen from the torch build (`choose_solver`):
torch 2.11 with CUDA 13 made `torch.linalg.eigh` 30-130x slower on a GH200 (pytorch issue 183806, open), so
there each Gram is solved on its own and the small ones (where that report's batched path lost most) on the
host in float64 (LAPACK); a device solve that fails falls back to the host. The choice is in the row.
Eigenvalues below the Gram's floor are refined as on the CPU (`solve`, reduce/gram.py's "Refinement"), the
subspace from torch's eigh on the device (on the host where the build is affected). Tested on torch's CPU
device (tests/test_spectrum_pipeline.py) and on CUDA where one is lent (tests/test_spectrum_cuda.py). These
operations on an H200 (benchmarks/RESULTS.md): 14-17 TFLOP/s for the Gram, the host-to-device copies of the
float32 blocks bounding it, and 0.1 s for a 4,096 x 4,096 eigensolve (1.4 s on 16 CPU cores).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .gram import CONVERT_BYTES, MIN_CONVERT, SUBSPACE, Refinement, is_tall, needs_refinement

ISSUE_183806 = "pytorch issue 183806: torch.linalg.eigh 30-130x slower in torch 2.11 with CUDA 13"
HOST_BELOW = 512  # affected builds: Grams smaller than this are solved on the host (milliseconds there)
BATCH = 8  # Grams of one size solved together at most ...
BATCH_BYTES = 1 << 30  # ... and at most this many bytes of them held waiting (device memory)


@dataclass(frozen=True)
class Solver:
    """How the eigenvalues of the Grams are solved on a device: `batched` (torch.linalg.eigvalsh of the Grams
    of one size stacked), `each` (one call per Gram, the small ones on the host) or `host` (numpy's LAPACK)."""

    name: str
    torch: str
    cuda: str | None
    why: str

    def record(self) -> dict[str, Any]:
        return {"solver": self.name, "torch": self.torch, "cuda": self.cuda, "why": self.why}


def _version(text: str | None) -> tuple[int, ...]:
    """(major, minor) of a version string such as "2.11.0+cu130" or "13.0"; () when there is none."""
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2])) if found else ()


def choose_solver(torch_version: str, cuda_version: str | None, device_type: str) -> Solver:
    """The eigensolver for this torch build and device (see the module docstring)."""
    if device_type != "cuda":
        return Solver("batched", torch_version, cuda_version, f"torch.linalg.eigvalsh on the {device_type} device")
    if _version(torch_version) >= (2, 11) and _version(cuda_version) >= (13, 0):
        return Solver(
            "each", torch_version, cuda_version, f"{ISSUE_183806}: one Gram a call, the small ones on the host"
        )
    return Solver("batched", torch_version, cuda_version, "torch.linalg.eigvalsh (cuSOLVER syevd), batched by size")


def current_solver(device: str) -> Solver:
    """choose_solver for the torch imported here."""
    import torch

    return choose_solver(torch.__version__, torch.version.cuda, torch.device(device).type)


def eigvalsh_all(grams: list[Any], solver: Solver) -> list[np.ndarray]:
    """Each Gram's eigenvalues (float64 host arrays, ascending) as `solver` says; a failed device solve falls
    back to the host."""
    import torch

    def host(g: Any) -> np.ndarray:
        return np.linalg.eigvalsh(g.cpu().numpy())

    if solver.name == "host":
        return [host(g) for g in grams]
    try:
        if solver.name == "batched" and len(grams) > 1:
            return list(torch.linalg.eigvalsh(torch.stack(grams)).cpu().numpy())
        return [
            host(g) if g.shape[0] < HOST_BELOW and solver.name == "each" else torch.linalg.eigvalsh(g).cpu().numpy()
            for g in grams
        ]
    except RuntimeError:  # cuSOLVER's errors, torch's linalg errors
        return [host(g) for g in grams]


_PINNED = threading.local()  # per thread: two pinned buffers and the events of their last copies


def _upload(block: np.ndarray, device: Any) -> Any:
    """A float32 row block on the device. On CUDA through two pinned buffers used in turn (a buffer is
    overwritten only once its previous copy is done), copied without blocking the host: the next block is read
    and converted while this one is copied and multiplied. Elsewhere the block itself (no copy)."""
    import torch

    rows = torch.from_numpy(block)
    if device.type != "cuda":
        return rows.to(device)
    slots = getattr(_PINNED, "slots", None)
    if slots is None:
        slots = _PINNED.slots = [[None, torch.cuda.Event()], [None, torch.cuda.Event()], 0]
    slot = slots[slots[2]]
    slots[2] ^= 1
    slot[1].synchronize()  # this buffer's previous copy is done
    if slot[0] is None or slot[0].numel() < rows.numel():
        slot[0] = torch.empty(max(rows.numel(), 1 << 20), dtype=torch.float32, pin_memory=True)
    host = slot[0][: rows.numel()].view(rows.shape)
    host.copy_(rows)
    out = host.to(device, non_blocking=True)
    slot[1].record()
    return out


class TorchGramSpectrum:
    """The eigenvalues of the smaller Gram of an m x n matrix, from its row blocks in order, with torch."""

    def __init__(self, m: int, n: int, device: str) -> None:
        import torch

        self._torch = torch
        self.m = m
        self.n = n
        self.device = torch.device(device)
        self.r1 = 0
        self.tall = is_tall(m, n)
        if self.tall:
            self._g: Any = torch.zeros((n, n), dtype=torch.float64, device=self.device)
        else:
            self._w: Any = torch.empty((m, n), dtype=torch.float32, device=self.device)

    def add(self, r0: int, block: np.ndarray) -> None:
        if r0 != self.r1:
            raise ValueError(f"row block starts at {r0}, expected {self.r1} (blocks arrive in order)")
        if block.ndim != 2 or block.shape[1] != self.n or r0 + block.shape[0] > self.m:
            raise ValueError(f"row block of shape {block.shape} at row {r0} does not fit {self.m} x {self.n}")
        torch = self._torch
        rows = _upload(np.ascontiguousarray(block, dtype=np.float32), self.device)
        if self.tall:
            step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.n)))
            for s in range(0, block.shape[0], step):
                part = rows[s : s + step].to(torch.float64)
                self._g.addmm_(part.T, part)
        else:
            self._w[r0 : r0 + block.shape[0]] = rows
        self.r1 += block.shape[0]

    def gram(self) -> Any:
        """The full symmetric Gram (a torch float64 tensor on the device) once every row arrived."""
        if self.r1 != self.m:
            raise ValueError(f"{self.r1} of {self.m} rows received")
        if self.tall:
            return self._g
        torch = self._torch
        g = torch.zeros((self.m, self.m), dtype=torch.float64, device=self.device)
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.m)))
        for c0 in range(0, self.n, step):
            panel = self._w[:, c0 : c0 + step].to(torch.float64)
            g.addmm_(panel, panel.T)
        return g

    def finite(self) -> bool:
        """Whether every value received was finite (a NaN or an infinity makes the Gram non-finite)."""
        source = self._g if self.tall else self._w
        return bool(self._torch.isfinite(source).all().item())

    def eigenvalues(self, solver: Solver | None = None) -> np.ndarray:
        """min(m, n) eigenvalues, float64, clipped at 0, ascending (copied back to the CPU): the Gram's alone."""
        g = self.gram()
        if not g.numel():
            return np.zeros(0, dtype=np.float64)
        (values,) = eigvalsh_all([g], solver or current_solver(str(self.device)))
        return np.sort(np.clip(values, 0.0, None))

    def solve(self, values: np.ndarray | None = None) -> np.ndarray | Refinement | None:
        """As GramSpectrum.solve: the eigenvalues, those below FLOOR·λ_max refined (a wide matrix's here from its
        held rows, a tall one's by the returned Refinement fed the rows again), or None when not finite. The
        small subspace comes from torch's eigh of the Gram on the device; the Ritz products run on the CPU
        (min(m, n) x s with s the few eigenvalues below SUBSPACE·λ_max). `values`: the Gram's eigenvalues
        solved already (BatchedSolves)."""
        if not self.finite():
            return None
        g = self.gram()
        values = self.eigenvalues() if values is None else np.sort(np.clip(values, 0.0, None))
        count = needs_refinement(values)
        if not count:
            return values
        s = max(1, int(np.count_nonzero(values < SUBSPACE * values[-1])))
        if current_solver(str(self.device)).name == "batched":
            basis = self._torch.linalg.eigh(g).eigenvectors[:, :s].cpu().numpy()
        else:  # the eigh of pytorch issue 183806: on the host
            basis = np.linalg.eigh(g.cpu().numpy())[1][:, :s]
        refinement = Refinement(values, basis, count)
        if self.tall:
            return refinement
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.m)))
        for c0 in range(0, self.n, step):
            refinement.add(c0, self._w[:, c0 : c0 + step].T.cpu().numpy())
        return refinement.eigenvalues()


Solved = tuple[Any, "np.ndarray | Refinement | None"]  # (the caller's token, what TorchGramSpectrum.solve gives)


class BatchedSolves:
    """Finished torch Grams solved in batches of one size (up to BATCH, BATCH_BYTES waiting) on one thread of
    their own, so that the caller's thread reads and adds the next matrices' rows meanwhile. `submit` a Gram
    with a token, collect the solved ones with `done` (in the order they were solved)."""

    def __init__(self, solver: Solver) -> None:
        self.solver = solver
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="weightdiag-eigh")
        self._waiting: dict[int, list[tuple[Any, TorchGramSpectrum]]] = {}
        self._bytes = 0
        self._running: list[Future[list[Solved]]] = []
        self._lock = threading.Lock()

    def submit(self, token: Any, gram: TorchGramSpectrum) -> None:
        size = min(gram.m, gram.n)
        queue = self._waiting.setdefault(size, [])
        queue.append((token, gram))
        self._bytes += size * size * 8 + (0 if gram.tall else gram.m * gram.n * 4)
        if len(queue) >= BATCH or self._bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Start solving every Gram waiting."""
        for batch in self._waiting.values():
            self._running.append(self._pool.submit(self._solve, batch))
        self._waiting, self._bytes = {}, 0

    def _solve(self, batch: list[tuple[Any, TorchGramSpectrum]]) -> list[Solved]:
        finite = [(token, gram) for token, gram in batch if gram.finite()]
        grams = [gram.gram() for _, gram in finite]
        values = eigvalsh_all(grams, self.solver) if grams else []
        solved = {id(gram): gram.solve(v) for (_, gram), v in zip(finite, values, strict=True)}
        return [(token, solved.get(id(gram))) for token, gram in batch]

    def done(self, wait: bool = False) -> list[Solved]:
        """The solved Grams' results (all of those submitted, after a flush, with `wait`)."""
        if wait:
            self.flush()
        out: list[Solved] = []
        while self._running and (wait or self._running[0].done()):
            out.extend(self._running.pop(0).result())
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


SolverFactory = Callable[[], BatchedSolves]
