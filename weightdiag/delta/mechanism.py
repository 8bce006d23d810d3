"""What was done to a model, from the diff's figures alone: a verdict naming the mechanism, with its evidence.

Pure rules over TensorDiffs (no I/O). Precision over recall: a verdict is named only when every changed tensor
agrees on it; mixed evidence is `unsure`. docs/forensics.md says what each verdict rests on and where it fails.

Each changed matrix is put in one class first (`matrix_class`):

- "cast": every element is the base's rounded to the tuned side's narrower float dtype (a re-store);
- "grid": its tuned rows hold at most GRID_LEVELS times the distinct values of the base's (values on a
  quantizer's few levels: an int4 group has 16 at most, FP8 256 codes per scale);
- "exact-low-rank": 99.9% of ||ΔW||^2 in at most min(64, 10% of min(m, n)) singular values (a merged LoRA's
  ΔW has rank r, up to its storage's rounding);
- "dense-principal": high-rank ΔW (rank999 beyond that cap), values as distinct as the base's, and at least
  PRINCIPAL_EXCESS times the share of ||ΔW||^2 in the base's top-16 singular subspace that an update without
  a preferred direction would put there: the signature of supervised fine-tuning (Zhu et al., "The Path Not
  Taken: RLVR Provably Learns Off the Principals", 2025, contrast SFT's updates along the principal
  directions with RL's off them);
- "dense-isotropic": high-rank ΔW with no preference for the principal subspace (noise, or an RL-style update:
  the two cannot be told apart from the weights here, so no verdict is drawn from it);
- "unclassified": figures missing (no spectrum, or a sketched ΔW whose rank999 the sketch neither pins nor
  bounds beyond the low-rank cap);
- "embedding": embeddings and output heads, and matrices under 16 wide: a fine-tune on few tokens or positions
  changes few of their rows, so their rank says nothing of the mechanism. They do not vote (the grid and cast
  classes aside, which hold for every matrix).

A verdict needs the voting matrices to agree: all of them for "lora" and "restored", AGREE (90%) for
"quantized", FINETUNE_AGREE (2/3) "dense-principal" and the rest "dense-isotropic" for "full_finetune" (a
fine-tune's attention value and output matrices were seen without a principal preference), with the spectrum
moved beyond what an RL-style update moves it (RL_DRIFT), and neither it nor "continued_pretraining" is named
when the token embedding's changed rows moved by sizes 30x apart (MIXED_SIZES: updates of different sizes
added, as a task-arithmetic merge adds a fine-tune's and a small RL update's); see docs/forensics.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .merge import MergeFit
from .result import TensorDiff

VERDICTS = (
    "identical",
    "restored",
    "quantized",
    "lora",
    "full_finetune",
    "rl_update",
    "continued_pretraining",
    "merge",
    "unsure",
)
GRID_LEVELS = 0.75  # a "grid" matrix: tuned rows with at most 75% of the base rows' distinct values
DISTINCT = 0.95  # a fine-tune or LoRA keeps at least 95% of them
PRINCIPAL_EXCESS = 1.5  # "dense-principal": ΔW's share in the base's top-k subspace >= 1.5x the isotropic k/dim
FINETUNE_AGREE = 2 / 3  # "full_finetune": this share of the voting matrices "dense-principal", none low-rank
SMALL = 16  # matrices narrower than this on either side do not vote (as findings.is_low_rank)
# A dense trained update (every voting matrix dense, norms trained) is told by its size, breadth and lean; the
# thresholds lie between the bench's pairs (benchmarks/RESULTS.md, "Issue 40"), with the margins said there.
SMALL_CHANGE = 0.002  # median relative change below: a small update (RL-style, or a short fine-tune)
RL_OFF = 0.5  # rl_update: ΔW's share in the base's top-16 subspace at most half an isotropic update's (median)
RL_DRIFT = 1e-3  # rl_update: top singular values moved at most this (Zhu et al.: minimal spectral drift)
# RL_DRIFT also bounds what is named a fine-tune: a dense update whose top singular values moved no more (median)
# is a short fine-tune or an RL-style update, not told apart (the causal LMs' RL runs moved them 0.0002-0.0006)
RL_SPARSE = 0.5  # rl_update: at least half the elements changed by less than BF16 resolves (2^-9 relative)
BROAD = 0.8  # this share of the input embedding's elements changed: nearly every token trained on
CPT_CHANGE = 0.2  # continued_pretraining: median relative change at least this
CPT_DRIFT = 0.1  # ... and the top-16 singular values moved at least this (median)
MIXED_SIZES = 30.0  # the token embedding's changed rows 30x apart (99th over 1st percentile): two updates added
NOISE_EDGE = 1.7  # quantized: no matrix's ΔW σ_1 above this over the noise edge (a quantizer's copies: <= 1.34)
AGREE = 0.9  # share of the changed matrices that must be in the verdict's class (the rest: "unclassified" only)
PLAIN = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


LEAD = {
    "full_finetune": ("dense_principal_share",),
    "continued_pretraining": ("broad_large_update", "embedding_rows_changed"),
    "rl_update": ("off_principal", "relative_change_median"),
}


@dataclass(frozen=True)
class Mechanism:
    verdict: str
    evidence: list[dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)  # format, rank, classes, per-block verdicts

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "evidence": self.evidence, **self.details}

    def line(self) -> str:
        """The text output's one line."""
        extra = ""
        if self.verdict == "lora" and "rank" in self.details:
            extra = f" (rank {self.details['rank']})"
        elif self.verdict == "quantized" and self.details.get("format"):
            extra = f" ({self.details['format']})"
        lead = LEAD.get(self.verdict, ())  # the verdict's deciding readings first
        first = sorted((e for e in self.evidence if e["signal"] in lead), key=lambda e: lead.index(e["signal"]))
        if self.verdict == "unsure" and self.evidence:  # the rules say why they stop last: that reading first
            first = [self.evidence[-1]]
        reasons = "; ".join(e["reading"] for e in [*first, *(e for e in self.evidence if e not in first)][:3])
        return f"mechanism: {self.verdict}{extra}: {reasons}"

    def blocks_line(self) -> str | None:
        """The blocks' verdicts where they differ from the model's, runs of blocks with one verdict joined."""
        blocks = self.details.get("blocks") or []
        runs: list[tuple[int, int, str]] = []
        for b in blocks:
            if runs and runs[-1][2] == b["verdict"] and runs[-1][1] == b["block"] - 1:
                runs[-1] = (runs[-1][0], b["block"], b["verdict"])
            else:
                runs.append((b["block"], b["block"], b["verdict"]))
        if not runs:
            return None
        return "by block: " + "; ".join(f"{a}{'' if a == z else f'-{z}'} {v}" for a, z, v in runs)


def _cap(t: TensorDiff) -> int:
    small = min(t.shape[0] if len(t.shape) else 1, t.shape[-1] if len(t.shape) else 1)
    return min(64, max(1, small // 10))


def matrix_class(t: TensorDiff) -> str:
    """One changed matrix's class (see the module docstring)."""
    f = t.forensics
    if f is None:
        return "unclassified"
    if f.cast_fraction == 1.0:
        return "cast"
    if (f.level_ratio is not None and f.level_ratio <= GRID_LEVELS) or f.integer_grid is not None:
        return "grid"
    if t.kind in ("embed", "unembed") or min(t.shape[0], t.shape[-1]) < SMALL:
        return "embedding"
    rank = t.spectrum.rank999 if t.spectrum is not None else None
    # the sketch's lower bound beyond the cap: dense, though rank999 itself is not pinned
    dense = rank is None and t.spectrum is not None and (t.spectrum.rank999_at_least or 0) > _cap(t)
    if (rank is None and not dense) or f.level_ratio is None or f.level_ratio < DISTINCT:
        return "unclassified"
    if rank is not None and 0 < rank <= _cap(t):
        return "exact-low-rank"
    if f.principal_energy is None or f.isotropic_energy is None:
        return "unclassified"
    if f.principal_energy >= PRINCIPAL_EXCESS * f.isotropic_energy:
        return "dense-principal"
    return "dense-isotropic"


def _quant_label(t: TensorDiff) -> str | None:
    return t.tuned_dtype if t.tuned_dtype not in PLAIN else None


def noise_excess(t: TensorDiff) -> float | None:
    """ΔW's largest singular value over the largest that rounding noise of its size reaches: the Marchenko-Pastur
    edge ||ΔW||_F (sqrt(m) + sqrt(n)) / sqrt(mn) of unstructured noise, or ΔW's largest row or column norm where
    that is more (a quantizer's scale set by an outlier puts its noise on that row or column, and σ_1 is at least
    the line's norm). About 1 for a quantizer's rounding; well above where a low-rank or trained change stands out
    of it. None without a spectrum and the line norms, or for a small or unchanged matrix."""
    if t.spectrum is None or not t.spectrum.singular or len(t.shape) < 2 or t.forensics is None:
        return None
    m, n = t.shape[0], t.shape[-1]
    if min(m, n) < SMALL or t.figures.delta_norm <= 0 or t.forensics.line_max is None:
        return None
    edge = max(t.figures.delta_norm * (math.sqrt(m) + math.sqrt(n)) / math.sqrt(m * n), t.forensics.line_max)
    return t.spectrum.singular[0] / edge


def _structured(voting: Sequence[TensorDiff], say: Any) -> bool:
    """Whether some matrix's change stands out of rounding noise (noise_excess above NOISE_EDGE); says so."""
    excess = [(x, t.name) for t in voting if (x := noise_excess(t)) is not None]
    above = [(x, name) for x, name in excess if x > NOISE_EDGE]
    if not above:
        return False
    top, name = max(above)
    say(
        "structured_change",
        len(above),
        f"{len(above)} of {len(excess)} matrices changed beyond rounding noise (ΔW's top singular value up to "
        f"{_x(top)} the noise edge, {name}): a change besides the quantizer's (a quantized copy of a fine-tuned "
        "or merged model?); diff against that model",
    )
    return True


def _copy_alone(
    changed_vectors: Sequence[TensorDiff], vectors_cast: bool, voting: Sequence[TensorDiff], say: Any
) -> bool:
    """Whether a quantized-looking change is a quantizer's copy alone: vectors untouched or only cast, and no matrix
    changed beyond rounding noise (_structured). Says why not."""
    if changed_vectors and not vectors_cast:
        say("vectors_changed", len(changed_vectors), "vectors changed too: not a quantizer's copy alone")
        return False
    return not _structured(voting, say)


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def _x(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}x"


def _median(values: Sequence[float]) -> float | None:
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


NORM_KEPT = 1e-5  # |‖W_tuned‖ / ‖W_base‖ - 1| below: the values moved, not changed (a permutation, a rotation)
MOVED = 0.05  # ... when the relative change is at least this


def judge(
    matrices: Sequence[TensorDiff],
    vectors: Sequence[TensorDiff],
    unpaired: int = 0,
    merge: Sequence[MergeFit] | None = None,
    footprint: float | None = None,
    spread: float | None = None,
) -> Mechanism:
    """The model's verdict (see the module docstring and docs/forensics.md). `unpaired`: tensors found on one side
    only or with another shape there: then no mechanism is named (a truncated model is not `identical`). `merge`:
    the per-tensor fits against the parents (delta/merge.py) when parents were given, else None. `footprint`,
    `spread`: the token embedding's (a block's verdict is given the model's), else read from `matrices`."""
    if footprint is None:
        footprint = embedding_footprint(matrices)
    if spread is None:
        spread = row_spread(matrices)
    found = _judge(matrices, vectors, merge, footprint, spread)
    if not unpaired or found.verdict == "unsure":
        return found
    reading = f"{unpaired} tensors on one side only or of another shape; the paired ones read as {found.verdict}"
    return Mechanism(
        "unsure",
        [*found.evidence, {"signal": "unpaired_tensors", "value": unpaired, "reading": reading}],
        found.details,
    )


MERGE_RESIDUAL = 0.05  # a tensor's change explained by the parents': at most 5% of its norm left
MERGE_SHARE = 0.05  # a parent counts in the merge when its median coefficient is at least this


def _merge(fits: Sequence[MergeFit], changed: int, say: Any) -> bool:
    """Whether the parents' changes explain the tuned's: AGREE of the changed tensors fitted to MERGE_RESIDUAL,
    by at least two parents. Says the evidence either way."""
    if not fits:
        say("parents", 0, "no changed tensor is in every parent: no merge fit")
        return False
    explained = [f for f in fits if f.residual <= MERGE_RESIDUAL]
    left = _median([f.residual for f in fits])
    coefficients = [
        _median([c for f in explained if math.isfinite(c := f.coefficients[i])]) or 0.0
        for i in range(len(fits[0].coefficients))
    ]  # each parent's over the tensors it changed
    shown = ", ".join(f"{c:.3g}" for c in coefficients)
    if len(explained) < AGREE * max(changed, len(fits)):
        say("merge_residual_median", left, f"the parents' changes leave {_g(left)} of the change unexplained")
        return False
    say("merge_coefficients", coefficients, f"the change is ({shown}) times the parents' changes")
    say(
        "merge_residual_median",
        left,
        f"{len(explained)} of {changed} changed tensors fitted, {_g(left)} of the change left (median)",
    )
    parents = sum(abs(c) >= MERGE_SHARE for c in coefficients)
    if parents < 2:
        say("merge_parents", parents, "but the change is one parent's alone: not a merge of them")
        return False
    return True


def _judge(
    matrices: Sequence[TensorDiff],
    vectors: Sequence[TensorDiff],
    merge: Sequence[MergeFit] | None,
    footprint: float | None,
    spread: float | None,
) -> Mechanism:
    everything = [*matrices, *vectors]
    changed = [t for t in everything if not t.untouched]
    changed_matrices = [t for t in matrices if not t.untouched and t.spectrum is not None]
    changed_vectors = [t for t in changed if t not in changed_matrices]
    renamed = sum(t.tuned_name != t.name for t in everything)
    recast = sum(t.base_dtype != t.tuned_dtype for t in everything)
    evidence: list[dict[str, Any]] = []

    def say(signal: str, value: Any, reading: str) -> None:
        evidence.append({"signal": signal, "value": value, "reading": reading})

    if not everything:
        return Mechanism("unsure", [{"signal": "tensors", "value": 0, "reading": "no tensor compared"}])
    if not changed:
        say("changed_tensors", 0, f"all {len(everything)} tensors equal in value")
        if renamed or recast:
            if renamed:
                say("renamed_tensors", renamed, f"{renamed} stored under other names")
            if recast:
                say("dtype_changed_tensors", recast, f"{recast} stored in another dtype")
            return Mechanism("restored", evidence)
        say("dtype_changed_tensors", 0, "same names and dtypes")
        return Mechanism("identical", evidence)

    if merge is not None and _merge(merge, len(changed), say):  # before the rest: a merge mixes their signatures
        coefficients = next(e["value"] for e in evidence if e["signal"] == "merge_coefficients")
        say("changed_tensors", len(changed), f"{len(changed)} of {len(everything)} tensors changed")
        return Mechanism("merge", evidence, {"coefficients": coefficients})
    if not changed_matrices and any(not t.untouched and t.spectrum is None for t in matrices):
        say("spectrum", None, "without the spectrum (--no-spectrum) only identical and re-stored copies are told")
        return Mechanism("unsure", evidence)
    norm_kept = [
        t
        for t in changed_matrices
        if t.figures.base_norm > 0
        and abs(t.figures.tuned_norm / t.figures.base_norm - 1.0) < NORM_KEPT
        and t.figures.relative_change >= MOVED
    ]
    if norm_kept:  # a fine-tune changes norms; a permutation of units or a rotation keeps them to the last digits
        say(
            "norm_kept_matrices",
            len(norm_kept),
            f"{len(norm_kept)} changed matrices keep their norm exactly: values "
            "moved, not changed (units permuted or rotated), which no mechanism here explains",
        )
        return Mechanism("unsure", evidence)

    every_class = {t.name: matrix_class(t) for t in changed_matrices}
    classes = Counter(every_class.values())
    details: dict[str, Any] = {"classes": dict(classes)}
    voting = [t for t in changed_matrices if every_class[t.name] != "embedding"]
    vectors_cast = all(t.forensics is not None and t.forensics.cast_fraction == 1.0 for t in changed_vectors)
    say("changed_tensors", len(changed), f"{len(changed)} of {len(everything)} tensors changed")

    def share(name: str) -> float:
        return classes[name] / len(voting) if voting else 0.0

    if changed_matrices and classes["cast"] == len(changed_matrices) and vectors_cast:
        say("cast_fraction", 1.0, "every changed element is the base's rounded to the tuned dtype")
        return Mechanism("restored", evidence, details)

    labels = {label for t in changed_matrices if (label := _quant_label(t))}
    levels = [t.forensics.level_ratio for t in changed_matrices if t.forensics and t.forensics.level_ratio is not None]
    untouched_vectors = sum(t.untouched for t in vectors)
    if labels and all(_quant_label(t) for t in changed_matrices):
        say("tuned_format", sorted(labels), "the tuned side is stored quantized")
        if not _copy_alone(changed_vectors, vectors_cast, voting, say):
            return Mechanism("unsure", evidence, details)
        return Mechanism("quantized", evidence, {**details, "format": ", ".join(sorted(labels))})
    if voting and share("grid") >= AGREE and share("grid") + share("unclassified") == 1.0:
        level = _median(levels)
        say("level_ratio_median", level, f"tuned rows hold {_g(level)} of the base's distinct values: a grid")
        say("vectors_untouched", untouched_vectors, f"{untouched_vectors} of {len(vectors)} vectors untouched")
        if not _copy_alone(changed_vectors, vectors_cast, voting, say):
            return Mechanism("unsure", evidence, details)
        grids = {t.forensics.grid for t in voting if t.forensics and every_class[t.name] == "grid"}
        codes = {t.forensics.integer_grid for t in voting if t.forensics and every_class[t.name] == "grid"}
        fmt = None
        if len(codes) == 1 and (code := next(iter(codes))) is not None:
            per = "row" if code[1] == 0 else f"{code[1]} elements of a row"
            fmt = f"dequantized int{code[0]}, a symmetric absmax scale per {per}"
            say("integer_grid", {"bits": code[0], "group": code[1]}, f"every grid matrix: {fmt}")
        elif len(grids) == 1 and (grid := next(iter(grids))) is not None:
            # grid_probe answers for the largest group with <= 16 levels: 2 bits in groups of 32 read as 4 in 128
            bits, group = grid
            fmt = f"dequantized, at most {2**bits} levels per {group} elements of a row ({bits} bits or fewer)"
            say("grid", {"bits": grid[0], "group": grid[1]}, f"every grid matrix: {fmt}")
        return Mechanism("quantized", evidence, {**details, "format": fmt})

    ranks = [t.spectrum.rank999 for t in voting if t.spectrum is not None and t.spectrum.rank999]
    intruders = [t.forensics.intruders for t in voting if t.forensics and t.forensics.intruders is not None]
    if voting and share("exact-low-rank") == 1.0:
        rank = Counter(ranks).most_common(1)[0][0] if ranks else None
        say("rank999", sorted(set(ranks)), f"99.9% of every ΔW's energy in at most {max(ranks)} directions")
        say("intruders", sum(intruders), f"{sum(intruders)} intruder dimensions among the top 10 of each")
        if changed_vectors or classes["embedding"]:
            what = f"{len(changed_vectors)} vectors and {classes['embedding']} embeddings or small matrices"
            say("others_changed", len(changed_vectors) + classes["embedding"], f"{what} changed too")
            return Mechanism("unsure", evidence, details)
        return Mechanism("lora", evidence, {**details, "rank": rank, "ranks": sorted(set(ranks))})

    energy = [
        t.forensics.principal_energy / t.forensics.isotropic_energy
        for t in voting
        if t.forensics and t.forensics.principal_energy is not None and t.forensics.isotropic_energy
    ]
    drift = [t.forensics.spectral_drift for t in voting if t.forensics and t.forensics.spectral_drift]
    overlap = [t.forensics.overlap for t in voting if t.forensics and t.forensics.overlap is not None]
    excess, moved, kept = _median(energy), _median(drift), _median(overlap)
    say("principal_energy_excess_median", excess, f"ΔW's share in the base's top-16 subspace {_x(excess)} k/dim")
    say("spectral_drift_median", moved, f"top-16 singular values moved {_g(moved)}")
    say("subspace_overlap_median", kept, f"top-16 subspace overlap {_g(kept)} (1: no rotation)")
    dense = share("dense-principal") + share("dense-isotropic")
    trained = [t for t in vectors if not t.untouched]  # norms and biases (not matrices without a spectrum)
    if not (voting and dense == 1.0 and trained):
        say("classes", dict(classes), "the changed matrices do not agree on one mechanism")
        return Mechanism("unsure", evidence, details)
    # every voting matrix dense and norms trained: a trained update; its size, breadth and lean tell which
    size = _median([t.figures.relative_change for t in voting]) or 0.0
    lean = share("dense-principal")
    say("relative_change_median", size, f"each ΔW {_g(size)} of its matrix (median)")
    # An RL-style update leaves the spectrum nearly where it was (Zhu et al.): an update that moved it no more is
    # not named a fine-tune, whatever its size (a small RL run that leans on the principal directions, as ours do,
    # is otherwise one)
    still = (moved or 0.0) <= RL_DRIFT
    if size < SMALL_CHANGE or still:
        near = _median([t.forensics.tolerance_fraction for t in voting if t.forensics]) or 0.0
        say("bf16_sparsity_median", near, f"{near:.0%} of the elements changed by less than BF16 resolves")
        if size < SMALL_CHANGE and excess is not None and excess <= RL_OFF and still and near >= RL_SPARSE:
            say("off_principal", excess, "the update avoids the base's principal directions (Zhu et al.)")
            say("vectors_changed", len(trained), "norms and biases trained too")
            return Mechanism("rl_update", evidence, details)
        what = (
            f"a dense update that barely moved the spectrum (top-16 singular values by {_g(moved)}, at most "
            f"{RL_DRIFT:g} as an RL-style update)"
            if still
            else f"a small dense update (under {SMALL_CHANGE:g} of each matrix)"
        )
        say(
            "small_update",
            size,
            f"{what}, not avoiding the base's principal directions ({_x(excess)} the isotropic share): a short "
            "fine-tune, an RL-style update or noise, not told apart",
        )
        return Mechanism("unsure", evidence, details)
    if footprint is not None:
        say("embedding_rows_changed", footprint, f"{footprint:.0%} of the token embedding changed")
    if spread is not None:
        say("embedding_row_spread", spread, f"the changed token rows moved {_x(spread)} apart (99th/1st percentile)")
    if spread is not None and spread >= MIXED_SIZES:
        # one run with Adam moves a row by about its learning rate for each step that sees the token (a token seen
        # once: about 30 steps' worth, as Adam's moments decay): rows further apart are updates of different sizes
        # added (task arithmetic of a fine-tune and a smaller update)
        say(
            "mixed_update_sizes",
            spread,
            f"the token rows that changed fall in sizes {_x(spread)} apart: updates of different sizes added "
            "together (a merge), not one training run; give the parents with --parent to tell",
        )
        return Mechanism("unsure", evidence, details)
    if footprint is not None and footprint >= BROAD:
        if size >= CPT_CHANGE and (moved or 0.0) >= CPT_DRIFT:
            say("broad_large_update", size, "every matrix and nearly every token's embedding moved, the spectrum too")
            return Mechanism("continued_pretraining", evidence, details)
        say(
            "broad_update",
            footprint,
            "nearly every token's embedding changed, but the change is moderate: continued pretraining, a merge "
            "or a fine-tune on broad data, not told apart",
        )
        return Mechanism("unsure", evidence, details)
    if lean >= FINETUNE_AGREE:
        say("dense_principal_share", lean, f"{lean:.0%} of the ΔW lean on the base's principal directions")
        say("vectors_changed", len(trained), "norms and biases trained too")
        return Mechanism("full_finetune", evidence, details)
    say("classes", dict(classes), "the changed matrices do not agree on one mechanism")
    return Mechanism("unsure", evidence, details)


def token_embedding(matrices: Sequence[TensorDiff]) -> TensorDiff | None:
    """The token embedding (BERT's, not its positions'; the largest input embedding where none is named so)."""
    embeds = [t for t in matrices if t.kind == "embed"]
    if not embeds:
        return None
    tokens = [t for t in embeds if any(word in t.name for word in TOKEN_EMBEDDINGS)] or embeds  # not positions
    return max(tokens, key=lambda t: t.figures.numel)


def embedding_footprint(matrices: Sequence[TensorDiff]) -> float | None:
    """The share of the token embedding's elements that changed: a fine-tune on a narrow task leaves the rows of
    the tokens it never saw alone; None without an embedding."""
    token = token_embedding(matrices)
    return None if token is None else 1.0 - token.figures.unchanged_fraction


def row_spread(matrices: Sequence[TensorDiff]) -> float | None:
    """The token embedding's changed rows' spread of relative change (delta/forensics.py; None: not measured)."""
    token = token_embedding(matrices)
    return None if token is None or token.forensics is None else token.forensics.row_spread


TOKEN_EMBEDDINGS = ("word_embeddings", "embed_tokens", "wte", "tok_embeddings", "token_embd")


def by_block(
    matrices: Sequence[TensorDiff],
    vectors: Sequence[TensorDiff],
    model: str,
    merge: Sequence[MergeFit] | None = None,
) -> list[dict[str, Any]]:
    """Each block's verdict by the same rules (with the model's embedding footprint: a block holds no embedding;
    and its own tensors' merge fits when parents were given), listed only where some block's differs from the
    model's."""
    keys = sorted({t.block for t in [*matrices, *vectors] if t.block is not None})
    footprint, spread = embedding_footprint(matrices), row_spread(matrices)
    out = []
    for key in keys:
        in_block = [t for t in matrices if t.block == key]
        block_vectors = [t for t in vectors if t.block == key]
        names = {t.name for t in [*in_block, *block_vectors]}
        fits = [f for f in merge if f.name in names] if merge is not None else None
        verdict = judge(in_block, block_vectors, merge=fits, footprint=footprint, spread=spread)
        out.append({"block": key, "verdict": verdict.verdict})
    return out if any(b["verdict"] != model for b in out) else []
