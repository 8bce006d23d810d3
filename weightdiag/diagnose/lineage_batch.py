"""The candidate judged against many packed references at once (lineage against the database; pure).

The same judgement as diagnose.lineage.judge for each reference, computed for up to CHUNK references of one
layout (rows of one architecture: lineage_packed.Layout) at a time: which candidate matrix is compared with which
of the reference's depends on the layout alone, so it is worked out once, and the correlations, p-values,
relative changes, position-free statistics and Fisher's combination are arrays over the references. Judged one
at a time, 2,000 rows took seconds of Python per command; here a chunk's arithmetic is a few products and sorts.
The pair cosines (reduce/pairs.py) are standardised once per chunk and layout; their test, the Bonferroni of the
two tests and the relation are diagnose.lineage.conclude's, given each reference's pair stacks and position-free
statistics from the packed rows. tests/test_lineage_fast.py checks that both give the same judgements.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp
from scipy.stats import rankdata

from .lineage import (
    EXACT,
    LN10,
    MIN_COMMON,
    RHO_CAP,
    SPEARMAN_VARIANCE,
    Fingerprint,
    Judgement,
    MatrixEvidence,
    _common,
    _key,
    conclude,
    fisher_z,
    judge,
    log_p_max,
    ranked,
)
from .lineage_packed import Layout, Packed, layout_in, unpack

CHUNK = 128  # references judged together: their samples take CHUNK x 2 x 8 x (samples per row) bytes


@dataclass
class _Compared:
    """A candidate matrix and the reference matrices (indices into the layout's) it is compared with."""

    name: str
    options: list[int]
    stack: tuple[tuple[int, ...], int] | None  # same shape and samples: the stack it is compared in at once
    common: list[tuple[np.ndarray, np.ndarray]]  # per option, the shared samples' indices (_common)


@dataclass
class _Plan:
    compared: list[_Compared]
    not_compared: list[str]
    pairs: tuple[np.ndarray, np.ndarray]  # matrices matched by role (_invariants): candidate's, reference's


def _plan(cand: Fingerprint, layout: Layout) -> _Plan:
    """What judge compares, for references of this layout (its loop over the candidate's matrices)."""
    compared: list[_Compared] = []
    not_compared: list[str] = []
    same_shape = {
        name: key
        for key, (names, _) in cand.stacks.items()
        if key in layout.stacks and key[1] >= MIN_COMMON
        for name in names
    }
    for name, values in cand.samples.items():
        rec = cand.records.get(name)
        options = layout.groups.get(_key(rec["shape"])) if rec is not None else None
        if rec is None or not options:
            not_compared.append(name)
            continue
        if name in same_shape:
            key = same_shape[name]
            stack = layout.stacks[key]
            common = [(np.arange(key[1]), np.arange(key[1]))] * len(stack)
            compared.append(_Compared(name, stack, key, common))
            continue
        kept, common = [], []
        for other in options:
            ia, ib = _common(
                rec["shape"], layout.records[layout.names[other]]["shape"], values.size, layout.sizes[other]
            )
            if ia.size >= MIN_COMMON:
                kept.append(other)
                common.append((ia, ib))
        if kept:
            compared.append(_Compared(name, kept, None, common))
        else:
            not_compared.append(name)
    where = {key: i for i, key in enumerate(layout.role_keys)}
    mine = [(i, where[key]) for i, key in enumerate(cand.role_keys) if key in where]
    a, b = np.array(mine, dtype=np.int64).T if mine else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    return _Plan(compared, not_compared, (a, b))


def _standard(doubled: np.ndarray) -> np.ndarray:
    """_standard_ranks of ranks already taken (doubled: integers), along the last axis, bit for bit: twice the
    centred ranks (d - (k + 1)) and twice their norm are exact, so their quotient is the same float."""
    x = np.subtract(doubled, doubled.shape[-1] + 1, dtype=np.float64)  # the mean of doubled ranks is k + 1
    norms = np.sqrt(np.einsum("...k,...k->...", x, x))[..., None]  # integers below 2**53: summed exactly
    norms[norms == 0] = 1.0  # a constant sample: x is zeros, as _standard_ranks gives it
    x /= norms
    return x


def _fisher(log_ps: np.ndarray) -> np.ndarray:
    """lineage.fisher_log_p of each row (ascending, as judge sums them), bit for bit."""
    m = log_ps.shape[1]
    half = -np.cumsum(log_ps, axis=1)[:, -1]  # left to right, as Python's sum
    logs = np.array([math.log(h) if h > 0 else 0.0 for h in half.tolist()])
    i = np.arange(m)
    terms = i[None, :] * logs[:, None] - gammaln(i + 1)[None, :]
    combined = np.minimum(0.0, -half + logsumexp(terms, axis=1))
    return np.where(half > 0, combined, 0.0)


def _spearman(ra: np.ndarray, rb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """lineage._spearman_z of one sample of ranks `ra` against each row of `rb`."""
    sa, sb = ra.std(), rb.std(axis=1)
    if sa == 0:
        zero = np.zeros(rb.shape[0])
        return zero, zero
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.mean((ra - ra.mean())[None, :] * (rb - rb.mean(axis=1, keepdims=True)), axis=1) / (sa * sb)
    rho = np.clip(np.where(sb == 0, 0.0, rho), -RHO_CAP, RHO_CAP)
    scale = math.sqrt((ra.size - 3) / SPEARMAN_VARIANCE)
    z = np.array([math.atanh(r) * scale for r in rho.tolist()])  # math's, as _spearman_z: bit for bit
    return rho, np.where(sb == 0, 0.0, z)


def _norms(x: np.ndarray) -> np.ndarray:
    """The Euclidean norm along the last axis, as np.linalg.norm of each vector (the root of its dot product)."""
    return np.sqrt(np.matmul(x[..., None, :], x[..., :, None])[..., 0, 0])


def _change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """||a - b|| / ||b|| per row (NaN where ||b|| is 0: no change stated)."""
    norm = _norms(b)
    with np.errstate(divide="ignore", invalid="ignore"):  # per vector along the last axis
        return np.where(norm > 0, _norms(a - b) / norm, np.nan)


def _judge_chunk(
    cand: Fingerprint, layout: Layout, plan: _Plan, labels: list[str], blobs: list[bytes]
) -> list[Judgement]:
    packed = unpack(blobs)
    refs, count = len(labels), len(plan.compared)
    at = np.arange(refs)
    rho_best, log_p, change = np.zeros((refs, count)), np.zeros((refs, count)), np.zeros((refs, count))
    samples, chosen = np.zeros((refs, count), np.int64), np.zeros((refs, count), np.int64)
    stacked: dict[tuple[tuple[int, ...], int], list[int]] = {}  # same-shape stacks: positions in plan.compared
    for m, c in enumerate(plan.compared):
        if c.stack is not None:
            stacked.setdefault(c.stack, []).append(m)
            continue
        mine = cand.samples[c.name]
        zs, rhos, changes = [], [], []
        for other, (ia, ib) in zip(c.options, c.common, strict=True):
            theirs = packed.values(other, ib)
            rho_o, z_o = _spearman(rankdata(mine[ia]), rankdata(theirs, axis=1))
            rhos.append(rho_o)
            zs.append(z_o)
            changes.append(_change(mine[ia][None, :], theirs))
        z, rho = np.stack(zs, axis=1), np.stack(rhos, axis=1)
        best = np.argmax(z, axis=1)
        change[:, m] = np.stack(changes, axis=1)[at, best]
        samples[:, m] = np.array([ia.size for ia, _ in c.common])[best]
        rho_best[:, m] = rho[at, best]
        log_p[:, m] = log_p_max(z[at, best], len(c.options)) / LN10
        chosen[:, m] = np.array(c.options)[best]
    for key, positions in stacked.items():  # one product per reference, as _same_shape_z's
        names, ra = cand.stacks[key]
        options = np.array(layout.stacks[key])
        theirs = _standard(packed.stack_doubled(key)).transpose(0, 2, 1)
        rows = [names.index(plan.compared[m].name) for m in positions]
        rho, z = fisher_z(np.matmul(ra, theirs)[:, rows, :], key[1])  # (refs, the plan's matrices, options)
        best = np.argmax(z, axis=2)
        mine = np.stack([cand.samples[plan.compared[m].name] for m in positions])
        b = packed.stack_values(key, best)  # (refs, matrices, samples)
        change[:, positions] = _change(mine[None, :, :], b)
        samples[:, positions] = key[1]
        rho_best[:, positions] = np.take_along_axis(rho, best[..., None], axis=2)[..., 0]
        z_best = np.take_along_axis(z, best[..., None], axis=2)[..., 0]
        log_p[:, positions] = log_p_max(z_best, len(options)) / LN10
        chosen[:, positions] = options[best]
    combined: list[float | None] = _fisher(np.sort(log_p * LN10, axis=1)).tolist() if count else [None] * refs
    invariants = _invariants(cand, plan, packed.roles)
    paired = _pairs_evidence(cand, packed)
    names = [c.name for c in plan.compared]
    compared = [len(c.options) for c in plan.compared]
    theirs_names = np.array(layout.names, dtype=object)[chosen].tolist() if count else [[]] * refs
    changes_or_none = [[None if math.isnan(x) else x for x in row] for row in change.tolist()]
    out = []
    for r, label in enumerate(labels):
        row = (names, theirs_names[r], rho_best[r].tolist(), samples[r].tolist(), compared, log_p[r].tolist())
        evidence = list(map(MatrixEvidence, *row, changes_or_none[r]))
        fisher = combined[r]
        log10_p = None if fisher is None else fisher / LN10
        ref = _reference(layout, packed.roles[r])
        out.append(conclude(label, cand, ref, evidence, list(plan.not_compared), invariants[r], log10_p, paired[r]))
    return out


def _pairs_evidence(cand: Fingerprint, packed: Packed) -> list[tuple[list[MatrixEvidence], float | None]]:
    """lineage._pairs_evidence and the pair test's combined p-value for every row of the chunk: the rows' pair
    ranks standardised at once from their stored codes (_standard: _standard_ranks' floats, bit for bit),
    one product per reference as its own, the p-values and Fisher's combination as arrays."""
    refs = packed.pairs.shape[0]
    names: list[str] = []
    theirs: list[np.ndarray] = []
    rhos, log_ps, sizes, counts = [], [], [], []
    for key, (mine, ra) in cand.pair_stacks.items():
        found = packed.layout.pair_stacks.get(key)
        if found is None:
            continue
        options, columns = found
        doubled = packed.pairs[:, columns].reshape(refs, len(options), key[2])  # stored as twice the ranks
        stack = _standard(doubled).transpose(0, 2, 1)
        rho, z = fisher_z(np.matmul(ra, stack), key[2])  # (refs, mine, options)
        best = np.argmax(z, axis=2)
        z_best = np.take_along_axis(z, best[..., None], axis=2)[..., 0]
        rhos.append(np.take_along_axis(rho, best[..., None], axis=2)[..., 0])
        log_ps.append(log_p_max(z_best, len(options)) / LN10)
        theirs.append(np.array(options, dtype=object)[best])
        names += mine
        sizes += [key[2]] * len(mine)
        counts += [len(options)] * len(mine)
    if not names:
        return [([], None)] * refs
    rho_all, log_p_all = np.concatenate(rhos, axis=1), np.concatenate(log_ps, axis=1)
    their_all = np.concatenate(theirs, axis=1).tolist()
    combined = (_fisher(np.sort(log_p_all * LN10, axis=1)) / LN10).tolist()
    out = []
    for r in range(refs):
        row = (names, their_all[r], rho_all[r].tolist(), sizes, counts, log_p_all[r].tolist())
        evidence = list(map(MatrixEvidence, *row, [None] * len(names)))
        out.append((sorted(evidence, key=lambda e: e.log10_p), combined[r]))
    return out


def _reference(layout: Layout, roles: np.ndarray) -> Fingerprint:
    """A reference of the layout as conclude needs it: its records (the layout's) and its own position-free
    statistics; no samples or pair stacks (compared here already)."""
    assert layout.shell is not None
    ref = copy.copy(layout.shell)
    ref.role_values = np.array(roles, dtype=np.float64)
    return ref


def _invariants(cand: Fingerprint, plan: _Plan, roles: np.ndarray) -> list[dict[str, float | int | None]]:
    """lineage._invariants for each reference of the chunk."""
    a, b = plan.pairs
    refs = roles.shape[0]
    if not a.size:
        empty: dict[str, float | int | None] = {"matched": 0, "equal": 0}
        for name in ("std", "max_abs", "q99_abs", "sv_max"):
            empty[f"{name}_median_log_ratio"] = None
        return [dict(empty) for _ in range(refs)]
    d = np.abs(cand.role_values[a][None, :, :] - roles[:, b, :])
    with np.errstate(invalid="ignore"):
        equal = np.sum(np.all(d[:, :, :3] <= EXACT, axis=2), axis=1).tolist()
    medians = []
    for j in range(4):
        column = d[:, :, j]
        if not np.isnan(column).any():
            medians.append(np.median(column, axis=1).tolist())
            continue
        per = []
        for r in range(refs):
            kept = column[r][~np.isnan(column[r])]
            per.append(float(np.median(kept)) if kept.size else None)
        medians.append(per)
    out = []
    for r in range(refs):
        inv: dict[str, float | int | None] = {"matched": int(a.size), "equal": int(equal[r])}
        for j, name in enumerate(("std", "max_abs", "q99_abs", "sv_max")):
            inv[f"{name}_median_log_ratio"] = medians[j][r]
        out.append(inv)
    return out


def judge_packed(cand: Fingerprint, refs: Iterable[tuple[str, bytes | str | None]]) -> list[Judgement]:
    """Every reference's judgement, as judge_all(cand, [(label, its Fingerprint)]) gives, strongest first; each
    reference as its packed fingerprint (lineage_packed.pack), or the reason it has none (None: a row written
    before the fingerprint). `refs` may be a generator: at most CHUNK references' samples are held at a time."""
    judged: list[tuple[int, Judgement]] = []
    pending: dict[int, tuple[Layout, list[int], list[str], list[bytes]]] = {}
    plans: dict[int, tuple[Layout, _Plan]] = {}

    def flush(key: int) -> None:
        layout, positions, labels, blobs = pending.pop(key)
        if key not in plans:
            plans[key] = (layout, _plan(cand, layout))
        judged.extend(zip(positions, _judge_chunk(cand, layout, plans[key][1], labels, blobs), strict=True))

    for position, (label, blob) in enumerate(refs):
        if not isinstance(blob, bytes) or not blob:
            judged.append((position, judge(label, cand, blob or None)))
            continue
        layout = layout_in(blob)
        key = id(layout)
        pending.setdefault(key, (layout, [], [], []))
        _, positions, labels, blobs = pending[key]
        positions.append(position)
        labels.append(label)
        blobs.append(blob)
        if len(blobs) >= CHUNK:
            flush(key)
    for key in list(pending):
        flush(key)
    judged.sort(key=lambda item: item[0])
    return ranked(j for _, j in judged)
