"""What a change did to one matrix's geometry: the base's and the tuned's top singular subspaces compared, and
how sparse and how grid-like the change is. Pure numerics over the row blocks the diff already reads.

Each side's Gram matrix is accumulated in float64 over the row blocks, as delta/spectrum.py accumulates ΔW's:
W^T W (n x n) when n <= the gram_cols knob (right singular vectors), or W W^T (m x m) for a matrix read in one
block whose m is (left singular vectors); a wider matrix read in several blocks has its subspaces sketched
(delta/wide.py); embeddings and output heads (COUNTS_ONLY: their Grams cost most on a small model, and no verdict
reads them) get the counts only (their subspace figures are None). From G = V diag(σ^2) V^T:

- principal angles between the base's and the tuned's top-k subspaces (k = TOP_K): the cosines are the
  singular values of V_base[:, :k]^T V_tuned[:, :k]; `overlap` = their mean square (1: the same subspace);
- spectral drift: ||σ_tuned[:k] - σ_base[:k]|| / ||σ_base[:k]||, and the relative change of the top 8 σ;
- intruder dimensions (Shuttleworth, Andreas, Torralba, Sharma, "LoRA vs Full Fine-tuning: An Illusion of
  Equivalence", 2024): among the tuned's top INTRUDER_K singular vectors, those whose largest |cosine| with
  every base singular vector (of non-zero σ) is below INTRUDER_EPS; their count, ranks and strength σ_j / σ_1;
- principal energy: the share of ||ΔW||_F^2 inside the base's top-k subspace, tr(V_k^T G_Δ V_k) / tr(G_Δ),
  against k / dim for an update with no preferred direction (Zhu et al., "The Path Not Taken: RLVR Provably
  Learns Off the Principals", 2025: RL updates avoid the principal directions);
- sparsity at a tolerance: elements with |ΔW| <= TOLERANCE |W_base| (2^-9: a change BF16 storage, 8 significant
  bits, rounds away), besides the exact count (`unchanged_fraction`, measures.py);
- level ratio: distinct values per row of the tuned side over those of the base side, summed over the first
  LEVEL_ROWS rows of every row block (a sample: sorting every row of both sides cost more than the rest of the
  diff): a quantized copy puts its rows on few levels (an int4 group on 16 at most), a fine-tune keeps them
  distinct;
- row change spread (embeddings only, `rows=True`): each row's ||ΔW_r|| / ||W_base,r||, and over the changed
  rows the ratio of the 99th to the 1st percentile. A token embedding's row is a token: one training run with
  Adam moves the rows it touches by amounts of one order (Adam's steps are about the learning rate whatever the
  gradient), so rows 30x or more apart say that updates of different sizes were added (see delta/mechanism.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import tuning
from ..reduce.reduction import grid_probe

TOP_K = 16  # principal angles and spectral drift over the top 16 singular directions
INTRUDER_K = 10  # tuned singular vectors examined for intruders (the paper's top 10)
INTRUDER_EPS = 0.5  # an intruder's largest |cosine| with the base's singular vectors is below this
TOLERANCE = 2.0**-9  # |ΔW| <= TOLERANCE |W_base|: a change that BF16 rounding would erase
REPORTED = 8  # relative changes of the top singular values reported
COUNTS_ONLY = ("embed", "unembed")  # kinds given the counts only: no verdict reads their subspaces
LEVEL_ROWS = 8  # rows of each block whose distinct values are counted
NULL_CUT = 1e-12  # eigenvalues below this fraction of the largest: no singular direction (rank deficiency)
ROW_QUANTILES = (0.01, 0.5, 0.99)  # of the changed rows' relative change: the spread is the last over the first
ROW_MIN = 5  # changed rows needed for a spread (fewer: None; with few rows the quantiles near min and max)


@dataclass(frozen=True)
class Forensics:
    """One matrix's subspace figures (None where the matrix is too wide for a Gram) and counts."""

    side: str | None  # "right" (W^T W), "left" (W W^T), "sketch" (delta/wide.py's left sketch); None: counts only
    k: int  # directions compared
    principal_cosines: tuple[float, ...]  # cosines of the principal angles, descending
    overlap: float | None  # mean square of the cosines
    spectral_drift: float | None
    singular_change: tuple[float, ...]  # σ_tuned,i / σ_base,i - 1 for the top REPORTED
    intruders: int | None
    intruder_ranks: tuple[int, ...]  # 1-based ranks among the tuned's singular vectors
    intruder_strength: float | None  # largest σ_j / σ_1 (tuned) among the intruders; 0 when there are none
    intruder_cosines: tuple[float, ...]  # max |cosine| of each of the tuned's top INTRUDER_K
    principal_energy: float | None  # share of ||ΔW||^2 in the base's top-k subspace (None: ΔW = 0 or no Gram)
    isotropic_energy: float | None  # k / dim: that share for an update with no preferred direction
    tolerance_fraction: float  # elements with |ΔW| <= TOLERANCE |W_base|
    level_ratio: float | None  # distinct values per row, tuned over base (None: a side constant)
    # elements of the tuned side equal to the base's rounded to the tuned storage dtype (round to nearest even);
    # None unless the tuned side is stored in a narrower float dtype than the base (F32 -> BF16 or F16)
    cast_fraction: float | None = None
    # (bits, group) when the tuned side's first rows sit on a 4-bit grid per group of a row (the engine's
    # reduce.reduction.grid_probe, as `fit` reports dequantized weights); None otherwise
    grid: tuple[int, int] | None = None
    # (bits, group) when every group of the tuned side's first rows is whole multiples of its own absmax /
    # (2^(bits-1) - 1): a symmetric absmax integer code, dequantized (`integer_grid`; group 0: the row); else None
    integer_grid: tuple[int, int] | None = None
    # side "sketch": the l vectors of the range sketch (delta/wide.py) that stand for the base's singular vectors
    basis: int | None = None
    # WeightWatcher's power-law alpha of each side's ESD (fit.esd.fit_power_law on the Grams' eigenvalues, the
    # σ^2 of W); None without a Gram or where the fit failed
    alpha_base: float | None = None
    alpha_tuned: float | None = None
    # embeddings only: rows whose values changed, and the ROW_QUANTILES of their ||ΔW_r|| / ||W_base,r||
    rows_changed: int | None = None
    row_change: tuple[float, ...] = ()
    # ΔW's largest row or column norm: a lower bound on its σ_1 that a change confined to one line reaches
    line_max: float | None = None

    @property
    def row_spread(self) -> float | None:
        """The changed rows' 99th over 1st percentile of relative change (None: no row figures, or < ROW_MIN)."""
        if len(self.row_change) != len(ROW_QUANTILES) or self.row_change[0] <= 0:
            return None
        return self.row_change[-1] / self.row_change[0]

    @property
    def delta_alpha(self) -> float | None:
        if self.alpha_base is None or self.alpha_tuned is None:
            return None
        return self.alpha_tuned - self.alpha_base

    def to_json(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else float(x)

        return {
            "side": self.side,
            "method": None if self.side is None else "sketch" if self.side == "sketch" else "gram",
            "basis": self.basis,
            "k": self.k,
            "principal_cosines": [float(c) for c in self.principal_cosines],
            "subspace_overlap": num(self.overlap),
            "spectral_drift": num(self.spectral_drift),
            "singular_change": [num(c) for c in self.singular_change],
            "intruders": self.intruders,
            "intruder_ranks": list(self.intruder_ranks),
            "intruder_strength": num(self.intruder_strength),
            "intruder_cosines": [float(c) for c in self.intruder_cosines],
            "intruder_threshold": INTRUDER_EPS,
            "principal_energy": num(self.principal_energy),
            "isotropic_energy": num(self.isotropic_energy),
            "tolerance": TOLERANCE,
            "tolerance_fraction": self.tolerance_fraction,
            "level_ratio": num(self.level_ratio),
            "cast_fraction": num(self.cast_fraction),
            "grid": {"bits": self.grid[0], "group": self.grid[1]} if self.grid is not None else None,
            "integer_grid": (
                {"bits": self.integer_grid[0], "group": self.integer_grid[1]} if self.integer_grid is not None else None
            ),
            "alpha_base": num(self.alpha_base),
            "alpha_tuned": num(self.alpha_tuned),
            "delta_alpha": num(self.delta_alpha),
            "rows_changed": self.rows_changed,
            "row_change_quantiles": [float(q) for q in self.row_change] or None,
            "row_change_spread": num(self.row_spread),
            "delta_line_max": num(self.line_max),
        }


@dataclass
class Part:
    base_gram: np.ndarray | None
    tuned_gram: np.ndarray | None
    near: int  # |ΔW| <= TOLERANCE |W_base|
    levels_base: int  # distinct values per row, summed
    levels_tuned: int
    numel: int
    cast_equal: int = 0
    grid: tuple[int, int] | None = None
    integer_grid: tuple[int, int] | None = None
    row_change: np.ndarray | None = None  # each row's ||ΔW_r|| / ||W_base,r|| (rows=True), float32
    lines: tuple[float, np.ndarray] | None = None  # the block's largest ||ΔW_r||^2, and each column's sum of squares


def side_for(m: int, n: int, single_block: bool) -> str | None:
    """Which Gram a matrix gets: right (n <= gram_cols), left (read in one block, m <= gram_cols), or none."""
    cols = tuning.current().gram_cols
    if n <= cols:
        return "right"
    if single_block and m <= cols:
        return "left"
    return None


def _levels(x: np.ndarray) -> int:
    """Distinct values per row of a 2-D block, summed."""
    if x.size == 0:
        return 0
    s = np.sort(x, axis=1)
    return int(x.shape[0] + np.count_nonzero(np.diff(s, axis=1)))


class Accumulator:
    """Both sides' Grams (float64) and the counts, over row blocks; `block_part` may run in several threads,
    `fold` runs in block order."""

    def __init__(self, m: int, n: int, side: str | None, cast: str | None = None, rows: bool = False) -> None:
        """cast: "BF16" or "F16" when the tuned side is stored so and the base wider (see cast_fraction); rows:
        keep each row's relative change (an embedding's: m floats)."""
        self.m, self.n, self.side, self.cast, self.rows = m, n, side, cast, rows
        self.row_change: list[np.ndarray] = []
        self.row_max = 0.0  # ΔW's largest squared row norm so far
        self.columns = np.zeros(n)  # ΔW's squared column norms
        self.cast_equal = 0
        self.grid: tuple[int, int] | None = None
        self.integer_grid: tuple[int, int] | None = None
        dim = n if side == "right" else m
        self.base_gram = np.zeros((dim, dim)) if side else None
        self.tuned_gram = np.zeros((dim, dim)) if side else None
        self.near = self.levels_base = self.levels_tuned = self.numel = 0

    def block_part(self, base: np.ndarray, tuned: np.ndarray, first: bool = False) -> Part:
        """base, tuned: float values of rows [r0, r1), shape (rows, n); `first`: the matrix's first block (the
        grid is looked for there)."""
        gb = gt = None
        if self.side is not None:
            b = np.asarray(base, dtype=np.float64)
            t = np.asarray(tuned, dtype=np.float64)
            if not (np.isfinite(b).all() and np.isfinite(t).all()):  # NaN/Inf left out, as the diff's sums do
                finite = np.isfinite(b) & np.isfinite(t)
                b, t = np.where(finite, b, 0.0), np.where(finite, t, 0.0)
            gb, gt = (b.T @ b, t.T @ t) if self.side == "right" else (b @ b.T, t @ t.T)
        b32 = np.asarray(base, dtype=np.float32)
        t32 = np.asarray(tuned, dtype=np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            d32 = t32 - b32
            near = int(np.count_nonzero(np.abs(d32) <= np.float32(TOLERANCE) * np.abs(b32)))
        change = row_change(b32, d32) if self.rows and d32.ndim == 2 else None  # before NaN/Inf are zeroed
        if not np.isfinite(d32).all():  # NaN/Inf left out, as the diff's sums do
            d32 = np.where(np.isfinite(d32), d32, np.float32(0))
        lines = line_energy(d32) if d32.ndim == 2 else None
        cast = int(np.count_nonzero(rounded(b32, self.cast) == t32)) if self.cast else 0
        rows = slice(0, LEVEL_ROWS)
        grid = whole = None
        if first and t32.ndim == 2 and t32.shape[1] > 1:
            grid = grid_probe(np.ascontiguousarray(t32).reshape(-1).view(np.uint32), t32.shape[1])
            whole = integer_grid(t32[rows])
        return Part(gb, gt, near, _levels(b32[rows]), _levels(t32[rows]), b32.size, cast, grid, whole, change, lines)

    def fold(self, part: Part) -> None:
        if self.base_gram is not None and part.base_gram is not None and part.tuned_gram is not None:
            self.base_gram += part.base_gram
            assert self.tuned_gram is not None
            self.tuned_gram += part.tuned_gram
        self.near += part.near
        self.levels_base += part.levels_base
        self.levels_tuned += part.levels_tuned
        self.numel += part.numel
        self.cast_equal += part.cast_equal
        self.grid = self.grid or part.grid
        self.integer_grid = self.integer_grid or part.integer_grid
        if part.row_change is not None:
            self.row_change.append(part.row_change)
        if part.lines is not None:
            self.row_max = max(self.row_max, part.lines[0])
            self.columns += part.lines[1]

    def result(self, delta_gram: np.ndarray | None) -> Forensics:
        """delta_gram: ΔW's Gram on the same side (spectrum.py's), for the principal energy; None: not known."""
        tol = self.near / self.numel if self.numel else 1.0
        levels = self.levels_tuned / self.levels_base if self.levels_base else None
        cast = (self.cast_equal / self.numel if self.numel else 1.0) if self.cast else None
        if self.base_gram is None or self.tuned_gram is None:
            out = Forensics(None, 0, (), None, None, (), None, (), None, (), None, None, tol, levels)
        else:
            out = subspaces(self.base_gram, self.tuned_gram, delta_gram, self.side, tol, levels)
        changed, quantiles = row_quantiles(self.row_change) if self.rows else (None, ())
        return replace(
            out,
            cast_fraction=cast,
            grid=self.grid,
            integer_grid=self.integer_grid,
            rows_changed=changed,
            row_change=quantiles,
            line_max=math.sqrt(max(self.row_max, float(self.columns.max(initial=0.0)))),
        )


def line_energy(delta: np.ndarray) -> tuple[float, np.ndarray]:
    """A block of ΔW's largest squared row norm and its squared column norms: float32 sums (a float64 copy of
    each block cost 8 MB per worker; the noise edge compares these to 1.7x, far above float32's error), the
    columns then summed over blocks in float64."""
    with np.errstate(over="ignore"):
        rows = np.einsum("ij,ij->i", delta, delta)
        columns = np.einsum("ij,ij->j", delta, delta)
    return float(rows.max(initial=0.0)), columns


def row_change(base: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Each row's ||ΔW_r|| / ||W_base,r|| from float32 base and ΔW (float32 sums, as line_energy's; NaN/Inf rows
    and all-zero base rows: NaN or Inf, left out by row_quantiles)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.sqrt(np.einsum("ij,ij->i", delta, delta) / np.einsum("ij,ij->i", base, base))


def row_quantiles(parts: list[np.ndarray]) -> tuple[int, tuple[float, ...]]:
    """(changed rows, the ROW_QUANTILES of their relative change; () under ROW_MIN changed rows)."""
    every = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    changed = every[np.isfinite(every) & (every > 0)]
    if changed.size < ROW_MIN:
        return int(changed.size), ()
    return int(changed.size), tuple(float(q) for q in np.quantile(changed.astype(np.float64), ROW_QUANTILES))


INTEGER_CODES = (2, 3, 4, 5, 6, 7, 8)  # narrowest first (a 2-bit grid is on the 8-bit one too: 127 = 127 x 1)
# symmetric absmax codes: q in [-(2^(b-1) - 1), 2^(b-1) - 1], w = q absmax / qmax
INTEGER_GROUPS = (0, 128, 64, 32)  # 0: the whole row
INTEGER_SLACK = 0.02  # |w / step - round(w / step)| allowed (the float32 rounding of q * step is ~1e-5 of it)


def integer_grid(rows: np.ndarray) -> tuple[int, int] | None:
    """(bits, group) when every group of `rows` (values, rows x n) is q * absmax(group) / (2^(bits-1) - 1) for
    whole q, for the first code and group size that hold (group 0: the whole row); else None (trained weights:
    a group of 32 passes by chance with probability about 0.04^31). Rows under 32 elements, or zero: None."""
    x = np.asarray(rows, dtype=np.float64)
    n = x.shape[1]
    if n < 32 or not np.any(x):
        return None
    for bits in INTEGER_CODES:
        top = 2 ** (bits - 1) - 1
        for group in INTEGER_GROUPS:
            g = group or n
            if n % g:
                continue
            blocks = x.reshape(x.shape[0], n // g, g)
            step = np.abs(blocks).max(axis=-1, keepdims=True) / top
            live = step[..., 0] > 0
            if not live.any():
                continue
            r = blocks[live] / step[live]
            if np.max(np.abs(r - np.round(r))) <= INTEGER_SLACK:
                return bits, group
    return None


NARROW = {"BF16": 16, "F16": 16}


def cast_of(base_dtype: str, tuned_dtype: str) -> str | None:
    """The dtype a re-store would have rounded the base to: the tuned's, when narrower than a wider base's."""
    return tuned_dtype if tuned_dtype in NARROW and base_dtype in ("F32", "F64") else None


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float values rounded to BF16 or F16 (round to nearest even), back as float32."""
    x = np.asarray(values, dtype=np.float32)
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    nan = np.isnan(x)
    out = r.view(np.float32)
    return np.where(nan, x, out)


def descending_eig(gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(σ descending, V with the matching columns), directions below NULL_CUT of the largest dropped."""
    lam, vecs = np.linalg.eigh(gram)
    lam, vecs = lam[::-1], vecs[:, ::-1]
    keep = lam > NULL_CUT * max(float(lam[0]), 0.0) if lam.size else np.zeros(0, bool)
    return np.sqrt(lam[keep]), vecs[:, keep]


def power_alpha(singular: np.ndarray) -> float | None:
    """WeightWatcher's power-law alpha of the ESD λ = σ^2 (fit.esd.fit_power_law); None where it fails."""
    from ..fit.esd import fit_power_law

    fit = fit_power_law(np.asarray(singular, dtype=np.float64) ** 2)
    return fit.alpha if fit.status == "success" else None


def subspaces(
    base_gram: np.ndarray,
    tuned_gram: np.ndarray,
    delta_gram: np.ndarray | None,
    side: str | None,
    tolerance_fraction: float,
    level_ratio: float | None,
) -> Forensics:
    """The subspace figures from both sides' Grams (see the module docstring)."""
    sb, vb = descending_eig(base_gram)
    st, vt = descending_eig(tuned_gram)
    dim = base_gram.shape[0]
    k = min(TOP_K, sb.size, st.size)
    if k == 0:
        return Forensics(side, 0, (), None, None, (), None, (), None, (), None, None, tolerance_fraction, level_ratio)
    cos = np.clip(np.linalg.svd(vb[:, :k].T @ vt[:, :k], compute_uv=False), 0.0, 1.0)
    drift = float(np.linalg.norm(st[:k] - sb[:k]) / np.linalg.norm(sb[:k]))
    top = min(REPORTED, k)
    change = tuple(float(x) for x in st[:top] / sb[:top] - 1.0)
    ki = min(INTRUDER_K, st.size)
    best = np.max(np.abs(vb.T @ vt[:, :ki]), axis=0)  # each tuned vector's largest |cosine| with the base's
    ranks = tuple(int(j) + 1 for j in np.flatnonzero(best < INTRUDER_EPS))
    strength = max((float(st[j - 1] / st[0]) for j in ranks), default=0.0)
    energy = None
    alpha = power_alpha(sb)  # an untouched matrix's sides have one ESD: fitted once (each fit is ~10 ms)
    alphas = (alpha, alpha if np.array_equal(base_gram, tuned_gram) else power_alpha(st))
    if delta_gram is not None:
        total = float(np.trace(delta_gram))
        if total > 0:
            energy = float(np.einsum("ij,ik,kj->", vb[:, :k], delta_gram, vb[:, :k]) / total)
    return Forensics(
        side,
        k,
        tuple(float(c) for c in cos),
        float(np.mean(cos**2)),
        drift,
        change,
        len(ranks),
        ranks,
        strength,
        tuple(float(c) for c in best),
        energy,
        k / dim,
        tolerance_fraction,
        level_ratio,
        alpha_base=alphas[0],
        alpha_tuned=alphas[1],
    )
