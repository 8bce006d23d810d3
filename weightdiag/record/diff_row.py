"""A diff row (schema `weightdiag.diff/1`, docs/diff-schema.md) as typed, frozen objects for library users
(issue 38): `DiffRow` and its per-tensor `TensorChange`s, made from the JSON by `from_json` (`DiffResult.to_json()`,
a file of DATABASE/diffs/) and giving the very document back with `to_json`. delta/result.py's DiffResult is the
diff as computed (with the figures' objects); this is the diff as stored, read back without computing anything."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import RowError

__all__ = ["DIFF_SCHEMA", "DiffRow", "TensorChange"]

DIFF_SCHEMA = "weightdiag.diff/1"


def _k(fit: object) -> float | None:
    return fit.get("k") if isinstance(fit, Mapping) else None


@dataclass(frozen=True)
class TensorChange:
    """One tensor pair of a diff (`matrices[]` or `vectors[]`).

    Attributes:
        name: the base's tensor name; tuned_name: the tuned side's (the same unless renamed).
        kind: its role (q, k, v, o, ffn_in, embed, norm, bias, ...); block: its block, None outside them.
        shape: its shape; base_dtype, tuned_dtype: as stored on each side; numel: its elements.
        relative_change: ||ΔW|| / ||W_base||; cosine: of W_base and W_tuned (None where undefined).
        rank90: singular values of ΔW holding 90% of its energy (None without the spectrum, or for a vector).
        base_k, tuned_k, delta_k: the Weibull k of |W_base|, |W_tuned| and its change; delta_lambda: lambda's.
        sqnr_db: 10 log10(||W_base||² / ||ΔW||²), None when nothing changed.
        untouched, low_rank, scaled: the pair's verdicts (docs/diff-schema.md).
        record: the diff's record itself (every field).
    """

    name: str
    tuned_name: str
    kind: str
    block: int | None
    shape: tuple[int, ...]
    base_dtype: str
    tuned_dtype: str
    numel: int
    relative_change: float | None
    cosine: float | None
    rank90: int | None
    base_k: float | None
    tuned_k: float | None
    delta_k: float | None
    delta_lambda: float | None
    sqnr_db: float | None
    untouched: bool
    low_rank: bool
    scaled: bool
    record: Mapping[str, Any] = field(repr=False, hash=False)

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> TensorChange:
        return cls(
            name=record["name"],
            tuned_name=record.get("tuned_name", record["name"]),
            kind=record["kind"],
            block=record.get("block"),
            shape=tuple(record["shape"]),
            base_dtype=record["base_dtype"],
            tuned_dtype=record["tuned_dtype"],
            numel=record["numel"],
            relative_change=record.get("relative_change"),
            cosine=record.get("cosine"),
            rank90=record.get("rank90"),
            base_k=_k(record.get("base_weibull")),
            tuned_k=_k(record.get("tuned_weibull")),
            delta_k=record.get("delta_k"),
            delta_lambda=record.get("delta_lambda"),
            sqnr_db=record.get("sqnr_db"),
            untouched=bool(record.get("untouched")),
            low_rank=bool(record.get("low_rank")),
            scaled=bool(record.get("scaled")),
            record=record,
        )


@dataclass(frozen=True)
class DiffRow:
    """A diff, as stored (`DiffRow.from_json(result.to_json())`, `DiffRow.read(path)`).

    Attributes:
        base, tuned: the two models' ids (`base.id`, `tuned.id`); base_revision, tuned_revision: their revisions.
        verdict: the mechanism's verdict (identical, quantized, lora, full_finetune, unsure, ...), None without one.
        relative_change: over every paired tensor (`totals.relative_change`).
        findings: the findings' codes, in order (untouched, changed-most, low-rank, ...).
        matrices, vectors: the tensor pairs, as TensorChange, in the diff's order.
        only_base, only_tuned: tensors on one side only.
    """

    schema: str
    base: str
    tuned: str
    base_revision: str | None
    tuned_revision: str | None
    verdict: str | None
    relative_change: float | None
    findings: tuple[str, ...]
    matrices: tuple[TensorChange, ...] = field(repr=False)
    vectors: tuple[TensorChange, ...] = field(repr=False)
    only_base: tuple[str, ...] = field(repr=False)
    only_tuned: tuple[str, ...] = field(repr=False)
    document: Mapping[str, Any] = field(repr=False, hash=False)

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> DiffRow:
        """The diff row `document` (left as it is: the view holds a copy).

        Raises:
            RowError: not a diff row of schema weightdiag.diff/1, or one lacking a field every diff has (exit
                code 2).
        """
        if not isinstance(document, Mapping) or document.get("schema") != DIFF_SCHEMA:
            schema = document.get("schema") if isinstance(document, Mapping) else None
            raise RowError(
                None,
                f"not a diff row (schema {schema!r}, not {DIFF_SCHEMA})",
                advice="give a diff row: DiffResult.to_json(), or a file of DATABASE/diffs/",
            )
        doc = copy.deepcopy(dict(document))
        try:
            mechanism = doc.get("mechanism") or {}
            return cls(
                schema=doc["schema"],
                base=doc["base"]["id"],
                tuned=doc["tuned"]["id"],
                base_revision=doc["base"].get("revision"),
                tuned_revision=doc["tuned"].get("revision"),
                verdict=mechanism.get("verdict"),
                relative_change=(doc.get("totals") or {}).get("relative_change"),
                findings=tuple(f["code"] for f in doc.get("findings") or []),
                matrices=tuple(TensorChange.of(m) for m in doc["matrices"]),
                vectors=tuple(TensorChange.of(v) for v in doc.get("vectors") or []),
                only_base=tuple(doc.get("only_base") or []),
                only_tuned=tuple(doc.get("only_tuned") or []),
                document=doc,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise RowError(
                None, f"damaged diff row ({type(exc).__name__}: {exc})", advice="write the diff again"
            ) from None

    @classmethod
    def read(cls, path: str | Path) -> DiffRow:
        """The diff row in the file `path` (DATABASE/diffs/...).

        Raises:
            RowError: the file cannot be read or is not a diff row (exit code 2).
        """
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise RowError(
                str(path), f"cannot read a diff row ({type(exc).__name__})", advice="give a diff row file"
            ) from None
        try:
            return cls.from_json(document)
        except RowError as error:
            raise RowError(str(path), error.problem, advice=error.advice) from None

    def to_json(self) -> dict[str, Any]:
        """The diff row: the document that was read."""
        return dict(self.document)
