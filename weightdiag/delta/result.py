"""The typed result of a diff (what `api.diff` returns and the CLI renders), and its JSON form.

Schema `weightdiag.diff/1`, documented in docs/diff-schema.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..fit.weibull import WeibullFit
from ..record.table import DataFrame
from .extremes import Extremes
from .forensics import Forensics
from .measures import Figures
from .spectrum import SKETCH_CAP, Spectrum

SCHEMA = "weightdiag.diff/1"


@dataclass
class DiffOptions:
    # Where the spectral sketch runs: auto, cpu, cuda, cuda:N; auto, as for fits (FitOptions.device), is the CPU
    # (weightdiag.reduce.device.resolve_device, the one place a device is chosen).
    device: str = "auto"
    include: Sequence[str] = ()  # only tensors (base names) matching one of these globs
    exclude: Sequence[str] = ()
    sketch: int = SKETCH_CAP  # k of the randomized range sketch (matrices wider than the gram_cols knob)
    seed: int = 0  # of the sketch's random test matrices
    spectrum: bool = True  # False: skip singular values and rank90 (the exact figures only)
    connections: int = 8  # ranged requests in flight per Hub side
    token: str | None = None
    workers: int | None = None  # blocks processed at once (default: the engine's thread count, at most 4)
    # "local" (this machine) or "ray": whole tensor pairs compared by tasks on the nodes of the Ray cluster at
    # ray_address, else RAY_ADDRESS (diff/cluster.py); the result is the same.
    executor: str = "local"
    ray_address: str | None = None
    # models the tuned one may be a merge of (`--parent`, repeatable): each diffed against the base, the tuned and
    # each other without the spectrum (run/parents.py), so that the verdict can name `merge` (delta/merge.py)
    parents: Sequence[str] = ()


def num(value: float | None) -> float | None:
    """JSON-safe float: NaN and infinities become null."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def cosine_cell(cosine: float | None) -> str:
    """The cosine as tables show it: "-" where it is undefined (a zero matrix)."""
    return "-" if cosine is None else f"{cosine:.6f}"


def _fit_json(fit: WeibullFit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    return {"k": num(fit.k), "lambda": num(fit.lam), "r2": num(fit.r2), "ok": fit.ok, "reason": fit.reason}


@dataclass(frozen=True)
class TensorDiff:
    """One paired tensor: its place in the model, its exact figures, its spectrum (matrices) and verdicts."""

    name: str
    tuned_name: str
    kind: str
    block: int | None
    shape: tuple[int, ...]
    base_dtype: str  # stored dtype (for a quantized side, its label: "FP8 e4m3, block 128x128")
    tuned_dtype: str
    figures: Figures
    spectrum: Spectrum | None
    untouched: bool
    low_rank: bool
    scaled: bool
    forensics: Forensics | None = None  # the subspace figures and counts (with the spectrum)
    extremes: Extremes | None = None  # the largest entries of each side: outliers and super weights

    @property
    def sqnr_db(self) -> float | None:
        """Signal to noise of the change read as noise: 10 log10(||W_base||^2 / ||ΔW||^2); None when ΔW = 0."""
        f = self.figures
        if f.delta_norm <= 0 or f.base_norm <= 0:
            return None
        return 20.0 * math.log10(f.base_norm / f.delta_norm)

    @property
    def relative_change(self) -> float:
        return self.figures.relative_change

    @property
    def rank90(self) -> int | None:
        return self.spectrum.rank90 if self.spectrum is not None else None

    def to_json(self) -> dict[str, Any]:
        f = self.figures
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "block": self.block,
            "shape": list(self.shape),
            "base_dtype": self.base_dtype,
            "tuned_dtype": self.tuned_dtype,
            "numel": f.numel,
            "relative_change": num(f.relative_change),
            "cosine": num(f.cosine),
            "unchanged_fraction": f.unchanged_fraction,
            "sign_flip_fraction": f.sign_flip_fraction,
            "rank90": self.rank90,
            "delta_norm": num(f.delta_norm),
            "base_norm": num(f.base_norm),
            "tuned_norm": num(f.tuned_norm),
            "alignment": num(f.alignment),
            "scale": num(f.scale),
            "nonfinite": f.nonfinite,
            "delta_abs_quantiles": {k: num(v) for k, v in f.delta_quantiles.items()},
            "ratio_quantiles": {k: num(v) for k, v in f.ratio_quantiles.items()},
            "delta_weibull": _fit_json(f.delta_fit),
            "base_weibull": _fit_json(f.base_fit),
            "tuned_weibull": _fit_json(f.tuned_fit),
            "delta_k": num(f.delta_k),
            "delta_lambda": num(f.delta_lambda),
            "spectrum": self.spectrum.to_json() if self.spectrum is not None else None,
            "untouched": self.untouched,
            "low_rank": self.low_rank,
            "scaled": self.scaled,
            "sqnr_db": num(self.sqnr_db),
            "forensics": self.forensics.to_json() if self.forensics is not None else None,
            "extremes": self.extremes.to_json() if self.extremes is not None else None,
        }
        if self.tuned_name != self.name:
            out["tuned_name"] = self.tuned_name
        return out


@dataclass(frozen=True)
class GroupSummary:
    """Matrices of one block or one kind together: energy-weighted relative change, how many untouched."""

    key: str  # "block 3", "q", "embed", ...
    matrices: int
    relative_change: float  # sqrt(Σ ||ΔW||^2 / Σ ||W_base||^2)
    max_relative_change: float
    untouched: int
    unchanged_fraction: float  # over all their elements
    low_rank: int

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "matrices": self.matrices,
            "relative_change": num(self.relative_change),
            "max_relative_change": num(self.max_relative_change),
            "untouched": self.untouched,
            "unchanged_fraction": self.unchanged_fraction,
            "low_rank": self.low_rank,
        }


@dataclass(frozen=True)
class Finding:
    code: str  # untouched | frozen-blocks | changed-most | low-rank | scaled | embeddings | nothing-changed | ...
    message: str  # one line for people
    names: tuple[str, ...] = ()  # the matrices or blocks it is about
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "names": list(self.names), "evidence": self.evidence}


@dataclass
class DiffResult:
    base: dict[str, Any]
    tuned: dict[str, Any]
    matrices: list[TensorDiff]
    vectors: list[TensorDiff]
    only_base: list[str]
    only_tuned: list[str]
    shape_mismatches: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    blocks: list[GroupSummary]
    kinds: list[GroupSummary]
    findings: list[Finding]
    totals: dict[str, Any]
    run: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    mechanism: Any = None  # delta.mechanism.Mechanism (the verdict and its evidence)
    damage: dict[str, Any] | None = None  # the model-level damage score (damage())
    export_lora: dict[str, Any] | None = None  # what --export-lora wrote (run/export_lora.py)
    survival: dict[str, Any] | None = None  # outliers, super weights, change of k and alpha (extremes.summary)

    def tensor_records(self, vectors: bool = False) -> list[dict[str, Any]]:
        """One flat record per matrix pair (and vector pair, with vectors), for tables: see tensor_records()."""
        return tensor_records(
            {"matrices": [m.to_json() for m in self.matrices], "vectors": [v.to_json() for v in self.vectors]}, vectors
        )

    def matrices_frame(self, vectors: bool = False) -> DataFrame:
        """The per-tensor records as a pandas DataFrame, one line per pair (docs/diff-schema.md's fields, nested
        ones joined by `_`: `base_weibull_k`, `spectrum_rank90`, `delta_abs_quantiles_q99`).

        Raises:
            MissingDependencyError: pandas is not installed (exit code 2).
        """
        from ..record.table import frame

        records = self.tensor_records(vectors)
        return frame(records, _columns(records))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "base": self.base,
            "tuned": self.tuned,
            "totals": self.totals,
            "findings": [f.to_json() for f in self.findings],
            "blocks": [b.to_json() for b in self.blocks],
            "kinds": [k.to_json() for k in self.kinds],
            "matrices": [m.to_json() for m in self.matrices],
            "vectors": [v.to_json() for v in self.vectors],
            "only_base": self.only_base,
            "only_tuned": self.only_tuned,
            "shape_mismatches": self.shape_mismatches,
            "skipped": self.skipped,
            "run": self.run,
            "notes": self.notes,
            "mechanism": self.mechanism.to_json() if self.mechanism is not None else None,
            "damage": self.damage,
            "survival": self.survival,
            **({"export_lora": self.export_lora} if self.export_lora is not None else {}),
        }


DAMAGE_RECIPE = (
    "score = sqrt(mean over matrices of (||ΔW||_F / ||W_base||_F)^2), each 2-D tensor with a non-zero base "
    "weighing the same; sqnr_db = -20 log10(score)"
)


def damage(matrices: Sequence[TensorDiff]) -> dict[str, Any]:
    """The model-level damage score: the root mean square of the matrices' relative errors (a quantized copy's
    noise against its base), and its SQNR; the worst matrices by SQNR."""
    rel = [(t.name, t.figures.relative_change) for t in matrices if t.figures.base_norm > 0]
    rel = [(n, r) for n, r in rel if math.isfinite(r)]
    if not rel:
        return {"score": None, "sqnr_db": None, "matrices": 0, "worst": [], "recipe": DAMAGE_RECIPE}
    score = math.sqrt(sum(r * r for _, r in rel) / len(rel))
    worst = sorted(rel, key=lambda x: -x[1])[:3]
    return {
        "score": score,
        "sqnr_db": -20 * math.log10(score) if score > 0 else None,
        "matrices": len(rel),
        "worst": [
            {"name": n, "relative_error": r, "sqnr_db": -20 * math.log10(r) if r > 0 else None} for n, r in worst
        ],
        "recipe": DAMAGE_RECIPE,
    }


def tensor_records(diff: dict[str, Any], vectors: bool = False) -> list[dict[str, Any]]:
    """A diff document's (DiffResult.to_json(), or a diff row of DATABASE/diffs/) per-tensor records, flat:
    nested objects' fields as `outer_inner` columns, `record` naming its list (matrix or vector)."""
    from ..record.table import flatten

    out = []
    for key, record in (("matrix", "matrices"), ("vector", "vectors")) if vectors else (("matrix", "matrices"),):
        for entry in diff.get(record) or []:
            flat = {"record": key, **flatten(entry)}
            for nested in ("spectrum", "delta_weibull", "base_weibull", "tuned_weibull"):
                if flat.get(nested, 0) is None:  # absent: its fields' columns are None
                    del flat[nested]
            out.append(flat)
    return out


def _columns(records: Sequence[dict[str, Any]]) -> list[str]:
    """Every key of the records, in the order first seen."""
    seen: dict[str, None] = {}
    for record in records:
        seen.update(dict.fromkeys(record))
    return list(seen)
