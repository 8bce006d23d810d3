"""Whether a model's weights come from another's, judged from two rows' lineage fingerprints (pure; docs/lineage.md).

The evidence is the correlation of the two models' values at the same fixed positions of matrices of one shape
(record/lineage.py, reduce/sample.py). Under the null, the two models were initialised independently: the
values of one at any positions are then independent of the other's, so a rank correlation over m samples has
z = atanh(rho) sqrt((m - 3) / 1.06) ~ N(0, 1) (Fieller, Hartley and Pearson's variance of Spearman's rho).
Each candidate matrix is compared with every reference matrix of a compatible shape (renamed tensors, dropped or
reordered layers match by shape, not by name); its p-value is that of the largest z among the n compared
(1 - Phi(z)^n), and the matrices' p-values are combined by Fisher's method. A derived model (fine-tuned, noised,
quantized, re-stored, merged, truncated, with rows added) keeps large correlations; an independent one, even
trained the same way on the same data, has none, because its hidden units sit at unrelated coordinates.

Permuted or rotated copies of the residual stream move every value to another position: the samples no longer
correlate. The cosines of fixed pairs of each matrix's hidden-unit lines (reduce/pairs.py) do not move: a second
test, the same rank correlations at the same pairs, matched by shape and side, Fisher-combined; the verdict's
p-value is the smaller of the two tests' times 2 (Bonferroni: valid whatever their dependence). Statistics that
do not depend on positions (each matrix's std, largest |w| and 99th percentile of |w|) say "permuted": the same
values to a part in a million in many matrices, which independent training does not produce; independent models
trained alike have close values of those otherwise, so they never make a verdict `derived` alone.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp
from scipy.stats import rankdata

from ..record.lineage import read_fingerprint, read_pairs
from ..reduce.pairs import pair_axis
from ..reduce.sample import sample_positions

DERIVED_LOG10P = -10.0  # combined p-value at or below: derived
INDEPENDENT_LOG10P = -3.0  # above: no evidence of shared weights
MIN_COMMON = 16  # samples two matrices must share to be compared
MIN_PAIRS = 8  # pair cosines a matrix must have to be compared
MIN_MATRICES = 4  # matrices compared before `independent` is said
EVIDENCE_LOG10P = -3.0  # a matrix whose own p-value is below carries evidence
# Position-free statistics: closer than this (median |log ratio| of std, max|w| and q99|w| over the matched
# matrices) is "agree closely"; equal to EXACT in at least EXACT_MATRICES matrices is "the same values".
CLOSE = 0.003
EXACT = 1e-6
EXACT_MATRICES = 8
SAME_WEIGHTS = 0.005  # median relative change below: the same weights, re-stored (BF16 rounding is 0.2%)
QUANT_ERROR_FLOOR = 0.05  # quantization_error's least: FP8's rounding (3 mantissa bits) is 2-3% in rms
SAME_BITS = 1e-3  # the same, in the same dtype (the samples are float16 of value / rms: 0.05% steps)
SPEARMAN_VARIANCE = 1.06  # Fieller, Hartley and Pearson (1957): var(atanh rho) ~ 1.06 / (m - 3)
RHO_CAP = 0.999999  # |rho| kept below 1: atanh's poles
LN10 = math.log(10.0)


@dataclass
class MatrixEvidence:
    """One candidate matrix and the reference matrix it correlates with best."""

    candidate: str
    reference: str
    rho: float
    samples: int
    compared: int  # reference matrices of a compatible shape it was compared with
    log10_p: float  # its own p-value (the best of `compared`), log10
    relative_change: float | None  # ||a - b|| / ||b|| over the common samples, in the weights' own units

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "reference": self.reference,
            "rho": round(self.rho, 4),
            "samples": self.samples,
            "compared_with": self.compared,
            "log10_p": round(self.log10_p, 2),
            "relative_change": None if self.relative_change is None else round(self.relative_change, 5),
        }


@dataclass
class Judgement:
    """The verdict on one reference: `derived`, `independent`, `inconclusive` or `not judged`."""

    reference: str
    verdict: str
    log10_p: float | None = None  # combined p-value against independent initialisations, log10
    relation: list[str] = field(default_factory=list)  # what the relation looks like, where it can tell
    evidence: list[MatrixEvidence] = field(default_factory=list)  # the matrices carrying it, strongest first
    matrices_compared: int = 0
    not_compared: list[str] = field(default_factory=list)  # candidate matrices with no reference of their shape
    invariants: dict[str, float | int | None] = field(default_factory=dict)  # position-free statistics' agreement
    reason: str = ""
    log10_p_samples: float | None = None  # the samples' test alone (combined over matrices), log10
    log10_p_pairs: float | None = None  # the pair cosines' test alone (reduce/pairs.py), log10
    pairs_compared: int = 0  # matrices whose pair cosines were compared

    @property
    def p_value(self) -> float | None:
        return None if self.log10_p is None else 10.0**self.log10_p

    def strength(self) -> float:
        """For sorting: the more negative the log p-value, the stronger (not judged last)."""
        return math.inf if self.log10_p is None else self.log10_p

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "verdict": self.verdict,
            "p_value": self.p_value,
            "log10_p": None if self.log10_p is None else round(self.log10_p, 2),
            "relation": self.relation,
            "reason": self.reason,
            "matrices_compared": self.matrices_compared,
            "log10_p_samples": None if self.log10_p_samples is None else round(self.log10_p_samples, 2),
            "log10_p_pairs": None if self.log10_p_pairs is None else round(self.log10_p_pairs, 2),
            "pairs_compared": self.pairs_compared,
            "evidence": [e.to_json() for e in self.evidence],
            "not_compared": self.not_compared,
            "invariants": self.invariants,
        }


@dataclass
class Fingerprint:
    """What judging needs of a row: its sampled values and the records of its matrices."""

    samples: dict[str, np.ndarray]
    records: dict[str, Mapping[str, Any]]
    k: int
    blocks: int | None
    # per (shape, samples): the names of the matrices and their samples as standardised ranks (rows), computed once
    stacks: dict[tuple[tuple[int, ...], int], tuple[list[str], np.ndarray]] = field(default_factory=dict)
    role_keys: list[tuple[Any, ...]] = field(default_factory=list)  # the position-free statistics (_role_stats)
    role_values: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    pairs: dict[str, np.ndarray] = field(default_factory=dict)  # pair-cosine ranks (reduce/pairs.py), where stored
    # per (shape, side, pairs): the names and their pair-cosine ranks standardised (rows)
    pair_stacks: dict[tuple[tuple[int, ...], int, int], tuple[list[str], np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.role_keys, self.role_values = _role_stats(self.records)
        names: dict[tuple[tuple[int, ...], int], list[str]] = defaultdict(list)
        for name, values in self.samples.items():
            if name in self.records:
                names[(tuple(self.records[name]["shape"]), values.size)].append(name)
        for key, group in names.items():
            self.stacks[key] = (group, _standard_ranks([self.samples[n] for n in group], key[1]))
        for pkey, group in pair_groups(self.records, {n: r.size for n, r in self.pairs.items()}).items():
            self.pair_stacks[pkey] = (group, _standard_ranks([self.pairs[n] for n in group], pkey[2]))

    @classmethod
    def of_or_why(cls, row: Mapping[str, Any]) -> Fingerprint | str:
        """The row's fingerprint, or why it has none (in words `lineage` prints)."""
        if (row.get("model") or {}).get("source") == "cohort":
            return "a cohort summary (no weights were read): fit the model itself to judge it"
        return cls.of(row) or NO_FINGERPRINT

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Fingerprint | None:
        """The row's fingerprint; None when it has none (a row written before issue 39, a cohort row)."""
        samples = read_fingerprint(row)
        if samples is None:
            return None
        records = {m["name"]: m for m in row.get("matrices", [])}
        blocks = [m.get("block") for m in records.values() if m.get("block") is not None]
        found = row.get("lineage") or {}
        blocks_n = (max(blocks) + 1) if blocks else None
        return cls(samples, records, int(found.get("k", 0)), blocks_n, pairs=read_pairs(row))


def pair_groups(
    records: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int]
) -> dict[tuple[tuple[int, ...], int, int], list[str]]:
    """The matrices whose pair cosines are compared, by (shape, side, pairs), in the order of `sizes` (each
    matrix's number of pair cosines, in the row's order): Fingerprint.pair_stacks' groups."""
    paired: dict[tuple[tuple[int, ...], int, int], list[str]] = defaultdict(list)
    for name, size in sizes.items():
        axis = pair_axis(records[name].get("kind")) if name in records else None
        if axis is not None and size >= MIN_PAIRS:
            paired[(tuple(records[name]["shape"]), axis, size)].append(name)
    return dict(paired)


def _key(shape: Sequence[int]) -> tuple[int, int]:
    """Matrices compared with each other: the same row length and rows below the same power of two."""
    rows, cols = int(shape[0]), int(math.prod(shape[1:]))
    return cols, 1 << max(0, (rows - 1).bit_length())


def log_p_max(z: np.ndarray, n: int) -> np.ndarray:
    """ln P(max of n independent N(0,1) >= z), elementwise (one function for the per-reference judge and the
    batched one: their p-values agree bit for bit)."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        exact = np.log(np.maximum(-np.expm1(n * log_ndtr(z)), 1e-300))
        tail = np.minimum(0.0, np.log(n) + log_ndtr(-z))  # 1 - (1 - q)^n ~ n q for tiny q
    return np.where(z < 5.0, exact, tail)


def _log_p_max(z: float, n: int) -> float:
    return float(log_p_max(np.array([z]), n)[0])


def fisher_log_p(log_ps: Sequence[float]) -> float:
    """ln of Fisher's combined p-value: P(chi2 with 2m degrees of freedom >= -2 sum ln p), exact for any size."""
    m = len(log_ps)
    half = -float(sum(log_ps))  # X / 2
    if half <= 0:
        return 0.0
    i = np.arange(m)
    return min(0.0, -half + float(logsumexp(i * math.log(half) - gammaln(i + 1))))


def _common(a_shape: Sequence[int], b_shape: Sequence[int], ka: int, kb: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices into two matrices' samples of the positions they share (rows added or dropped at the end)."""
    if tuple(a_shape) == tuple(b_shape):
        n = min(ka, kb)
        at = np.arange(n)
        return at, at
    pa = sample_positions(tuple(a_shape), ka)
    pb = sample_positions(tuple(b_shape), kb)
    _, ia, ib = np.intersect1d(pa, pb, assume_unique=True, return_indices=True)  # same (row, column)
    order = np.argsort(ia)
    return ia[order], ib[order]


def _spearman_z(ra: np.ndarray, rb: np.ndarray) -> tuple[float, float]:
    """Spearman's rho of two samples given as ranks, and its z under independence."""
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return 0.0, 0.0
    rho = float(np.mean((ra - ra.mean()) * (rb - rb.mean())) / (sa * sb))
    rho = max(-RHO_CAP, min(RHO_CAP, rho))
    return rho, math.atanh(rho) * math.sqrt((ra.size - 3) / SPEARMAN_VARIANCE)


def fisher_z(rho: np.ndarray, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank correlations over `samples` shared ranks, capped off +-1, and their z under independence (as
    _spearman_z's, for arrays: every candidate matrix against every option at once)."""
    rho = np.clip(rho, -RHO_CAP, RHO_CAP)
    return rho, np.arctanh(rho) * math.sqrt((samples - 3) / SPEARMAN_VARIANCE)


def _standard_ranks(rows: list[np.ndarray], k: int) -> np.ndarray:
    """Each sample's first k values as ranks, centred and scaled to unit norm (rows of a matrix). Ties share their
    average rank: ranked by position, a constant matrix (a zero-initialised pooler) or values on a grid (ternary
    weights) correlated perfectly with another model's; a constant sample has no ranks to correlate (zeros)."""
    stacked = np.stack([v[:k] for v in rows])
    r = rankdata(stacked, axis=1).astype(np.float64)
    r -= r.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(r, axis=1, keepdims=True)
    return np.divide(r, norms, out=np.zeros_like(r), where=norms > 0)


def _same_shape_z(cand: Fingerprint, ref: Fingerprint) -> dict[str, tuple[float, float, int, str, int]]:
    """For each candidate matrix, its best match among the reference's matrices of exactly its shape and sample
    count, all compared at once (one product of the precomputed rank matrices per shape): (z, rho, samples,
    reference, compared)."""
    out = {}
    for key, (mine, ra) in cand.stacks.items():
        theirs = ref.stacks.get(key)
        if theirs is None or key[1] < MIN_COMMON:
            continue
        rho, z = fisher_z(ra @ theirs[1].T, key[1])
        best = np.argmax(z, axis=1)
        for i, name in enumerate(mine):
            j = int(best[i])
            out[name] = (float(z[i, j]), float(rho[i, j]), key[1], theirs[0][j], len(theirs[0]))
    return out


def _pairs_evidence(cand: Fingerprint, ref: Fingerprint) -> list[MatrixEvidence]:
    """For each candidate matrix with pair cosines, its best match among the reference's of the same shape and
    side (reduce/pairs.py): the rank correlation of the cosines of the same pairs, unchanged by a rotation or
    permutation of the residual stream. Strongest first."""
    out = []
    for key, (mine, ra) in cand.pair_stacks.items():
        theirs = ref.pair_stacks.get(key)
        if theirs is None:
            continue
        rho, z = fisher_z(ra @ theirs[1].T, key[2])
        best = np.argmax(z, axis=1)
        for i, name in enumerate(mine):
            j = int(best[i])
            n = len(theirs[0])
            log_p = _log_p_max(float(z[i, j]), n) / LN10
            out.append(MatrixEvidence(name, theirs[0][j], float(rho[i, j]), key[2], n, log_p, None))
    return sorted(out, key=lambda e: e.log10_p)


def _stat(record: Mapping[str, Any], name: str) -> float | None:
    value = (record.get("stats") or {}).get(name)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _sv_max(record: Mapping[str, Any]) -> float | None:
    value = (record.get("spectrum") or {}).get("sv_max")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _role_stats(records: Mapping[str, Mapping[str, Any]]) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """Each matrix's role key (kind, block, expert, shape, and its rank among those: file order) and its log std,
    log max|w|, log q99|w| and log largest singular value (NaN where absent)."""
    keys: list[tuple[Any, ...]] = []
    seen: dict[tuple[Any, ...], int] = defaultdict(int)
    values = np.full((len(records), 4), np.nan)
    for i, rec in enumerate(records.values()):
        key = (rec.get("kind"), rec.get("block"), rec.get("expert"), tuple(rec.get("shape", ())))
        keys.append((*key, seen[key]))
        seen[key] += 1
        for j, v in enumerate((_stat(rec, "std"), _stat(rec, "max_abs"), _stat(rec, "q99_abs"), _sv_max(rec))):
            if v is not None:
                values[i, j] = math.log(v)
    return keys, values


def _invariants(cand: Fingerprint, ref: Fingerprint) -> dict[str, float | int | None]:
    """Position-free statistics of the matrices matched by kind, block and expert (in file order within those),
    and by shape: the median |log ratio| of each, and how many matrices have std, max|w| and q99|w| equal to
    a part in a million."""
    where = {key: i for i, key in enumerate(ref.role_keys)}
    mine = [(i, where[key]) for i, key in enumerate(cand.role_keys) if key in where]
    out: dict[str, float | int | None] = {"matched": len(mine), "equal": 0}
    if mine:
        a, b = np.array(mine).T
        d = np.abs(cand.role_values[a] - ref.role_values[b])
        out["equal"] = int(np.sum(np.all(d[:, :3] <= EXACT, axis=1)))  # NaN compares false: not equal
    else:
        d = np.zeros((0, 4))
    for j, name in enumerate(("std", "max_abs", "q99_abs", "sv_max")):
        column = d[:, j][~np.isnan(d[:, j])]
        out[f"{name}_median_log_ratio"] = float(np.median(column)) if column.size else None
    return out


def _agree_closely(inv: Mapping[str, float | int | None]) -> bool:
    medians = [inv.get(f"{name}_median_log_ratio") for name in ("std", "max_abs", "q99_abs")]
    return all(isinstance(m, float) and m < CLOSE for m in medians) and int(inv.get("matched") or 0) >= MIN_MATRICES


NO_FINGERPRINT = "its row has no lineage fingerprint (written before it existed): refit to add the fingerprint"


def judge(reference: str, cand: Fingerprint, ref: Fingerprint | str | None) -> Judgement:
    """The verdict on `reference` (a label) for the candidate; `ref` None or a reason: it has no fingerprint."""
    if ref is None or isinstance(ref, str):
        return Judgement(reference, "not judged", reason=ref or NO_FINGERPRINT)
    groups: dict[tuple[int, int], list[str]] = defaultdict(list)
    for name in ref.samples:
        if name in ref.records:
            groups[_key(ref.records[name]["shape"])].append(name)
    same_shape = _same_shape_z(cand, ref)
    evidence: list[MatrixEvidence] = []
    not_compared: list[str] = []
    for name, values in cand.samples.items():
        rec = cand.records.get(name)
        options = groups.get(_key(rec["shape"])) if rec is not None else None
        if rec is None or not options:
            not_compared.append(name)
            continue
        best: tuple[float, float, int, str] | None = None
        compared = 0
        # matrices of another shape (rows added or dropped: a vocabulary) only where none has this one's
        for other in [] if name in same_shape else options:
            ia, ib = _common(rec["shape"], ref.records[other]["shape"], values.size, ref.samples[other].size)
            if ia.size < MIN_COMMON:
                continue
            compared += 1
            rho, z = _spearman_z(rankdata(values[ia]), rankdata(ref.samples[other][ib]))
            if best is None or z > best[0]:
                best = (z, rho, ia.size, other)
        if name in same_shape:
            z, rho, m, other, n = same_shape[name]
            compared += n
            if best is None or z > best[0]:
                best = (z, rho, m, other)
        if best is None:
            not_compared.append(name)
            continue
        z, rho, m, other = best
        ia, ib = _common(rec["shape"], ref.records[other]["shape"], values.size, ref.samples[other].size)
        a, b = values[ia], ref.samples[other][ib]
        norm = float(np.linalg.norm(b))
        change = float(np.linalg.norm(a - b)) / norm if norm > 0 else None
        evidence.append(MatrixEvidence(name, other, rho, m, compared, _log_p_max(z, compared) / LN10, change))
    return conclude(reference, cand, ref, evidence, not_compared, _invariants(cand, ref))


def conclude(
    reference: str,
    cand: Fingerprint,
    ref: Fingerprint,
    evidence: list[MatrixEvidence],
    not_compared: list[str],
    inv: dict[str, float | int | None],
    log10_p: float | None = None,
    paired: tuple[list[MatrixEvidence], float | None] | None = None,
) -> Judgement:
    """The verdict from the matrices' evidence, the pair cosines' and the invariants' agreement (judge's, and
    lineage_batch's for many references at once: `log10_p` the samples' combined p-value it computed, else
    Fisher's of the evidence; `paired` its pair cosines' evidence, strongest first, and their combined p-value,
    else _pairs_evidence's; `ref` with its position-free statistics, as Fingerprint has them)."""
    out = Judgement(reference, "inconclusive", evidence=evidence, not_compared=not_compared, invariants=inv)
    out.matrices_compared = len(evidence)
    evidence.sort(key=lambda e: e.log10_p)
    paired_p: float | None = None
    if paired is None:
        pairs = _pairs_evidence(cand, ref)
    else:
        pairs, paired_p = paired
    out.pairs_compared = len(pairs)
    if evidence:
        samples_p = fisher_log_p([e.log10_p * LN10 for e in evidence]) / LN10 if log10_p is None else log10_p
        out.log10_p_samples = samples_p
    if pairs:
        out.log10_p_pairs = fisher_log_p([e.log10_p * LN10 for e in pairs]) / LN10 if paired_p is None else paired_p
    tests = [p for p in (out.log10_p_samples, out.log10_p_pairs) if p is not None]
    if not tests:
        out.reason = "no matrix of a shape in common: nothing to compare"
        return _by_invariants(out, cand, ref)
    out.log10_p = min(0.0, min(tests) + math.log10(len(tests)))  # Bonferroni over the two tests
    by_pairs = out.log10_p_samples is None or (out.log10_p_pairs or 0.0) < out.log10_p_samples
    shown = pairs if by_pairs else evidence
    compared = len(shown)
    out.matrices_compared = max(len(evidence), len(pairs))
    carrying = [e for e in shown if e.log10_p <= EVIDENCE_LOG10P]
    if out.log10_p <= DERIVED_LOG10P:
        out.verdict = "derived"
        out.evidence = carrying
        if by_pairs:
            out.relation = _rotated(cand, ref, carrying, compared, evidence)
            out.reason = (
                f"the cosines of hidden-unit pairs correlate in {len(carrying)} of {compared} matrices compared"
            )
        else:
            out.relation = _relation(cand, ref, carrying, evidence)
            out.reason = f"{len(carrying)} of {compared} matrices compared correlate with the reference's"
        return out
    out.evidence = carrying or shown[:3]
    if out.log10_p > INDEPENDENT_LOG10P:
        out.verdict = "independent"
        out.reason = f"no correlation in {out.matrices_compared} matrices compared"
        if out.matrices_compared < MIN_MATRICES:
            out.verdict = "inconclusive"
            out.reason = f"only {out.matrices_compared} matrices compared"
    else:
        out.reason = "weak evidence: below the threshold of `derived`"
    return _by_invariants(out, cand, ref)


def _by_invariants(out: Judgement, cand: Fingerprint, ref: Fingerprint) -> Judgement:
    """Where the samples do not say `derived`: the position-free statistics may (the same values: a permuted
    copy) or may cast doubt (close agreement: permuted or rotated, or only trained alike)."""
    inv = out.invariants
    equal = int(inv.get("equal") or 0)
    matched = int(inv.get("matched") or 0)
    if equal >= EXACT_MATRICES and equal >= 0.9 * matched:
        # std, max|w| and q99|w| equal to 1e-6 in each: independent models differ by 1e-3 or more in std alone;
        # a bound, taking each matrix's chance as 2 EXACT / 1e-3 (a smooth density of relative differences)
        out.verdict = "derived"
        out.log10_p = equal * math.log10(2 * EXACT / 1e-3)
        out.relation = ["permuted: the same values at other positions (std, max|w|, q99|w| equal)"]
        out.reason = f"{equal} of {matched} matrices hold the same values (position-free statistics equal)"
        return out
    if out.verdict == "independent" and _agree_closely(inv):
        out.verdict = "inconclusive"
        out.reason += (
            "; but position-free statistics agree closely: a permuted or rotated copy, or a model trained alike"
        )
    return out


def _equal_stats(cand: Fingerprint, ref: Fingerprint) -> set[str]:
    """The candidate matrices whose std, max|w| and q99|w| equal those of the reference's matrix of the same role
    to a part in a million: the same values, wherever they sit."""
    where = {key: i for i, key in enumerate(ref.role_keys)}
    names = list(cand.records)
    mine = [(i, where[key]) for i, key in enumerate(cand.role_keys) if key in where]
    if not mine:
        return set()
    a, b = np.array(mine).T
    equal = np.all(np.abs(cand.role_values[a, :3] - ref.role_values[b, :3]) <= EXACT, axis=1)  # NaN: not equal
    return {names[i] for i in a[equal].tolist()}


def _rotated(
    cand: Fingerprint, ref: Fingerprint, carrying: list[MatrixEvidence], compared: int, samples: list[MatrixEvidence]
) -> list[str]:
    """The relation of a candidate derived by its pair cosines while its samples do not say so: the residual stream
    permuted (the same values: statistics equal) or rotated, with or without changes."""
    equal = _equal_stats(cand, ref) & {e.candidate for e in carrying}
    moved = f"the cosines of hidden-unit pairs correlate in {len(carrying)} of {compared} matrices"
    if len(equal) >= 0.9 * len(carrying):
        return [f"permuted: the same values at other positions (residual stream; {moved}, std, max|w|, q99|w| equal)"]
    said = [f"permuted or rotated residual stream, then changed or with norm gains folded in ({moved})"]
    if any(e.log10_p <= EVIDENCE_LOG10P for e in samples):
        said.append("some matrices' samples correlate too (those the residual stream does not reach)")
    return said


def _relation(
    cand: Fingerprint, ref: Fingerprint, carrying: list[MatrixEvidence], compared_ev: list[MatrixEvidence]
) -> list[str]:
    """What the relation looks like, from the matrices that carry the evidence (of the samples' test)."""
    said: list[str] = []
    compared = len(compared_ev)
    still = {e.candidate for e in carrying}
    # matrices whose samples do not correlate but whose values are the same: hidden units reordered
    permuted = sorted((_equal_stats(cand, ref) & {e.candidate for e in compared_ev}) - still)
    if permuted and len(carrying) + len(permuted) >= 0.9 * compared:
        kinds = sorted({str(cand.records[n].get("kind")) for n in permuted})
        said.append(
            f"permuted: {len(permuted)} of {compared} matrices hold the same values at other positions "
            f"({', '.join(kinds)}: hidden units or heads reordered)"
        )
        carrying = [e for e in carrying if e.candidate not in permuted]
    elif len(carrying) < 0.5 * compared:
        kinds = sorted({str(cand.records[e.candidate].get("kind")) for e in carrying})
        said.append(f"shares some matrices only ({len(carrying)} of {compared}: {', '.join(kinds)})")
    changes = [e.relative_change for e in carrying if e.relative_change is not None]
    change = statistics.median(changes) if changes else None  # np.median's value, without its overhead per call
    stored = {e.candidate: _quantization(cand.records[e.candidate]) for e in carrying}
    quantized = {n: q for n, q in stored.items() if q is not None}
    # a quantized matrix's stored dtype (I32 codes) is not a re-storing of the reference's values
    dtypes = {str(cand.records[e.candidate].get("dtype")) for e in carrying if e.candidate not in quantized} - {
        str(ref.records[e.reference].get("dtype")) for e in carrying
    }
    grid = any("grid" in cand.records[e.candidate] for e in carrying)
    same = SAME_WEIGHTS if dtypes or quantized else SAME_BITS  # rounding to another dtype changes values by 0.4%
    labels = ", ".join(sorted({label for label, _ in quantized.values()}))
    if change is not None and change < same:
        word = "the other matrices unchanged" if said else "same weights"
        said.append(f"{word} (median relative change {change:.2%})")
        if quantized:
            said.append(f"stored quantized ({labels})")
    elif quantized:
        said.append(_quantized_relation(carrying, quantized, labels))
    elif grid:
        said.append(f"quantized: values on a 4-bit grid (median relative change {change:.1%})")
    elif change is not None:
        said.append(f"modified: fine-tuned, merged, noised or quantized (median relative change {change:.1%})")
    if dtypes:
        said.append(f"re-stored as {', '.join(sorted(dtypes))}")
    upcycled = {
        e.candidate for e in carrying if _expert(cand, e.candidate) is not None and _expert(ref, e.reference) is None
    }
    if upcycled:
        said.append(f"experts copied from a dense FFN (upcycled: {len(upcycled)} expert matrices match dense ones)")
    renamed = sum(e.candidate != e.reference for e in carrying)
    if renamed > len(carrying) / 2:
        said.append("tensors renamed or layers moved")
    if cand.blocks is not None and ref.blocks is not None and cand.blocks != ref.blocks:
        word = "fewer" if cand.blocks < ref.blocks else "more"
        said.append(f"{word} layers ({cand.blocks} against {ref.blocks})")
    for e in carrying:
        a, b = cand.records[e.candidate]["shape"], ref.records[e.reference]["shape"]
        if a[0] != b[0]:
            word = "added" if a[0] > b[0] else "removed"
            said.append(f"rows {word} in {e.candidate} ({a[0]} against {b[0]}): an extended or cut vocabulary")
    return said


def _quantization(record: Mapping[str, Any]) -> tuple[str, int] | None:
    """(label, bits) of a matrix stored quantized and sampled from its dequantized values, else None."""
    label = record.get("quantization")
    if not label:
        return None
    bits = (record.get("dequantized") or {}).get("bits")
    if not isinstance(bits, int):  # GGUF records name the type only: Q4_1, IQ4_XS, Q6_K, MXFP4
        found = re.search(r"(\d+)", str(label))
        bits = int(found.group(1)) if found else 4
    if "MXFP4" in str(label).upper():  # E8M0 scales, powers of two: up to half the grid unused, a bit lost
        bits -= 1
    return str(label), bits


def quantization_error(bits: int) -> float:
    """The relative change (||a - b|| / ||b||) rounding to a `bits`-bit grid explains, generously: a scale per
    group from the group's range (about 8 rms wide) gives steps of 8 / 2^bits rms and errors of about 2^(1 - bits)
    rms (step / sqrt(12)); twice that, and at least 5% (FP8 E4M3 keeps 3 mantissa bits: 2-3% in rms)."""
    return max(QUANT_ERROR_FLOOR, 2.0 ** (2 - bits))


def _quantized_relation(carrying: list[MatrixEvidence], quantized: Mapping[str, tuple[str, int]], labels: str) -> str:
    """What a candidate whose matrices are stored quantized (`labels`: their formats) looks like: quantized only
    (its dequantized values differ from the reference's by no more than its grid explains), or changed besides."""
    changes = [e.relative_change for e in carrying if e.candidate in quantized and e.relative_change is not None]
    if not changes:
        return f"quantized ({labels})"
    change = float(np.median(changes))
    level = quantization_error(min(bits for _, bits in quantized.values()))
    if change <= level:
        return (
            f"quantized ({labels}): dequantized values at the quantization error's level "
            f"(median relative change {change:.1%}; the grid explains up to {level:.0%})"
        )
    return (
        f"quantized ({labels}) and changed besides: fine-tuned, merged or noised (median relative change "
        f"{change:.1%}, more than the {level:.0%} the grid explains)"
    )


def _expert(fp: Fingerprint, name: str) -> int | None:
    expert = fp.records[name].get("expert")
    return expert if isinstance(expert, int) else None


def judge_all(cand: Fingerprint, refs: Iterable[tuple[str, Fingerprint | str | None]]) -> list[Judgement]:
    """Every reference's judgement, strongest evidence first (the not judged last); `refs` may be a generator
    (read one at a time: a judgement keeps nothing of its reference's row)."""
    return ranked([judge(label, cand, ref) for label, ref in refs])


def ranked(judgements: Iterable[Judgement]) -> list[Judgement]:
    """Derived first, then inconclusive, independent and not judged; strongest evidence first within each."""
    order = {"derived": 0, "inconclusive": 1, "independent": 2, "not judged": 3}
    return sorted(judgements, key=lambda j: (order[j.verdict], j.strength()))
