"""The types of what the diagnose stage and the API return: compare, check, trajectory, report, db list.

Like the row (records.py), these documents are plain JSON-able dicts that `--json` prints unchanged; the
types below are TypedDicts, so typing them changes nothing that is built or printed. Each names the
function that builds it. Required keys are the ones always present; keys present only in some cases
(a branch taken, a value known, something written by the API) are optional (total=False). Keys that
are Python keywords ('class', 'lambda') need TypedDict's functional form.

Where a part is large and varied (the health report's blocks, findings, norms, ...), it stays
dict[str, Any] here and is described in docs/report.md; its top-level keys are named.
"""

from __future__ import annotations

from typing import Any, TypedDict

# --- compare (diagnose.compare.compare; api.compare returns one per row) --------------------------------

KindComparison = TypedDict(
    "KindComparison",
    {
        "k": float,  # the kind's median k at the cohort's trim
        "k_se": float,  # its standard error (classes.median_k_sigma)
        "lambda": float | None,
        "class": str | None,  # the row's k_class, or "withheld" (kept for scripts written before k_class below)
        "k_class": str | None,  # the same: the class the median k falls in, named as in a row (issue 21)
        "role": str,  # the kind's role, a row's `class` (selection, transmission, ...: vocabulary.kind_class)
        "class_withheld": str | None,  # why the class is withheld (quantized matrices)
        "cohort_k_range": list[float] | None,  # [min, max] over cohort entries with this kind
        "group_k_range": list[float] | None,  # the same over the model's architecture group
        "nearest_by_k": str | None,  # the cohort entry (other than the model itself) closest in k
    },
)
"""`kinds.<kind>` of a comparison: one kind's values beside the cohort's."""


class _TransmissionRequired(TypedDict):
    ffn_median_k: float | None
    paper_band: list[float]
    cohort_data_range: list[float] | None
    position: str | None  # inside, below, above; None when not placed
    k_se: float | None
    departs: bool
    withheld: str | None
    text: str | None


class TransmissionVerdict(_TransmissionRequired, total=False):
    """`transmission` of a comparison (compare.transmission_verdict): the FFN median k against the band."""

    distance_to_band: float  # only when placed (not withheld, k known)


SelectionVerdict = TypedDict(
    "SelectionVerdict",
    {
        "k": float,
        "k_se": float,
        "class": str | None,  # classes.k_class, or "withheld"
        "departs": bool,
        "withheld": str | None,
        "text": str | None,
    },
)
"""`selection.kinds.<kind>` (compare.selection_verdict): a Q/K (or qkv) kind's class against its group's."""


class SelectionReading(TypedDict):
    """`selection` of a comparison: the selection kinds and what the architecture group predicts."""

    kinds: dict[str, SelectionVerdict]
    expected: str | None
    evidence: str
    departs: bool  # any kind departs beyond noise


class NearestEntry(TypedDict):
    """`nearest[]` of a comparison: one of the three nearest cohort entries over the kinds both have."""

    entry: str
    distance: float
    kinds: list[str]  # the comparison keys the distance is over
    group: str


class _LambdaReadingRequired(TypedDict):
    transmission_lambda: float | None
    state: str | None  # "unknown" when the training hyperparameters are unknown


class LambdaReading(_LambdaReadingRequired, total=False):
    """`lambda` of a comparison: lambda against sqrt(eta / lambda_wd) when lr and weight decay are known
    (ratio ... t_over_tau), otherwise only a note."""

    ratio: float
    cohort_ratio_range: list[float]
    pythia_slope: float | None
    t_over_tau: float | None
    note: str


class CompanionEntry(TypedDict):
    """`shallow_ffn.nearest_companion`: the Qwen companion entry closest in shallow min k."""

    entry: str
    shallow_min_k: float


class _ShallowFfnRequired(TypedDict):
    regime: str  # A, B, or "between A and B"
    shallow_min_k: float
    shallow_median_k_gate: float | None
    deep_median_k_gate: float | None
    blocks_checked: int


class ShallowFfnRegime(_ShallowFfnRequired, total=False):
    """compare.shallow_ffn_regime: the Qwen companion's shallow-FFN regime test; `shallow_ffn` of a
    comparison, where nearest_companion is always added."""

    nearest_companion: CompanionEntry
    shallow_blocks: str  # the blocks read: "0-5", or fewer in a smaller model


_CompareReportRequired = TypedDict(
    "_CompareReportRequired",
    {
        "model": str,
        "revision": str | None,
        "protocol": str,
        "attention": str | None,  # functions.attention_arch's label; None without architecture
        "group": str,  # cohort.architecture_group
        "findings": list[str],
        "attribution": str,  # the cohort's citation and license
        "caveat": str | None,
        "kinds": dict[str, KindComparison],
        "transmission": TransmissionVerdict,
        "selection": SelectionReading,
        "nearest": list[NearestEntry],
        "lambda": LambdaReading,
    },
)


class CompareReport(_CompareReportRequired, total=False):
    """diagnose.compare.compare: one row placed against the cohort (what `weightdiag compare` prints)."""

    shallow_ffn: ShallowFfnRegime  # only when the row has fitted FFN matrices in blocks 0-5
    spectrum: dict[str, Any]  # only for a row with spectra: diagnose.spectrum.compare_spectra
    lineage: dict[str, Any]  # api.compare: the database's rows it derives from (diagnose.relatives)


# --- check (diagnose.check.check; api.check) -------------------------------------------------------------

_MatrixCheckOptional = TypedDict(
    "_MatrixCheckOptional",
    {
        "detail": str,  # new, missing, ok or changed without both fits: why
        "k": float,  # the rest: both sides fitted (status ok or moved)
        "k_base": float,
        "delta_k": float,
        "lambda": float,
        "lambda_base": float,
        "delta_lambda_rel": float,
    },
    total=False,
)


class MatrixCheck(_MatrixCheckOptional):
    """`results[]` of a check: one matrix (or `name#part`) against the baseline."""

    name: str
    status: str  # ok, moved, new, missing, changed


class CheckResult(TypedDict):
    """diagnose.check.check: a fitted row against a baseline row, matrix by matrix."""

    model: str
    baseline: str  # id, or id@revision
    trim: str
    tol_k: float
    tol_lambda: float
    checked: int
    failed: int
    passed: bool
    results: list[MatrixCheck]


# --- trajectory (diagnose.trajectory.trajectory; api.trajectory adds protocol and plots) -----------------

KindSeries = TypedDict("KindSeries", {"steps": list[int], "k": list[float], "lambda": list[float]})
"""`kinds.<kind>` of a trajectory: the kind's median k and lambda at each step that has it."""


class _KindDriftRequired(TypedDict):
    k_final: float
    delta_from_anchor: float


class KindDrift(_KindDriftRequired, total=False):
    """`drift.<kind>`: the final k against the init anchor (and against step 0 when the run has it)."""

    k_step0: float
    delta_from_step0: float


class PairedLambda(TypedDict):
    """`paired_lambda` (functions.lambda_paired_correlation): log-log Pearson r of lambda_O vs lambda_FFN_out."""

    n: int
    pearson_r_loglog: float | None


class LambdaPeak(TypedDict):
    """`lambda_o_peak`: where lambda_O peaked over the steps and how far it retreated."""

    peak_step: int
    peak_lambda: float
    final_lambda: float
    retreat_percent: float
    still_rising: bool
    flat: bool  # within 1% over the run: no peak to speak of


class StepState(TypedDict):
    """`states[]`: T/tau at one step and the training state it reads as."""

    step: int
    t_over_tau: float | None
    state: str


class _ScheduleRequired(TypedDict):
    kind: str  # constant or cosine


class Schedule(_ScheduleRequired, total=False):
    """`schedule`: the learning-rate schedule T/tau was computed with (cosine: the other three)."""

    total: float
    warmup: float
    min_ratio: float


class OffAnchorMatrix(TypedDict):
    """`step0.k_off_anchor[]`: a matrix whose k at step 0 is off the half-normal anchor."""

    name: str
    block: int | None
    k: float
    tolerance: float


class InitRecipe(TypedDict):
    """`step0.lambda_ratio`: the measured input/output lambda ratio against the known init recipes."""

    measured_in_out_ratio: float
    predictions: dict[str, float]
    closest: str
    error_percent: float
    tolerance_percent: float
    matches: bool


class OffNorm(TypedDict):
    """`step0.norms_off[]`: a norm vector whose ||gamma|| is not at sqrt(d) at step 0."""

    name: str
    l2_over_sqrt_d: float


class Step0Checks(TypedDict):
    """`step0` (trajectory.step0_checks): the checks at initialisation."""

    k_at_anchor: bool
    k_off_anchor: list[OffAnchorMatrix]
    lambda_ratio: InitRecipe | None
    norms_at_sqrt_d: bool
    norms_checked: int
    norms_off: list[OffNorm]


class _StdEvidenceRequired(TypedDict):
    blocks: list[int]
    growth_percent: list[float]
    shallow_median_growth_percent: float
    deep_median_growth_percent: float


class StdEvidence(_StdEvidenceRequired, total=False):
    """`std_pattern.evidence`: per-block std growth from the first to the last step."""

    reversals: list[int]  # global oscillation only


class _StdPatternRequired(TypedDict):
    pattern: str  # exploding inflation, deep-layer stagnation, global oscillation, ..., unknown
    evidence: StdEvidence | str  # a sentence when the pattern is unknown


class StdPattern(_StdPatternRequired, total=False):
    """`std_pattern` (trajectory.std_pattern): the layer-wise std evolution and its evidence."""

    blocks: list[int]  # exploding inflation and deep-layer stagnation: the blocks concerned
    summary: str  # every pattern but unknown


class _TrajectoryRequired(TypedDict):
    steps: list[int]
    findings: list[str]


class TrajectoryResult(_TrajectoryRequired, total=False):
    """diagnose.trajectory.trajectory: a run read from its rows. Without rows that have a step number only
    steps (empty) and findings are present; step0 needs a step-0 row with matrices, paired_lambda both
    lambda_O and lambda_FFN_out, lambda_o_peak lambda_O; protocol and plots are added by api.trajectory."""

    model: str
    revisions: list[str | None]
    kinds: dict[str, KindSeries]
    drift: dict[str, KindDrift]
    duplicates: dict[str, str]  # revision -> the revision whose identical files it copies
    band: list[float]
    paired_lambda: PairedLambda
    lambda_o_peak: LambdaPeak | None  # None with fewer than 3 steps
    states: list[StepState]
    schedule: Schedule
    step0: Step0Checks
    std_pattern: StdPattern
    protocol: str  # api.trajectory: the protocol of the rows read
    plots: list[str]  # api.trajectory with plot: the PNG files written
    left_out: list[str]  # api.trajectory: the revisions of rows of no training step (`main`), not on the axis


# --- report (diagnose.health.health_report; api.report adds model.how, plots and html) --------------------


class _ReportModelRequired(TypedDict):
    id: str | None
    revision: str | None
    source: str | None
    location: str | None
    format: str | None
    fingerprint: str | None


class ReportModel(_ReportModelRequired, total=False):
    """`model` of a health report: the row's identity."""

    how: str  # api.report: where the row came from (fitted, database, row file, cohort)


class ReportProtocol(TypedDict):
    """`protocol` of a health report."""

    name: str
    trim: str


class StatisticCut(TypedDict):
    """`cuts.statistics.<stat>`: how one statistic is compared across depth (health.cuts.Stat)."""

    log: bool
    scale_floor: float
    min_effect: float


class ReportCuts(TypedDict):
    """`cuts` of a health report: the robust rule's thresholds."""

    robust_z: float
    neighbours: int
    min_blocks: int
    statistics: dict[str, StatisticCut]


class ReportPlot(TypedDict):
    """`plots[]` of a health report (api.report with plot or html): one figure written."""

    file: str
    title: str
    caption: str


class _HealthReportRequired(TypedDict):
    schema: str  # weightdiag.report/1
    model: ReportModel
    protocol: ReportProtocol
    architecture: dict[str, Any]  # health.blocks.architecture_summary
    blocks: list[dict[str, Any]]  # health.blocks.block_table, one per block
    findings: list[dict[str, Any]]  # health.findings.finding, numbered F1, F2, ...
    norms: dict[str, Any]  # health.norms.analyse_norms
    super_weights: dict[str, Any]  # health.superweights.super_weights
    depth: dict[str, Any]  # health.depth.depth_profile
    shallow_ffn: dict[str, Any] | None  # health.blocks.shallow_ffn
    moe: dict[str, Any] | None  # health.experts.moe_section: routed experts per layer, shared experts, routers
    towers: list[dict[str, Any]]  # health.towers.tower_section: vision/audio towers, apart from the blocks
    quantization: dict[str, Any]  # health.blocks.quantization_summary
    cuts: ReportCuts
    observations: list[str]


class HealthReport(_HealthReportRequired, total=False):
    """diagnose.health.health_report: what `weightdiag report` shows for one row (docs/report.md)."""

    plots: list[ReportPlot]  # api.report with plot or html
    html: str  # api.report with html: the file written
    spectrum: dict[str, Any]  # health.spectrum.spectrum_section: only for a row with spectra (fit --spectrum)
    lineage: dict[str, Any]  # api.report: the database's rows it derives from, copies said (diagnose.relatives)


# --- db list / export (db.flat_record) -------------------------------------------------------------------

KIND_COLUMN_PREFIXES = ("k_median_", "lambda_median_")


class FlatRecord(TypedDict):
    """db.flat_record: one flat record per row (`db list --json`, `db export`). Besides these fixed keys it
    has two columns per kind of the row, `k_median_<kind>` and `lambda_median_<kind>` (float or None; the
    prefixes are KIND_COLUMN_PREFIXES), which a TypedDict cannot declare: read them with record.get(...)."""

    id: str
    revision: str | None
    source: str  # local, hub, or cohort:<name>
    protocol: str
    matrices: int
    attention: str | None
    ffn_median_k: float | None
    t_over_tau: float | None
    state: str | None
    created: str | None
