"""Exact per-tensor figures of a pair (W_base, W_tuned), accumulated over row blocks.

Each block gives a `BlockPart` (computable in any thread); `Totals` folds them in order. Sums of squares and
products are float64: from the engine's reductions of ΔW = W_tuned - W_base (float32, each element within
2^-24 relative of the exact difference) and of each side (exact for 16-bit dtypes), or, for F64 sides and
blocks holding NaN/Inf, from float64 arrays; relative_change and cosine equal numpy's on the full tensors to
~1e-7 relative or better. Distributions go through the engine's own reductions (weightdiag.reduce.reduction):
|W_base| and |W_tuned| in their storage dtype (exactly as `fit` reduces them, decoded float32 for a quantized
side), |ΔW| on the F32 path (its Weibull fit, and quantiles from 2^-7-wide buckets, within 2^-8 relative;
values below 1e-40 count as zeros), |ΔW|/|W_base| by its top 16 bits (quantiles only, see ratio_reduction).

unchanged_fraction: elements bit-identical at storage precision. Both sides stored in the same dtype and
neither quantized: the stored bit patterns are compared (so +0 vs -0 and two NaNs with the same payload
are as stored). Otherwise (a quantized side, or F32 against BF16): the decoded float32 bit patterns.
sign_flips: elements of opposite signs on the two sides (a zero on either side is no flip).

Both sides stored in one 16-bit float dtype (BF16 or F16: nearly every pair), with the C kernels built: one
C pass per block (kernels.pair16) counts everything above at once: the same counts, histograms, maxima and
float32 arithmetic as the numpy path, whose results are its test oracle; only the float64 sums are added in
another order. A block whose ΔW is not finite somewhere takes the numpy path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache, cached_property

import numpy as np

from .. import kernels
from ..codes import FINITE_LIMIT16, code_values, f32_bin_tables
from ..fit.stats import Summary
from ..fit.weibull import WeibullFit
from ..reduce.reduction import Reduction, f32_shift, finite_mask, merge, reduce_array, shift_sums, takes_the_lead
from ..source.plan import STORAGE_NUMPY
from ..vocabulary import COHORT_TRIM

QUANTILES = (0.5, 0.9, 0.99, 0.999)


@dataclass
class BlockPart:
    numel: int
    d2: float  # Σ (t - b)^2
    b2: float  # Σ b^2
    t2: float  # Σ t^2
    bt: float  # Σ b t
    unchanged: int
    flips: int
    nonfinite: int  # elements where either side is NaN or Inf (excluded from the sums)
    base: Reduction
    tuned: Reduction
    delta: Reduction  # of ΔW (float32)
    ratio: Reduction  # of |ΔW| / |W_base| where W_base != 0 (float32)


def as_float(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements (storage form, see plan.STORAGE_NUMPY) -> float32 values (float64 for F64)."""
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    if dtype == "F32":
        return raw.view(np.float32)
    if dtype == "F64":
        return raw.view(np.float64)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        from ..decode.values import code_table_f32

        return code_table_f32(dtype)[raw.view(np.uint8)]
    raise ValueError(f"no float values for dtype {dtype}")


@dataclass(frozen=True)
class Side:
    """One side of a block: its stored elements when it is stored plainly (not quantized), else its decoded
    values; `values` are computed only when asked for (the one-pass kernel reads the stored codes)."""

    dtype: str  # storage dtype; "F32" for a decoded quantized side
    stored: np.ndarray | None  # storage-form elements (uint16 for BF16, ...) when not quantized
    decoded: np.ndarray | None = None  # float32 values of a quantized side

    @cached_property
    def values(self) -> np.ndarray:
        """float32 values (float64 for F64), flat."""
        if self.decoded is not None:
            return self.decoded
        assert self.stored is not None
        return as_float(self.stored, self.dtype)


@dataclass
class CountedPart:
    """A block counted by the one-pass C kernel (both sides stored in the same 16-bit float dtype)."""

    dtype: str
    numel: int
    counts: kernels.PairCounts


@cache
def _value_table(dtype: str) -> np.ndarray | None:
    """float32 value of each 16-bit code for the kernel; None for BF16 (the kernel shifts the code)."""
    if dtype == "BF16":
        return None
    return as_float(np.arange(65536, dtype=np.uint32).astype(np.uint16), dtype).astype(np.float32)


def counted_part(base: Side, tuned: Side, delta: bool) -> tuple[CountedPart, np.ndarray | None] | None:
    """The block through kernels.pair16 when it applies (None otherwise: the caller takes the numpy path)."""
    dtype = base.dtype
    if not kernels.HAVE_C or base.stored is None or tuned.stored is None:
        return None
    if dtype != tuned.dtype or dtype not in FINITE_LIMIT16:
        return None
    tables = f32_bin_tables()
    if len(tables.irregular_bins):  # a float32 log10 not monotone at a bin edge: the kernel has no table for it
        return None
    b, t = base.stored.reshape(-1), tuned.stored.reshape(-1)
    d = np.empty(b.size, dtype=np.float32) if delta else None
    table = _value_table(dtype)
    limit = FINITE_LIMIT16[dtype]
    counts = kernels.pair16(b, t, (table, table), (limit, limit), tables.thresholds, d)
    if counts.nonfinite:
        return None
    return CountedPart(dtype, b.size, counts), d


def block_part(base: Side, tuned: Side, *, delta: bool = True) -> tuple[BlockPart | CountedPart, np.ndarray | None]:
    """The figures of one block of elements (the same elements on both sides), and ΔW there (0 where either
    side is not finite) for the spectrum (`delta`: wanted; the counted path then skips writing it).

    Values that are float32 (every dtype but F64) take the fast path: ΔW in float32 (each element within
    2^-24 relative of the exact difference, and 0 exactly where the values are equal), the sums of squares
    taken in float64 by the engine's reductions (see `square_sum`), one pass each. F64, or a block holding
    NaN or Inf, takes the float64 path."""
    base, tuned = _contiguous(base), _contiguous(tuned)  # the kernels read contiguous blocks
    counted = counted_part(base, tuned, delta)
    if counted is not None:
        return counted
    b, t = base.values, tuned.values
    unchanged = _unchanged(base, tuned)
    if b.dtype == np.float32 and t.dtype == np.float32:
        d32 = t - b
        delta_red = reduce_array(d32.view(np.uint32), "F32")
        if _finite_count(delta_red) == d32.size:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.abs(d32) / np.abs(b)  # W_base = 0: Inf or NaN, outside the finite distribution
            base_red, tuned_red = _reduce(base), _reduce(tuned)
            d2, b2, t2 = square_sum(delta_red), square_sum(base_red), square_sum(tuned_red)
            part = BlockPart(
                numel=b.size,
                d2=d2,
                b2=b2,
                t2=t2,
                bt=(b2 + t2 - d2) / 2,  # <b, t>; its rounding (~1e-16 of Σ b^2) moves the cosine by as little
                unchanged=unchanged,
                flips=_flips(b, t),
                nonfinite=0,
                base=base_red,
                tuned=tuned_red,
                delta=delta_red,
                ratio=ratio_reduction(ratio),
            )
            return part, d32
    b64, t64 = b.astype(np.float64), t.astype(np.float64)
    finite = np.isfinite(b64) & np.isfinite(t64)
    nonfinite = int(b64.size - np.count_nonzero(finite))
    if nonfinite:
        b64, t64 = np.where(finite, b64, 0.0), np.where(finite, t64, 0.0)
    d64 = t64 - b64
    nz = b64 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (np.abs(d64[nz]) / np.abs(b64[nz])).astype(np.float32)
    part = BlockPart(
        numel=b.size,
        d2=float(np.dot(d64, d64)),
        b2=float(np.dot(b64, b64)),
        t2=float(np.dot(t64, t64)),
        bt=float(np.dot(b64, t64)),
        unchanged=unchanged,
        flips=_flips(b64, t64),
        nonfinite=nonfinite,
        base=_reduce(base),
        tuned=_reduce(tuned),
        delta=reduce_array(d64.astype(np.float32).view(np.uint32), "F32"),
        ratio=ratio_reduction(ratio),
    )
    return part, d64


def _contiguous(side: Side) -> Side:
    if side.stored is None or side.stored.flags.c_contiguous:
        return side
    return Side(side.dtype, np.ascontiguousarray(side.stored), side.decoded)


def ratio_reduction(ratio: np.ndarray) -> Reduction:
    """|ΔW| / |W_base| (float32) counted by its top 16 bits, as BF16 codes: the same 2^-7-wide buckets as the
    F32 path's (whose codes are those bits), at a tenth of the cost; only its quantiles are read (no fit),
    each the lower edge of its bucket (within 2^-7 relative below the exact order statistic)."""
    top = (np.ascontiguousarray(ratio, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return reduce_array(top, "BF16")


def _unchanged(base: Side, tuned: Side) -> int:
    if base.stored is not None and tuned.stored is not None and base.dtype == tuned.dtype:
        bits = f"u{base.stored.itemsize}"  # the stored bit patterns (F16 held as float16 compares values)
        return int(np.count_nonzero(base.stored.view(bits) == tuned.stored.view(bits)))
    b32 = np.ascontiguousarray(base.values, dtype=np.float32)
    t32 = np.ascontiguousarray(tuned.values, dtype=np.float32)
    return int(np.count_nonzero(b32.view(np.uint32) == t32.view(np.uint32)))


def _flips(b: np.ndarray, t: np.ndarray) -> int:
    """Elements of opposite signs (comparisons, not a product that could underflow to 0)."""
    return int(np.count_nonzero((b < 0) & (t > 0)) + np.count_nonzero((b > 0) & (t < 0)))


def _finite_count(red: Reduction) -> int:
    return int(red.counts[finite_mask(red.dtype)].sum())


def square_sum(red: Reduction) -> float:
    """Σ x^2 over the finite elements of a reduction: exact from the counts of a 16- or 8-bit dtype (the codes
    are the values), from the float64 power sums of an F32 one (Σ (x - s)^2 + 2 s Σ (x - s) + n s^2)."""
    red.unpack()
    if red.power_sums is not None:
        s = red.shift
        n = float(_finite_count(red))
        return float(red.power_sums[1] + 2 * s * red.power_sums[0] + n * s * s)
    values = code_values(red.dtype).astype(np.float64)
    finite = finite_mask(red.dtype)
    return float(np.sum(red.counts[finite] * values[finite] ** 2))


def _reduce(side: Side) -> Reduction:
    """The side as `fit` reduces it: its storage dtype, or float32 values for a quantized side."""
    if side.stored is not None and side.dtype in STORAGE_NUMPY:
        return reduce_array(side.stored, side.dtype)
    return reduce_array(np.ascontiguousarray(side.values, dtype=np.float32).view(np.uint32), "F32")


@dataclass
class Totals:
    """The folded parts of one tensor (fold in block order: the same sums for any run)."""

    numel: int = 0
    d2: float = 0.0
    b2: float = 0.0
    t2: float = 0.0
    bt: float = 0.0
    unchanged: int = 0
    flips: int = 0
    nonfinite: int = 0
    base: Reduction | None = None
    tuned: Reduction | None = None
    delta: Reduction | None = None
    ratio: Reduction | None = None

    counted: HeldCounts | None = None  # the counted blocks' sums, folded in place until `finish`
    folds: int = 0  # blocks folded so far
    # per reduction: the fold that holds the numpy-path blocks' largest |value| (ties across the two kinds of
    # block go to the earlier block, as merge gives them within one kind)
    numpy_best: dict[str, int] = field(default_factory=dict)

    def fold(self, part: BlockPart | CountedPart) -> None:
        self.folds += 1
        if isinstance(part, CountedPart):
            self._fold_counted(part)
            return
        self.numel += part.numel
        self.d2 += part.d2
        self.b2 += part.b2
        self.t2 += part.t2
        self.bt += part.bt
        self.unchanged += part.unchanged
        self.flips += part.flips
        self.nonfinite += part.nonfinite
        for name in ("base", "tuned", "delta", "ratio"):
            red = getattr(part, name)
            held = getattr(self, name)
            if takes_the_lead(red, held):
                self.numpy_best[name] = self.folds
            setattr(self, name, red if held is None else merge([held, red]))

    def _fold_counted(self, part: CountedPart) -> None:
        c = part.counts
        self.numel += part.numel
        self.unchanged += c.unchanged
        self.flips += c.flips
        held = self.counted
        if held is None:
            dense = {name: np.zeros(size, dtype=np.int64) for name, size in kernels.PAIR_SIZES.items()}
            held = self.counted = HeldCounts(part.dtype, 0, dense, ((0, -1, 0),) * 4, np.zeros(5), c.shift)
        for name, (codes, counts) in c.packed.items():
            held.dense[name][codes] += counts  # codes are distinct within a block
        # the block's sums are around its own shift (its first tile's mean): moved to the tensor's first one
        held.sums += shift_sums(c.sums, float(part.numel), c.shift - held.shift)
        # the largest magnitude; a tie keeps the earlier block's (indices are block-local, as on the numpy path)
        held.tops = tuple((*t, self.folds) if t[0] > k[0] else k for k, t in zip(held.tops, c.tops, strict=True))
        held.numel += part.numel

    def finish(self) -> None:
        """Turn the counted blocks' sums into reductions and sums of squares (once, before the figures)."""
        held, self.counted = self.counted, None
        if held is None:
            return
        base, tuned, delta, ratio = counted_reductions(held)
        d2 = float(shift_sums(held.sums, float(held.numel), held.shift)[1])  # Σ ΔW^2 (around 0)
        b2, t2 = square_sum(base), square_sum(tuned)
        self.d2 += d2
        self.b2 += b2
        self.t2 += t2
        self.bt += (b2 + t2 - d2) / 2
        reductions = (("base", base), ("tuned", tuned), ("delta", delta), ("ratio", ratio))
        for (name, red), top in zip(reductions, held.tops, strict=True):
            other = getattr(self, name)
            if other is None:
                setattr(self, name, red)
                continue
            counted_first = top[2] < self.numpy_best.get(name, self.folds + 1)
            setattr(self, name, merge([red, other] if counted_first else [other, red]))


@dataclass
class HeldCounts:
    """The counted blocks of one tensor, folded: dense counts per table (kernels.PAIR_TABLES)."""

    dtype: str
    numel: int
    dense: dict[str, np.ndarray]
    tops: tuple[tuple[int, int, int], ...]  # (largest magnitude + 1 or 0, its block-local index, its fold)
    sums: np.ndarray  # power sums of ΔW around `shift`
    shift: float


def counted_reductions(held: HeldCounts) -> tuple[Reduction, Reduction, Reduction, Reduction]:
    """The reductions of base, tuned, ΔW and the ratio, as reduce_array makes them on the numpy path."""
    dense, n = held.dense, held.numel

    def exact(dtype: str, counts: np.ndarray, top: tuple[int, int, int]) -> Reduction:
        code, at, _ = top
        max_abs = abs(float(code_values(dtype)[code - 1])) if code else float("nan")
        return Reduction(dtype, n, counts, True, at if code else -1, max_abs)

    tables = f32_bin_tables()
    hist = tables.histogram(dense["delta"], dense["delta_above"], np.zeros((1, 1), dtype=np.int64))
    shift = f32_shift(dense["delta"])
    finite = float(dense["delta"][finite_mask("F32")].sum())
    sums = shift_sums(held.sums, finite, held.shift - shift)
    code, at, _ = held.tops[2]
    max_abs = float(np.array([code - 1], dtype=np.uint32).view(np.float32)[0]) if code else float("nan")
    delta = Reduction("F32", n, dense["delta"], False, at if code else -1, max_abs, hist, sums, shift, 0)
    base = exact(held.dtype, dense["base"], held.tops[0])
    tuned = exact(held.dtype, dense["tuned"], held.tops[1])
    return base, tuned, delta, exact("BF16", dense["ratio"], held.tops[3])


@dataclass(frozen=True)
class Figures:
    """The exact figures of one tensor pair."""

    numel: int
    relative_change: float  # ||ΔW||_F / ||W_base||_F (inf when W_base is zero and ΔW is not)
    cosine: float | None  # <W_base, W_tuned> / (||W_base|| ||W_tuned||); None where a side is zero (undefined)
    unchanged_fraction: float
    sign_flip_fraction: float
    delta_norm: float  # ||ΔW||_F
    base_norm: float
    tuned_norm: float
    # <ΔW, W_base> / (||ΔW|| ||W_base||): 1 for a pure scaling up, -1 down; None where ΔW or W_base is zero
    alignment: float | None
    scale: float  # 1 + <ΔW, W_base> / ||W_base||^2: the best factor c in W_tuned ≈ c W_base
    nonfinite: int
    delta_quantiles: dict[str, float]
    ratio_quantiles: dict[str, float]
    delta_fit: WeibullFit | None
    base_fit: WeibullFit | None
    tuned_fit: WeibullFit | None

    @property
    def delta_k(self) -> float | None:
        if self.base_fit is None or self.tuned_fit is None or not (self.base_fit.ok and self.tuned_fit.ok):
            return None
        return self.tuned_fit.k - self.base_fit.k

    @property
    def delta_lambda(self) -> float | None:
        """Relative: λ_tuned / λ_base - 1."""
        if self.base_fit is None or self.tuned_fit is None or not (self.base_fit.ok and self.tuned_fit.ok):
            return None
        return self.tuned_fit.lam / self.base_fit.lam - 1.0


def _clamp(x: float) -> float:
    return min(max(x, -1.0), 1.0)


def figures(totals: Totals, *, fits: bool = True, trim: str = COHORT_TRIM) -> Figures:
    """Figures from the folded sums and reductions (`fits`: Weibull fits of the 2-D tensors only)."""
    totals.finish()
    dn, bn, tn = math.sqrt(totals.d2), math.sqrt(totals.b2), math.sqrt(totals.t2)
    rel = dn / bn if bn > 0 else 0.0 if dn == 0 else math.inf
    # Undefined where a norm is 0 (a zero matrix; for the alignment also an untouched one): None, null in JSON.
    # They were 0.0 there before issue 33, which reads as "orthogonal". Untouched (and not zero): exactly 1, not
    # the rounding of Σ b^2 / sqrt(Σ b^2 Σ b^2).
    cosine = (
        None if not (bn and tn) else 1.0 if totals.d2 == 0 else _clamp(totals.bt / math.sqrt(totals.b2 * totals.t2))
    )
    db = totals.bt - totals.b2  # <ΔW, W_base>
    alignment = _clamp(db / (dn * bn)) if dn > 0 and bn > 0 else None
    scale = 1.0 + db / totals.b2 if totals.b2 > 0 else float("nan")
    n = max(totals.numel, 1)

    def quantiles(red: Reduction | None) -> dict[str, float]:
        if red is None:
            return {}
        dist = Summary(red).magnitudes
        return {f"q{_label(q)}": dist.quantile(q) for q in QUANTILES} | {"max": float(red.max_abs)}

    def fit(red: Reduction | None) -> WeibullFit | None:
        return Summary(red).fit("hist1024", trim) if fits and red is not None else None

    return Figures(
        numel=totals.numel,
        relative_change=rel,
        cosine=cosine,
        unchanged_fraction=totals.unchanged / n,
        sign_flip_fraction=totals.flips / n,
        delta_norm=dn,
        base_norm=bn,
        tuned_norm=tn,
        alignment=alignment,
        scale=scale,
        nonfinite=totals.nonfinite,
        delta_quantiles=quantiles(totals.delta),
        ratio_quantiles=quantiles(totals.ratio),
        delta_fit=fit(totals.delta) if dn > 0 else None,
        base_fit=fit(totals.base),
        tuned_fit=fit(totals.tuned),
    )


def _label(q: float) -> str:
    return f"{q * 100:g}".replace(".", "_")
