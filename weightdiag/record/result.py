"""Typed, frozen views of a row for library users (issue 38): `FitResult` (the model: identity, protocol, the
lambda axis, counts, per-kind summaries) and its `.matrices` as `MatrixFit`s. JSON stays at the edge: each view is
made from a row by `from_json` (which reads rows of every schema this weightdiag reads, old ones upgraded as
record.schema.load_row does) and gives the very row back with `to_json`, so `FitResult.from_json(r.to_json()) == r`
and a row written after the view was taken is the row before it. The code that builds rows is unchanged: it builds
the dict, and these read it.

Attribute names follow the row's (docs/row-schema.md), except where the row's is a Python keyword: `role` for
`class`, `lam` for `lambda`."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import KindSummary, MatrixRecord, Row, load_row, read_row

__all__ = ["FitResult", "KindFit", "MatrixFit"]


@dataclass(frozen=True)
class MatrixFit:
    """One matrix of the row (`matrices[]`): what it is, and its Weibull fit of |w| at the row's trim.

    Attributes:
        name: the tensor's name in the checkpoint (a record cut from a stored tensor: `<tensor>[...]`).
        kind: its role by name: q, k, v, o, qkv, gate, up, down, ffn_in, ffn_out, embed, other, ...
        role: the kind's class in the paper (the row's `class`): selection, transmission, embedding, other.
        block: the transformer block it belongs to; None outside the blocks (embeddings, head).
        expert: the mixture-of-experts expert; None for a dense matrix.
        shape: its shape as stored.
        dtype: its stored dtype (for a quantized weight, the format's label).
        k, lam, r2: the Weibull shape, scale and R² at the row's `protocol.trim`; None where the fit failed.
        alpha: the power-law exponent of its eigenvalue spectrum (`fit --spectrum`); None without a spectrum.
        parts: the kinds of a fused matrix's parts (q, k, v of a qkv), in order; empty for an unfused one.
        record: the row's record itself (every field, docs/row-schema.md).
    """

    name: str
    kind: str
    role: str
    block: int | None
    expert: int | None
    shape: tuple[int, ...]
    dtype: str
    k: float | None
    lam: float | None
    r2: float | None
    alpha: float | None
    parts: tuple[str, ...]
    record: MatrixRecord = field(repr=False, hash=False)

    @classmethod
    def of(cls, record: MatrixRecord, trim: str) -> MatrixFit:
        """The view of one `matrices[]` record of a row whose `protocol.trim` is `trim`."""
        fit = record["fits"].get(trim)
        spectrum = record.get("spectrum")
        return cls(
            name=record["name"],
            kind=record["kind"],
            role=record["class"],
            block=record["block"],
            expert=record["expert"],
            shape=tuple(record["shape"]),
            dtype=record["dtype"],
            k=fit["k"] if fit else None,
            lam=fit["lambda"] if fit else None,
            r2=fit["r2"] if fit else None,
            alpha=spectrum["alpha"] if spectrum else None,
            parts=tuple(part["kind"] for part in record.get("parts", [])),
            record=record,
        )


@dataclass(frozen=True)
class KindFit:
    """A kind's summary (`kinds.<kind>`): the medians over its matrices at the row's trim.

    Attributes:
        kind: the kind (q, k, v, o, ffn_in, ...).
        role: its class in the paper (selection, transmission, embedding, other); None in a few cohort rows.
        count: its matrices; fitted: those whose fit succeeded.
        k_median, lambda_median, r2_median: the medians of k, lambda and R² over the fitted ones.
        k_min, k_max: the range of k.
        k_class: what its median k says (transmission, selection-mild, selection-deep, non-weibull); None where
            withheld (quantized matrices).
        flags: the summary's flags (docs/row-schema.md).
    """

    kind: str
    role: str | None
    count: int | None
    fitted: int | None
    k_median: float | None
    lambda_median: float | None
    r2_median: float | None
    k_min: float | None
    k_max: float | None
    k_class: str | None
    flags: tuple[str, ...]

    @classmethod
    def of(cls, kind: str, summary: KindSummary) -> KindFit:
        return cls(
            kind=kind,
            role=summary["class"],
            count=summary["count"],
            fitted=summary["fitted"],
            k_median=summary["k_median"],
            lambda_median=summary["lambda_median"],
            r2_median=summary["r2_median"],
            k_min=summary["k_min"],
            k_max=summary["k_max"],
            k_class=summary["k_class"],
            flags=tuple(summary["flags"]),
        )


@dataclass(frozen=True)
class FitResult:
    """A fitted model, as its row says (`wd.fit(...).result`, `FitResult.from_json(row)`, `FitResult.read(path)`).

    Attributes:
        id: `<model>@<revision>`, as `weightdiag db list` and `compare` name the row (the model alone without a
            revision).
        model: the model's id (`model.id`): a Hub id ORG/NAME or a local name.
        revision: the Hub revision, or a local fingerprint (`local-<hash>`); None for a cohort entry.
        source: where the weights came from: local, hub, cohort.
        schema: the row's schema (weightdiag.row/1; weightdiag.row/2 with spectra).
        protocol: the fitting protocol (hist1024 or exact); trim: the trim of the summaries (mid80, ...).
        kinds: the per-kind summaries by kind, in the row's order: the Weibull k and lambda medians, the class.
        t_over_tau: the model's position on the paper's lambda axis (training steps over the AdamW time constant
            1/(lr·weight_decay)); None when the hyper-parameters are unknown.
        training_state: what that position says (`hyperparameters.state`): e.g. early, equilibrium, unknown.
        n_matrices, n_vectors, n_skipped: the counts of `matrices`, `vectors` and `skipped`.
        matrices: the matrices, as MatrixFit, in the row's order.
    """

    id: str
    model: str
    revision: str | None
    source: str
    schema: str
    protocol: str
    trim: str
    kinds: Mapping[str, KindFit] = field(hash=False)
    t_over_tau: float | None
    training_state: str | None
    n_matrices: int
    n_vectors: int
    n_skipped: int
    matrices: tuple[MatrixFit, ...] = field(repr=False)
    row: Row = field(repr=False, hash=False)  # the row itself: to_json() gives it back

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> FitResult:
        """The result of a row as written to DATABASE/rows/ or printed by `fit --json`, of any schema this
        weightdiag reads (older rows upgraded on reading, as `weightdiag db show` reads them); `document` itself is
        left as it is.

        Raises:
            RowError: `document` is not a row this weightdiag reads (exit code 2), naming the first bad field.
        """
        row = load_row(copy.deepcopy(dict(document)))
        model = row["model"]
        revision = model.get("revision") or model.get("fingerprint")
        hyper = row.get("hyperparameters") or {}
        trim = row["protocol"]["trim"]
        return cls(
            id=f"{model['id']}@{revision}" if revision else model["id"],
            model=model["id"],
            revision=revision,
            source=model["source"],
            schema=row["schema"],
            protocol=row["protocol"]["name"],
            trim=trim,
            kinds={kind: KindFit.of(kind, summary) for kind, summary in row["kinds"].items()},
            t_over_tau=hyper.get("t_over_tau"),
            training_state=hyper.get("state"),
            n_matrices=len(row["matrices"]),
            n_vectors=len(row["vectors"]),
            n_skipped=len(row["skipped"]),
            matrices=tuple(MatrixFit.of(record, trim) for record in row["matrices"]),
            row=row,
        )

    @classmethod
    def read(cls, path: str | Path) -> FitResult:
        """The result of the row in the file `path`.

        Raises:
            RowError: the file is not a readable row (exit code 2).
        """
        return cls.from_json(read_row(path))

    def to_json(self) -> Row:
        """The row: the dict that was read (upgraded where it was older), as `fit --json` prints it."""
        return self.row

    def matrix(self, name: str) -> MatrixFit:
        """The matrix named `name`; KeyError when the row has none of that name."""
        for matrix in self.matrices:
            if matrix.name == name:
                return matrix
        raise KeyError(name)
