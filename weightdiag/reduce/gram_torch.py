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

`torch.linalg.eigvalsh` solves in float64 on the device (cuSOLVER's syevd on CUDA). Eigenvalues below the
Gram's floor are refined as on the CPU (`solve`, reduce/gram.py's "Refinement"), the subspace from torch's
eigh on the device. Tested on torch's CPU
device (tests/test_spectrum_pipeline.py) and on CUDA where one is lent (tests/test_spectrum_cuda.py). These
operations on an H200 (benchmarks/RESULTS.md): 14-17 TFLOP/s for the Gram, the host-to-device copies of the
float32 blocks bounding it, and 0.1 s for a 4,096 x 4,096 eigensolve (1.4 s on 16 CPU cores).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gram import CONVERT_BYTES, MIN_CONVERT, SUBSPACE, Refinement, is_tall, needs_refinement


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
        rows = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32)).to(self.device)
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

    def eigenvalues(self) -> np.ndarray:
        """min(m, n) eigenvalues, float64, clipped at 0, ascending (copied back to the CPU): the Gram's alone."""
        g = self.gram()
        if not g.numel():
            return np.zeros(0, dtype=np.float64)
        values = self._torch.linalg.eigvalsh(g).cpu().numpy()
        return np.sort(np.clip(values, 0.0, None))

    def solve(self) -> np.ndarray | Refinement | None:
        """As GramSpectrum.solve: the eigenvalues, those below FLOOR·λ_max refined (a wide matrix's here from its
        held rows, a tall one's by the returned Refinement fed the rows again), or None when not finite. The
        small subspace comes from torch's eigh of the Gram on the device; the Ritz products run on the CPU
        (min(m, n) x s with s the few eigenvalues below SUBSPACE·λ_max)."""
        if not self.finite():
            return None
        g = self.gram()
        values = self.eigenvalues()
        count = needs_refinement(values)
        if not count:
            return values
        s = max(1, int(np.count_nonzero(values < SUBSPACE * values[-1])))
        basis = self._torch.linalg.eigh(g).eigenvectors[:, :s].cpu().numpy()
        refinement = Refinement(values, basis, count)
        if self.tall:
            return refinement
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.m)))
        for c0 in range(0, self.n, step):
            refinement.add(c0, self._w[:, c0 : c0 + step].T.cpu().numpy())
        return refinement.eigenvalues()
