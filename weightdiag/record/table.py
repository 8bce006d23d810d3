"""A row as a flat table: one record per matrix, with declared columns and types (docs/tables.md).

`matrix_records(row)` gives plain dicts, with no third-party import; `matrices_frame(row)` the same as a pandas
DataFrame (pandas is the optional `[pandas]` extra, imported only here and only when asked for). The spectral
columns carry WeightWatcher 0.7.7's names (`details` of `analyze()`: alpha, D, xmin, log_norm, stable_rank,
mp_softrank, num_spikes, ...), so that a WeightWatcher user's filter (`frame[frame.alpha > 6]`) reads the same;
the Weibull columns carry the row's names (`k`, `lambda`, `r2` of `matrices[].fits.<trim>`). Every column is
declared once in MATRIX_COLUMNS with its type (the Arrow type of `db export --format parquet --per-matrix`) and
its meaning; a column whose value a record lacks (no spectrum, a cohort row) is None, so every table of every
row has the same columns in the same order.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from ..errors import PANDAS_INSTALL, MissingDependencyError
from ..vocabulary import TRIMS

# A pandas.DataFrame. Typed as Any: pandas ships no type information (pandas-stubs is a separate package), and
# weightdiag imports pandas only when a frame is asked for.
DataFrame = Any


@dataclass(frozen=True)
class Column:
    """One column of a flat table: its name, its type (int, float, str, bool, list<int>) and what it holds."""

    name: str
    type: str
    doc: str


def _columns(kind: str, names: Iterable[str], doc: str) -> list[Column]:
    return [Column(name, kind, doc.replace("<name>", name)) for name in names]


# The spectral columns, WeightWatcher 0.7.7's `details` names in its order (those weightdiag computes: not its
# layer_type, longname, has_esd and rf), from `matrices[].spectrum` (docs/spectrum.md).
SPECTRUM_FLOATS = (
    "D",
    "Q",
    "W_scale",
    "alpha",
    "alpha_weighted",
    "bulk_max",
    "bulk_min",
    "entropy",
    "lambda_max",
    "log_alpha_norm",
    "log_norm",
    "log_spectral_norm",
    "mp_softrank",
    "norm",
    "sigma",
    "sigma_mp",
    "spectral_norm",
    "stable_rank",
    "sv_max",
    "sv_min",
    "xmax",
    "xmin",
)
SPECTRUM_INTS = ("M", "N", "matrix_rank", "num_evals", "num_pl_spikes", "num_spikes", "rank_loss", "weak_rank_loss")
SPECTRUM_STRS = ("status", "warning")
WEIGHTWATCHER_COLUMNS = tuple(sorted((*SPECTRUM_FLOATS, *SPECTRUM_INTS, *SPECTRUM_STRS)))  # its order
FARMS_COLUMNS = (
    ("alpha_farms", "float"),
    ("farms_xmin", "float"),
    ("farms_D", "float"),
    ("farms_num_evals", "int"),
    ("farms_windows", "int"),
)

STATS_FLOATS: tuple[str, ...] = (
    "zero_fraction",
    "mean",
    "std",
    "excess_kurtosis",
    "mean_abs",
    "std_abs",
    "max_abs",
    "q99_abs",
)
STATS_FLOATS += ("max_over_q99",)
STATS_INTS = ("n_finite", "n_nan", "n_inf", "distinct_values")
HEAVINESS = ("q90_q10", "q99_q50", "p999_p50", "gini")
FIT_FIELDS: tuple[tuple[str, str], ...] = (
    ("k", "float"),
    ("lambda", "float"),
    ("r2", "float"),
    ("ks", "float"),
    ("points", "int"),
)
FIT_FIELDS += (("ok", "bool"), ("reason", "str"))

_SPECTRUM = "`matrices[].spectrum.<name>` (fit --spectrum): WeightWatcher 0.7.7's column of that name"

MATRIX_COLUMNS: tuple[Column, ...] = (
    Column("layer_id", "int", "the record's index in the row's `matrices[]` (WeightWatcher's column name)"),
    Column("name", "str", "`matrices[].name`: the tensor's name (`<tensor>[<label>]` for a record cut from one)"),
    Column("block", "int", "`matrices[].block`: the transformer block, None outside the blocks"),
    Column("expert", "int", "`matrices[].expert`: the expert of an MoE layer, else None"),
    Column("kind", "str", "`matrices[].kind`: q, k, v, o, qkv, gate, up, down, embed, ...; a part's line: its kind"),
    Column("part_of", "str", "a fused matrix's part (`matrices[].parts[]`): the fused kind (qkv); else None"),
    Column("class", "str", "`matrices[].class`: selection, transmission, embedding, recurrent, other"),
    Column("dtype", "str", "`matrices[].dtype`: the stored dtype (a quantized weight's format label)"),
    Column("shape", "list<int>", "`matrices[].shape`: (out, in); None on a part's line"),
    Column("numel", "int", "`matrices[].numel` (a part's line: `parts[].numel`)"),
    Column("trim", "str", "the row's `protocol.trim`: the trim of k, lambda, r2, ks, points, ok, reason"),
    *[Column(f, t, f"`matrices[].fits.<trim>.{f}`: the Weibull fit of |w| at the row's trim") for f, t in FIT_FIELDS],
    *[Column(f"{f}_{trim}", "float", f"`matrices[].fits.{trim}.{f}`") for trim in TRIMS for f in ("k", "lambda", "r2")],
    *_columns("float", STATS_FLOATS, "`matrices[].stats.<name>`: moments of the weights"),
    *_columns("int", STATS_INTS, "`matrices[].stats.<name>`: counts of the weights"),
    *_columns("float", HEAVINESS, "`matrices[].heaviness.<name>`: distribution-free tail metric of nonzero |w|"),
    Column("gamma_closure", "float", "`matrices[].gamma_closure`"),
    *[
        Column(
            name,
            "float" if name in SPECTRUM_FLOATS else "int" if name in SPECTRUM_INTS else "str",
            _SPECTRUM.replace("<name>", name),
        )
        for name in WEIGHTWATCHER_COLUMNS
    ],
    *[Column(name, kind, f"`matrices[].spectrum.{name}` (fit --spectrum --farms)") for name, kind in FARMS_COLUMNS],
    Column("spectrum_skipped", "str", "`matrices[].spectrum_skipped`: why a fit with --spectrum has no spectrum here"),
    Column("quantization", "str", "`matrices[].quantization`: the quantization a weight was stored with"),
    Column("tower", "str", "`matrices[].tower`: the vision/audio tower or projector it belongs to"),
)
MATRIX_COLUMN_NAMES = tuple(c.name for c in MATRIX_COLUMNS)

# Model-level columns prepended to each record by `db export --per-matrix` (a table of many rows).
ROW_KEY_COLUMNS: tuple[Column, ...] = (
    Column("model_id", "str", "`model.id`"),
    Column("revision", "str", "`model.revision`, or a local row's `model.fingerprint`"),
    Column("protocol", "str", "`protocol.name`: hist1024 or exact"),
    Column("created", "str", "`created`: when the row was fitted (UTC, ISO 8601)"),
)


def matrix_records(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One flat record per `matrices[]` entry of a row, each followed by one per part of a fused matrix (q, k, v
    of a qkv: `part_of` names the fused kind), with exactly MATRIX_COLUMNS' keys in their order (a value the
    record lacks is None). A cohort summary (no per-matrix records) gives an empty list."""
    columns = matrix_columns(row)
    return [dict(zip(MATRIX_COLUMN_NAMES, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def _lines(row: Mapping[str, Any]) -> tuple[list[int], list[Mapping[str, Any]], list[str | None]]:
    """The table's lines: each `matrices[]` record (its index, itself), then each of its parts as a record of its
    own (the matrix's index; the part's fields over the matrix's name, block, dtype, ...; its class the row's
    `part_kinds` gives), and the fused kind of each part's line (None on a matrix's own)."""
    matrices = row.get("matrices") or []
    if not any("parts" in m for m in matrices):  # most rows: the records as they are
        return list(range(len(matrices))), matrices, [None] * len(matrices)
    part_kinds = row.get("part_kinds") or {}
    ids: list[int] = []
    lines: list[Mapping[str, Any]] = []
    part_of: list[str | None] = []
    for i, matrix in enumerate(matrices):
        ids.append(i)
        lines.append(matrix)
        part_of.append(None)
        for part in matrix.get("parts") or []:
            role = (part_kinds.get(part.get("kind")) or {}).get("class") or matrix.get("class")
            ids.append(i)
            lines.append({**matrix, "shape": None, "spectrum": None, "spectrum_skipped": None, "class": role, **part})
            part_of.append(matrix.get("kind"))
    return ids, lines, part_of


def matrix_columns(row: Mapping[str, Any], out: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
    """The same table by column: MATRIX_COLUMNS' names -> one value per line (matrix record or part). With `out`,
    the values are appended to its lists (a table of many rows, built a row at a time: `db export --per-matrix`)."""
    if out is None:
        out = {name: [] for name in MATRIX_COLUMN_NAMES}
    ids, matrices, part_of = _lines(row)
    n = len(matrices)
    trim = (row.get("protocol") or {}).get("trim")
    out["layer_id"].extend(ids)
    out["part_of"].extend(part_of)
    for key in _DIRECT:
        out[key].extend([m.get(key) for m in matrices])
    out["shape"].extend([list(m["shape"]) if m.get("shape") is not None else None for m in matrices])
    out["trim"].extend([trim] * n)
    fits = [m.get("fits") or {} for m in matrices]
    _extend(out, [f.get(trim) or {} for f in fits], [name for name, _ in FIT_FIELDS])
    for t in TRIMS:
        of_trim = [f.get(t) or {} for f in fits]
        for name in ("k", "lambda", "r2"):
            out[f"{name}_{t}"].extend([fit.get(name) for fit in of_trim])
    _extend(out, [m.get("stats") or {} for m in matrices], (*STATS_FLOATS, *STATS_INTS))
    _extend(out, [m.get("heaviness") or {} for m in matrices], HEAVINESS)
    _extend(out, [m.get("spectrum") or {} for m in matrices], _SPECTRAL)
    return out


_DIRECT = (
    "name",
    "block",
    "expert",
    "kind",
    "class",
    "dtype",
    "numel",
    "gamma_closure",
    "spectrum_skipped",
    "quantization",
    "tower",
)
_SPECTRAL = (*WEIGHTWATCHER_COLUMNS, *(name for name, _ in FARMS_COLUMNS))


def _extend(out: dict[str, list[Any]], objects: list[Mapping[str, Any]], names: Iterable[str]) -> None:
    """Each name's column extended with its value in each object (None where absent; all None, fast, where every
    object is empty: a row without spectra)."""
    if not any(objects):
        for name in names:
            out[name].extend([None] * len(objects))
        return
    for name in names:
        out[name].extend([o.get(name) for o in objects])


def require_pandas() -> Any:
    """The pandas module, or MissingDependencyError (exit 2) saying how to install the extra."""
    try:
        return importlib.import_module("pandas")  # typed as Any: pandas ships no type information
    except ImportError:
        raise MissingDependencyError(
            f"a table as a DataFrame needs pandas, which is not installed: {PANDAS_INSTALL}",
            package="pandas",
        ) from None


def frame(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> DataFrame:
    """records as a pandas DataFrame with these columns in this order (None becomes NaN in number columns)."""
    pd = require_pandas()
    return pd.DataFrame.from_records(list(records), columns=list(columns))


def matrices_frame(row: Mapping[str, Any]) -> DataFrame:
    """A row's matrix records as a pandas DataFrame, one line per `matrices[]` entry and one per part of a fused
    matrix (`part_of` names the fused kind: `frame[frame.part_of.isna()]` keeps the matrices), MATRIX_COLUMNS'
    columns: WeightWatcher's names for the spectral metrics (`frame[frame.alpha > 6]`), the row's for the Weibull
    ones.

    Raises:
        TypeError: `row` is not a row or a diff row (a dict): None, a path, a model id, ...
        MissingDependencyError: pandas is not installed (exit code 2).
    """
    refuse_non_row(row)
    return require_pandas().DataFrame(matrix_columns(row), columns=list(MATRIX_COLUMN_NAMES))


def refuse_non_row(row: object) -> None:
    """TypeError unless `row` is a document (a dict), saying what the frame functions take."""
    if isinstance(row, Mapping):
        return
    if isinstance(row, (str, PurePath)):
        what = f"a {type(row).__name__} (a path? read the file with weightdiag.read_row; a model? weightdiag.fit)"
    else:
        what = type(row).__name__
    raise TypeError(
        "matrices_frame takes a row (a dict: weightdiag.fit(...).row, weightdiag.read_row(path)) or a diff row "
        f"(DiffResult.to_json(), a file of DATABASE/diffs/ as a dict), not {what}"
    )


def flatten(document: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A JSON object's nested objects as `outer_inner` keys (lists kept as they are): the flat form of a diff's
    per-tensor record (`base_weibull.k` -> `base_weibull_k`)."""
    out: dict[str, Any] = {}
    for key, value in document.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}_"))
        else:
            out[name] = value
    return out
