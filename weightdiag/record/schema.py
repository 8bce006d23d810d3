"""The row's types, and the one loader that checks a document against them.

A row (schema `weightdiag.row/1`, or `weightdiag.row/2` when it holds spectra; documented field by field in
docs/row-schema.md) is plain JSON on disk and a plain dict in memory: the types below are TypedDicts, so
typing a row changes nothing that is written or read. Each class names its section of docs/row-schema.md.

The types are the row's one declaration: `load_row(doc)`, the only place that decides whether a
document is a row, checks it with checks derived from them (`check_of`), and docs/row-schema.md's field
reference is generated from them (tests/row_fields.py). It checks every required field, which readers
index (`model.id`, `model.source`, `protocol.name`, `kinds.*.k_median`, `matrices[].fits.<trim>.k`, ...),
and the type of every declared field that is present, and raises `RowError` naming the file and the field
otherwise. Fields added after the first version (`files[].verified`, `run.verification`,
`stats.distinct_values`, ...) are optional, so rows written by every earlier version and the shipped
cohort rows load unchanged; fields it does not know are kept as they are (adding fields does not bump the
schema). The row is returned as given: nothing is filled in or rewritten.

`read_row(path)` opens a row file (regular files only: a FIFO or a device named `*.json` is refused
without being opened for a blocking read) and hands its JSON to `load_row`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Any, TypedDict, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

from ..errors import BadInputError
from ..source.regular import kind_of

SCHEMA = "weightdiag.row/1"  # a row without spectra: as every earlier version wrote it, byte for byte
# A row with spectra (`fit --spectrum`: matrices[].spectrum, spectrum_kinds, run.spectrum). Only those rows
# carry the new version, so that the rows of a plain fit stay readable by every earlier weightdiag, and one
# that cannot show spectra refuses a row that has them rather than dropping them without a word.
SCHEMA_SPECTRUM = "weightdiag.row/2"
READ_SCHEMAS = (SCHEMA, SCHEMA_SPECTRUM)
SCHEMA_PREFIX = "weightdiag.row/"
DIFF_SCHEMA_PREFIX = "weightdiag.diff/"  # delta.result's rows (DATABASE/diffs/): named where a row is wanted, said
MAX_ROW_BYTES = 1 << 31  # a row of a 1000-layer MoE is tens of MB; anything near this is not a row


class RowError(BadInputError):
    """A file or document that is not a readable weightdiag row (exit code 2).

    `file` is where the row came from (None for a document given in memory), `field` the dotted path
    of the first bad field (`model.source`, `matrices[3].fits.mid80.k`; None when the whole file is
    unreadable), `problem` what is wrong with it, and `model_id` the row's `model.id` when that much
    could be read (so a damaged row named by its id can be refused rather than reported missing).
    """

    field_names = ("file", "field", "problem", "model_id")

    def __init__(
        self,
        file: str | None,
        problem: str,
        field: str | None = None,
        model_id: str | None = None,
        advice: str = "refit the model or remove the file",
    ) -> None:
        self.file = file
        self.field = field
        self.problem = problem
        self.model_id = model_id
        self.advice = advice
        where = f"{file}: " if file else ""
        what = f"damaged weightdiag row: field '{field}' {problem}" if field else problem
        self.summary = f"{where}{what}"  # the message without the advice (for warnings about skipped rows)
        super().__init__(f"{self.summary}; {advice}")


# --- the types (docs/row-schema.md) ---------------------------------------------------------------------
# Required keys (the *Required bases) are the ones every version of weightdiag wrote and readers index;
# the rest are optional (total=False): added later, or written only for some models. Keys that are Python
# keywords ('class', 'lambda') need TypedDict's functional form.


class _ModelRequired(TypedDict):
    id: str
    source: str  # local, hub, cohort


class ModelInfo(_ModelRequired, total=False):
    """`model`: the identity of the row."""

    location: str | None
    revision: str | None
    commit: str | None
    fingerprint: str | None
    format: str | None
    cohort: str | None  # cohort rows (source "cohort") only, where it is a string; as are the three below
    hub_repo: str | None
    family_name: str | None
    size: str | None


class FileRecord(TypedDict, total=False):
    """`files[]`: one per shard."""

    name: str
    size: int | None
    sha256: str | None
    header_sha256: str | None
    verified: bool


class _ProtocolRequired(TypedDict):
    name: str  # hist1024 or exact
    trim: str  # the trim of `kinds`: mid80, mid90 or full


class ProtocolInfo(_ProtocolRequired, total=False):
    """`protocol`: how the fits were made."""

    trims: list[str]
    centered: bool  # fits of |w - mean| (--center); false or absent: of |w|, as the cohort
    bins: int
    log10_range: list[float]
    plotting_positions: str


class ToolInfo(TypedDict, total=False):
    name: str
    version: str | None


class _ResumedRequired(TypedDict):
    tensors: int
    bytes: int


class ResumedInfo(_ResumedRequired, total=False):
    """`run.resumed`: the tensors (and their stored bytes) whose records came from the interrupted fit."""

    since: str | None  # when the interrupted fit started


class ClusterNode(TypedDict):
    """`run.cluster.nodes[]`: one node of the cluster and what it read."""

    node: str  # as Ray names it: "node ADDRESS (first 8 hex digits of its id)"
    tasks: int
    bytes: int  # tensor bytes of the chunks its tasks reduced
    seconds: float  # its tasks' time, added up


class ClusterInfo(TypedDict):
    """`run.cluster`: how a fit with --executor ray was spread (run metadata: the rest of the row is the same)."""

    executor: str  # "ray"
    tasks: int
    nodes: list[ClusterNode]


class _SpectrumRunRequired(TypedDict):
    seconds: float | None
    matrices: int


class SpectrumSolver(TypedDict, total=False):
    """`run.spectrum.solver`: how the eigenvalues were solved (reduce/gram_torch.py choose_solver)."""

    solver: str  # lapack (numpy/scipy on the CPU); batched or each (torch.linalg.eigvalsh on a device)
    why: str
    torch: str  # the torch build (a device only)
    cuda: str | None  # its CUDA version (a device only)


class SpectrumRun(_SpectrumRunRequired, total=False):
    """`run.spectrum`: the spectrum pass of `fit --spectrum` (a second read of the matrices after the fits)."""

    device: str  # where the Gram products and eigensolves ran: cpu, or cuda[:N] (torch)
    solver: SpectrumSolver
    farms: bool  # FARMS' windows taken too (--farms)


class RunInfo(TypedDict, total=False):
    """`run`: where and how long the fit ran."""

    device: str
    device_choice: str  # what --device asked for, where each pass ran and why (execution.py)
    seconds: float | None
    bytes_read: int | None
    include: list[str]
    exclude: list[str]
    verification: str
    resumed: ResumedInfo  # present when this fit reused an interrupted fit's records (weightdiag.record.journal)
    cluster: ClusterInfo  # present when the chunks were reduced on a Ray cluster (fit --executor ray)
    spectrum: SpectrumRun  # present when the fit took the spectra (--spectrum)


_KindSummaryRequired = TypedDict(
    "_KindSummaryRequired",
    {
        "class": str | None,  # selection, transmission, embedding, other
        "count": int | None,
        "fitted": int | None,
        "k_median": float | None,
        "lambda_median": float | None,
        "r2_median": float | None,
        "r2_below_95": int | None,  # how many of the `fitted` fits have R² < 0.95 (rows before: "a/b", upgraded)
        "k_min": float | None,
        "k_max": float | None,
        "k_class": str | None,  # transmission, selection-mild, selection-deep, non-weibull
        "flags": list[str],
    },
)


class KindSummary(_KindSummaryRequired, total=False):
    """`kinds.<kind>` and `part_kinds.<kind>`: medians over blocks (and experts) at `protocol.trim`."""

    k_class_withheld: str | None  # why k_class is None: the kind's matrices are quantized


FitRecord = TypedDict(
    "FitRecord",
    {
        "k": float | None,
        "lambda": float | None,
        "r2": float | None,
        "ks": float | None,
        "points": int,
        "ok": bool,
        "reason": str | None,
    },
)
"""`matrices[].fits.<trim>`: one Weibull fit (NaN is stored as null)."""


class _StatsRequired(TypedDict):
    numel: int
    n_finite: int
    n_nan: int
    n_inf: int
    zero_fraction: float | None
    mean: float | None
    std: float | None
    excess_kurtosis: float | None
    mean_abs: float | None
    std_abs: float | None
    max_abs: float | None
    q99_abs: float | None
    max_over_q99: float | None


class StatsRecord(_StatsRequired, total=False):
    """`matrices[].stats`: moments and counts of the weights (NaN/Inf stored as null)."""

    distinct_values: int


class Heaviness(TypedDict):
    """`matrices[].heaviness`: distribution-free tail metrics of nonzero |w|."""

    q90_q10: float | None
    q99_q50: float | None
    p999_p50: float | None
    gini: float | None


class _EsdRequired(TypedDict):
    log10_range: list[float]  # [lo, hi]: log10 of the smallest and largest eigenvalue above 1e-5
    counts: list[int]  # eigenvalues in each of len(counts) equal bins of log10 λ over log10_range
    below: int  # eigenvalues at or below 1e-5 (outside the bins, as they are outside the power-law fit)


class EsdHistogram(_EsdRequired):
    """`matrices[].spectrum.esd`: the empirical spectral density as counts on log-spaced bins (for plots)."""


class _SpectrumRequired(TypedDict):
    rows: int
    cols: int
    N: int
    M: int
    Q: float
    num_evals: int
    lambda_max: float | None
    sv_max: float | None
    sv_min: float | None
    norm: float | None
    log_norm: float | None
    spectral_norm: float | None
    log_spectral_norm: float | None
    stable_rank: float | None
    matrix_rank: int
    rank_loss: int
    weak_rank_loss: int
    entropy: float | None
    alpha: float | None
    alpha_weighted: float | None
    log_alpha_norm: float | None
    xmin: float | None
    xmax: float | None
    D: float | None
    sigma: float | None
    num_pl_spikes: int
    status: str
    warning: str
    num_spikes: int
    sigma_mp: float | None
    mp_softrank: float | None
    bulk_min: float | None
    bulk_max: float | None
    W_scale: float | None
    esd: EsdHistogram


class SpectrumRecord(_SpectrumRequired, total=False):
    """`matrices[].spectrum`, `matrices[].parts[].spectrum`: WeightWatcher 0.7.7's columns of one matrix
    (weightdiag.fit.esd.SpectrumFit, docs/spectrum.md), with FARMS' alpha under --farms."""

    alpha_farms: float | None
    farms_xmin: float | None
    farms_D: float | None
    farms_num_evals: int | None
    farms_windows: int | None


class _PartRequired(TypedDict):
    kind: str
    numel: int
    stats: StatsRecord
    argmax: list[int] | None
    fits: dict[str, FitRecord]
    heaviness: Heaviness
    gamma_closure: float | None


class PartRecord(_PartRequired, total=False):
    """`matrices[].parts[]`: one part of a fused matrix (q/k/v of qkv, gate/up of gate_up)."""

    spectrum: SpectrumRecord  # --spectrum: the part's own spectrum
    spectrum_skipped: str  # --spectrum: why the part has none


_MatrixRequired = TypedDict(
    "_MatrixRequired",
    {
        "name": str,
        "block": int | None,
        "expert": int | None,
        "kind": str,  # q k v o qkv gate up down ffn_in ffn_out embed unembed other
        "class": str,  # selection, transmission, embedding, other
        "dtype": str,
        "shape": list[int],
        "numel": int,
        "stats": StatsRecord,
        "argmax": list[int] | None,
        "fits": dict[str, FitRecord],
        "heaviness": Heaviness,
        "gamma_closure": float | None,
    },
)


class SliceOf(TypedDict):
    """`matrices[].slice_of` / `vectors[].slice_of`: the stored tensor a record was cut from, and which of its
    flat elements (a quantized weight's logical ones): `count` runs of `length`, `stride` apart, from `offset`."""

    tensor: str
    segments: list[int]  # [offset, length, stride, count]


class _DequantizedRequired(TypedDict):
    format: str
    method: str
    bits: int
    label: str
    arithmetic: str


class DequantizedRecord(_DequantizedRequired, total=False):
    """`matrices[].dequantized`: a quantized weight's format and the arithmetic its values came from."""

    source: str
    block: list[int]
    group: int
    stored: dict[str, str]  # role -> stored tensor name (codes, scale, zero, ...)


class GridInfo(TypedDict):
    """`matrices[].grid`: float values on a quantization grid (dequantized, then saved)."""

    bits: int
    group: int


class MatrixRecord(_MatrixRequired, total=False):
    """`matrices[]`: one fitted tensor of 2 or more dimensions."""

    fitted_dtype: str
    quantization: str
    note: str
    spectrum: SpectrumRecord  # --spectrum (row schema weightdiag.row/2)
    spectrum_skipped: str  # --spectrum: why this matrix has no spectrum (a tensor of 3+ dims, non-finite values)
    parts: list[PartRecord]
    parts_note: str
    dequantized: DequantizedRecord
    grid: GridInfo
    tower: str  # vision/audio tower or multimodal projector (vision_tower, visual, ...); kind is then "other"
    tower_kind: str | None  # what the tensor does inside its tower (q, o, qkv, ffn_in, embed, other, ...)
    slice_of: SliceOf  # a record cut from a stored tensor (an expert of fused experts, MLA's k or v rows)


class _VectorRequired(TypedDict):
    name: str
    block: int | None
    expert: int | None
    kind: str  # norm, bias, other
    param: str | None
    dtype: str
    numel: int
    n_nonfinite: int
    l2: float | None
    mean: float | None
    std: float | None
    min: float | None
    max: float | None


class VectorRecord(_VectorRequired, total=False):
    """`vectors[]`: one 1-D float tensor."""

    site: str
    of_kind: str
    note: str
    fitted_dtype: str
    quantization: str
    l2_over_sqrt_d: float | None
    offset_applied: float
    tower: str
    tower_kind: str | None
    slice_of: SliceOf


class SkippedRecord(TypedDict, total=False):
    """`skipped[]`: a tensor that was not fitted, and why."""

    name: str
    dtype: str
    shape: list[int]
    reason: str


class SpectrumKindSummary(TypedDict):
    """`spectrum_kinds.<kind>`: alpha over the kind's matrices that have a spectrum (blocks and experts)."""

    count: int  # matrices of the kind with a spectrum
    fitted: int  # ... whose power-law fit succeeded
    alpha_median: float | None
    alpha_min: float | None
    alpha_max: float | None
    below_band: int  # alpha < 2 (WeightWatcher's 'over-trained')
    above_band: int  # alpha > 6 ('under-trained')
    num_spikes_median: float | None
    alpha_farms_median: float | None  # --farms only; null otherwise


class _LineageSampleRequired(TypedDict):
    scale: float  # the samples' root mean square
    values: str


class LineageSample(_LineageSampleRequired, total=False):
    """One matrix's lineage samples (docs/lineage.md): float16 little-endian of value / scale, base64; and, for a
    matrix indexed by hidden units, twice the average ranks of its pair cosines (reduce/pairs.py), uint8, base64."""

    pairs: str


class LineageInfo(TypedDict):
    """The row's lineage fingerprint (issue 39): values at fixed positions of each matrix (reduce/sample.py)."""

    method: str  # weightdiag.lineage/1
    seed: int
    k: int  # samples of each matrix (fewer where a matrix has fewer entries)
    matrices: dict[str, LineageSample]  # by matrix record name


class _RowRequired(TypedDict):
    schema: str
    model: ModelInfo
    protocol: ProtocolInfo
    kinds: dict[str, KindSummary]
    part_kinds: dict[str, KindSummary]
    matrices: list[MatrixRecord]
    vectors: list[VectorRecord]
    skipped: list[SkippedRecord]
    unclassified: list[str]


class Row(_RowRequired, total=False):
    """One row: a model (and revision) fitted under one protocol, or a shipped cohort entry."""

    files: list[FileRecord]
    metadata: dict[str, Any] | None
    architecture: dict[str, Any] | None  # ArchInfo.to_json() plus `attention`; cohort rows carry a few keys
    tool: ToolInfo | None
    created: str | None
    run: RunInfo | None
    hyperparameters: dict[str, Any] | None  # lambda_axis resolution: lr, weight_decay, steps, t_over_tau, state
    spectrum_kinds: dict[str, SpectrumKindSummary]  # --spectrum: per matrix kind (diagnose.spectrum)
    notes: list[str]
    duplicate_of: str | None  # sweep: the revision whose identical files this row copies
    provenance: dict[str, Any] | None  # cohort rows: paper, license, copyright, source file and line
    shallow_ffn: dict[str, Any] | None  # cohort rows: the paper's shallow/deep FFN regime
    lineage: LineageInfo  # the lineage fingerprint (issue 39); absent from older rows and cohort rows


# --- the checks, derived from the types ------------------------------------------------------------------
# Each type above becomes a check, built once at import: a TypedDict checks its required keys (missing: "is
# missing") and then its optional keys where present, each in declaration order, and leaves keys it does not
# declare alone; `T | None` also takes null; list[T] and dict[str, T] check every element; `Any` takes
# anything. The first bad field raises _Bad with its dotted path (`matrices[3].fits.mid80.k`).


class _Bad(Exception):
    """A field that fails its check: the dotted path and what is wrong (turned into RowError by load_row)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field
        self.problem = problem


Check = Callable[[object, str], None]

_JSON_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "true or false",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def _describe(value: object) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _is_num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The JSON scalars: a float field takes any JSON number (10.0 may be written as 10), an int field an integer;
# true and false are neither (bool is an int subclass in Python).
_SCALARS: dict[type, tuple[Callable[[object], bool], str]] = {
    str: (lambda v: isinstance(v, str), "a string"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (_is_num, "a number"),
}


def _or_null(expected: str, nullable: bool) -> str:
    return f"{expected} or null" if nullable else expected


def _type_check(test: Callable[[object], bool], expected: str, nullable: bool = False) -> Check:
    def check(value: object, where: str) -> None:
        if (value is None and nullable) or test(value):
            return
        raise _Bad(where, f"is {_describe(value)}, expected {_or_null(expected, nullable)}")

    return check


def _anything(value: object, where: str) -> None:
    """The check of `Any`: every value (a free-form object's members)."""


def _list_of(item: Check, nullable: bool = False) -> Check:
    def check(value: object, where: str) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, list):
            raise _Bad(where, f"is {_describe(value)}, expected {_or_null('a list', nullable)}")
        if item is not _anything:
            for i, element in enumerate(value):
                item(element, f"{where}[{i}]")

    return check


def _map_of(item: Check, nullable: bool = False) -> Check:
    def check(value: object, where: str) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, dict):
            raise _Bad(where, f"is {_describe(value)}, expected {_or_null('an object', nullable)}")
        if item is not _anything:
            for key, element in value.items():
                item(element, f"{where}.{key}")

    return check


def _record(required: Mapping[str, Check], optional: Mapping[str, Check], nullable: bool = False) -> Check:
    """An object with these required and optional fields (others are allowed and not checked)."""

    def check(value: object, where: str) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, dict):
            raise _Bad(where, f"is {_describe(value)}, expected {_or_null('an object', nullable)}")
        prefix = f"{where}." if where else ""
        for key, field_check in required.items():
            if key not in value:
                raise _Bad(f"{prefix}{key}", "is missing")
            field_check(value[key], f"{prefix}{key}")
        for key, field_check in optional.items():
            if key in value:
                field_check(value[key], f"{prefix}{key}")

    return check


def _nullable(tp: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None`, (tp, False) for anything else; other unions are not JSON types of a row."""
    if get_origin(tp) not in (Union, UnionType):
        return tp, False
    rest = [a for a in get_args(tp) if a is not type(None)]
    if len(rest) != 1:
        raise TypeError(f"row field type {tp}: only T or T | None can be checked")
    return rest[0], len(rest) < len(get_args(tp))


def fields_of(typed: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """The required and the optional fields of a TypedDict, each {name: type} in declaration order."""
    hints = get_type_hints(typed)
    required = {k: t for k, t in hints.items() if k in typed.__required_keys__}  # type: ignore[attr-defined]
    return required, {k: t for k, t in hints.items() if k not in required}


_CHECKS: dict[tuple[Any, bool], Check] = {}


def check_of(tp: Any) -> Check:
    """The check of a value of type `tp`: a TypedDict, list[...], dict[str, ...], a JSON scalar (str, bool,
    int, float), each possibly `| None`, or Any (every value)."""
    tp, nullable = _nullable(tp)
    key = (tp, nullable)
    if key not in _CHECKS:
        _CHECKS[key] = _derive(tp, nullable)
    return _CHECKS[key]


def _derive(tp: Any, nullable: bool) -> Check:
    if tp is Any:
        return _anything
    if is_typeddict(tp):
        required, optional = fields_of(tp)
        return _record(
            {k: check_of(t) for k, t in required.items()}, {k: check_of(t) for k, t in optional.items()}, nullable
        )
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return _list_of(check_of(args[0]), nullable)
    if origin is dict and args[0] is str:
        return _map_of(check_of(args[1]), nullable)
    if tp in _SCALARS:
        return _type_check(*_SCALARS[tp], nullable=nullable)
    raise TypeError(f"row field type {tp}: not a JSON type weightdiag.record.schema can check")


ROW = check_of(Row)


def problem_of(tp: Any, value: object, where: str) -> str | None:
    """What is wrong with `value` as a part of a row of type `tp` (MatrixRecord, VectorRecord, ...), in the words
    load_row uses (`field 'matrices[0].stats' is missing`); None when it passes. The one check of a record, for
    the rows and for the journal of a fit in progress (weightdiag.record.journal)."""
    try:
        check_of(tp)(value, where)
    except _Bad as bad:
        return f"field '{bad.field}' {bad.problem}"
    return None


# A rule no type states: a cohort row (model.source "cohort") names its cohort, which kinds_table reads.
_COHORT_MODEL = _record({"cohort": check_of(str)}, {})


def _model_id(doc: object) -> str | None:
    model = doc.get("model") if isinstance(doc, dict) else None
    model_id = model.get("id") if isinstance(model, dict) else None
    return model_id if isinstance(model_id, str) else None


_BELOW_AS_TEXT = re.compile(r"(\d+)/\d+")


def _upgrade(doc: dict[str, Any]) -> None:
    """Rows written before issue 33 (and the cohort rows, after DATABASE_v9_1.csv) held each kind's
    `r2_below_95` as the text "a/b", b being its `fitted`: read as the number a, in place, so that every reader
    sees one type."""
    for section in ("kinds", "part_kinds"):
        summaries = doc.get(section)
        for summary in summaries.values() if isinstance(summaries, dict) else ():
            below = summary.get("r2_below_95") if isinstance(summary, dict) else None
            matched = _BELOW_AS_TEXT.fullmatch(below) if isinstance(below, str) else None
            if matched:
                summary["r2_below_95"] = int(matched.group(1))


def load_row(doc: object, file: str | Path | None = None) -> Row:
    """`doc` as a Row, checked field by field; RowError (naming `file` and the field) when it is not one."""
    where = str(file) if file is not None else None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if isinstance(schema, str) and schema.startswith(DIFF_SCHEMA_PREFIX) and isinstance(doc, dict):
        raise RowError(where, f"a diff row ({schema}: {_sides(doc)}), not a model's row", advice=_diff_advice(doc))
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise RowError(where, "not a weightdiag row (no 'schema' field)", advice="give a row written by weightdiag")
    if schema not in READ_SCHEMAS:
        raise RowError(
            where,
            f"schema {schema} is not {' or '.join(READ_SCHEMAS)}, the ones this weightdiag reads",
            advice="read it with the weightdiag version that wrote it, or refit the model",
        )
    _upgrade(cast(dict[str, Any], doc))
    try:
        ROW(doc, "")
        model = cast(dict[str, Any], doc)["model"]
        if model["source"] == "cohort":
            _COHORT_MODEL(model, "model")
    except _Bad as bad:
        raise RowError(where, bad.problem, field=bad.field, model_id=_model_id(doc)) from None
    return cast(Row, doc)


def _side(doc: Mapping[str, Any], key: str) -> str | None:
    side = doc.get(key)
    found = side.get("id") if isinstance(side, dict) else None
    return found if isinstance(found, str) and found else None


def _sides(doc: Mapping[str, Any]) -> str:
    return f"{_side(doc, 'base') or 'BASE'} -> {_side(doc, 'tuned') or 'TUNED'}"


def _diff_advice(doc: Mapping[str, Any]) -> str:
    """What to name instead of a diff row (DATABASE/diffs/, `weightdiag diff`'s): either model it compares."""
    base, tuned = _side(doc, "base"), _side(doc, "tuned")
    named = " or ".join(repr(s) for s in (base, tuned) if s) or "the base or the tuned model"
    return f"name a model instead: {named} (a row id, folder or Hub id); `weightdiag db list` lists the rows"


def _read_regular(path: Path) -> bytes:
    """The bytes of `path`, refusing anything but a regular file without blocking on it."""
    where = str(path)

    def not_a_row(mode: int) -> RowError:
        return RowError(where, f"is {kind_of(mode)}, not a row file", advice="give a weightdiag row file")

    def unreadable(exc: OSError) -> RowError:
        return RowError(
            where,
            f"cannot read a row ({exc.strerror or type(exc).__name__})",
            advice="give a readable weightdiag row file",
        )

    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise not_a_row(mode)
        # O_NONBLOCK: should the name have become a FIFO since the stat, opening it returns at once.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise unreadable(exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # checked again on what was opened: the name may have changed
            raise not_a_row(info.st_mode)
        if info.st_size > MAX_ROW_BYTES:
            raise RowError(where, f"is {info.st_size} bytes, too large for a row", advice="give a weightdiag row file")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read()
    except OSError as exc:
        raise unreadable(exc) from None
    finally:
        if fd >= 0:
            os.close(fd)


def read_row(path: str | Path) -> Row:
    """The row in the file `path` (regular files only), checked by load_row; RowError otherwise."""
    path = Path(path)
    data = _read_regular(path)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than json parses
        raise RowError(
            str(path), f"cannot read a row ({type(exc).__name__})", advice="give a weightdiag row file"
        ) from None
    return load_row(doc, path)
