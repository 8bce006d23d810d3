"""A fit's dry run (`weightdiag fit MODEL --plan`, `weightdiag.plan(...)`): what the fit would read and record,
tensor by tensor, and what it would skip and why, from the files' headers and config.json alone.

The fate of each tensor is decided by the fit's own code (run/measure.py `plan_work`, layout/views.py), so the
plan's records are the row's: the same names in the same order (`matrix` and `vector` entries are the row's
`matrices[]` and `vectors[]`, `skipped` its `skipped[]`); `not selected` lists what --include/--exclude leave out
(the row does not name those). From the Hub, only the safetensors headers are read (two ranged reads per shard);
`bytes_read` says how many bytes of the weight files were fetched: each shard's first ranged read of
tuning's head_guess (256 KiB: one request holds most headers, and the fit reuses what it holds), a second
where the header is longer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..decode.group import group_quantized
from ..layout import arch_from_config, complete_arch
from ..record.table import Column, DataFrame
from ..source.open import open_model
from ..source.plan import ModelPlan, TensorRef
from .measure import _parts, plan_work, selected
from .options import FitOptions


@dataclass(frozen=True)
class PlannedTensor:
    """One record the fit would make (fate `matrix` or `vector`), or one stored tensor it would not read (fate
    `skipped`, `not selected`)."""

    name: str  # the record's name (`<tensor>[<label>]` for one cut from a stored tensor), as the row names it
    fate: str  # matrix, vector, skipped, not selected
    tensor: str  # the stored tensor it is read from
    file: str  # its shard
    dtype: str  # as stored, as the row's `dtype` says it (a GGUF Q4_1 matrix: Q4_1)
    shape: tuple[int, ...]  # the record's shape (a view's, for a record cut from a stored tensor)
    kind: str | None = None  # q, k, v, o, qkv, gate, up, down, embed, norm, bias, ... (None: not read)
    cls: str | None = None  # the matrix's class: selection, transmission, embedding, recurrent, other
    block: int | None = None
    expert: int | None = None
    view: str | None = None  # the label of the view it is cut out as (fused experts, MLA), else None
    parts: tuple[str, ...] = ()  # a fused matrix's parts, fitted apart too (qkv -> q, k, v)
    nbytes: int = 0  # bytes the fit reads for it (its stored tensor's, counted once per tensor)
    format: str | None = None  # a quantized weight's format ("GPTQ int4, group 128", "GGUF Q4_1"), else None
    reason: str | None = None  # why it is skipped or not selected
    # a matrix: whether `fit --spectrum` takes its spectrum (and its parts'), and why not where it does not: the
    # row's `spectrum_skipped` (values that are not finite are found only when read: the plan cannot say those)
    spectrum: bool | None = None
    spectrum_skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry by PLAN_COLUMNS' names, in their order."""
        out = asdict(self)
        out["class"] = out.pop("cls")
        out["shape"] = list(self.shape)
        out["parts"] = list(self.parts)
        return {c.name: out[c.name] for c in PLAN_COLUMNS}


@dataclass
class Plan:
    """What `fit` would do with a model: its tensors' fates in the row's order, and what planning read."""

    model_id: str
    source: str  # local or hub
    location: str
    revision: str | None
    files: list[str]
    tensors: list[PlannedTensor]
    bytes_to_read: int  # the weight bytes the fit would read
    bytes_read: int | None  # bytes of the weight files read to make this plan (headers); None: local files
    notes: list[str] = field(default_factory=list)

    def of(self, fate: str) -> list[PlannedTensor]:
        return [t for t in self.tensors if t.fate == fate]

    def __iter__(self) -> Iterator[PlannedTensor]:
        return iter(self.tensors)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": {"id": self.model_id, "source": self.source, "location": self.location, "revision": self.revision},
            "files": self.files,
            "bytes_to_read": self.bytes_to_read,
            "bytes_read": self.bytes_read,
            "counts": {fate: len(self.of(fate)) for fate in ("matrix", "vector", "skipped", "not selected")},
            "tensors": [t.to_json() for t in self.tensors],
            "notes": self.notes,
        }

    def frame(self) -> DataFrame:
        """The plan as a pandas DataFrame, one line per entry (the columns of PlannedTensor.to_json).

        Raises:
            MissingDependencyError: pandas is not installed (exit code 2).
        """
        from ..record.table import frame

        records = [t.to_json() for t in self.tensors]
        return frame(records, [c.name for c in PLAN_COLUMNS])


# `fit --plan --json`'s tensors[] and Plan.frame()'s columns (docs/tables.md).
PLAN_COLUMNS: tuple[Column, ...] = (
    Column("name", "str", "the record's name as the row will have it (`<tensor>[<label>]` for one cut from a tensor)"),
    Column("fate", "str", "matrix, vector (the row's `matrices[]`, `vectors[]`), skipped (`skipped[]`), not selected"),
    Column("tensor", "str", "the stored tensor it is read from"),
    Column("file", "str", "the shard holding it"),
    Column("dtype", "str", "as stored, as the row's `dtype` says it (a GGUF Q4_1 matrix: Q4_1)"),
    Column("format", "str", "a quantized weight's format (GPTQ int4, group 128; GGUF Q4_1), else None"),
    Column("shape", "list<int>", "the record's shape"),
    Column("kind", "str", "its role: q, k, v, o, qkv, gate, up, down, embed, norm, bias, ... (None: not read)"),
    Column("class", "str", "a matrix's class: selection, transmission, embedding, recurrent, other"),
    Column("block", "int", "the transformer block, None outside the blocks"),
    Column("expert", "int", "the MoE expert, else None"),
    Column("view", "str", "the label of the view it is cut out as (fused experts, MLA's k and v), else None"),
    Column("parts", "list<str>", "a fused matrix's parts, fitted apart as well (qkv: q, k, v)"),
    Column("nbytes", "int", "bytes the fit reads for it (a stored tensor's, on the first of its records)"),
    Column("reason", "str", "why it is skipped or not selected"),
    Column("spectrum", "bool", "a matrix: whether `fit --spectrum` would take its spectrum (None: not a matrix)"),
    Column(
        "spectrum_skipped",
        "str",
        "why --spectrum would not take it (the row's `spectrum_skipped`), or a fused part's (`part q: ...`)",
    ),
)


def plan_fit(
    spec: str,
    options: FitOptions | None = None,
    *,
    revision: str | None = None,
    token: str | None = None,
) -> Plan:
    """The plan of `fit spec` with these options, from headers only (nothing is fitted, nothing written)."""
    options = options or FitOptions()
    plan, reader = open_model(spec, model_id=options.model_id, revision=revision, token=token)
    small = 0  # bytes of the small tensors some quantized formats are grouped by (a packed shape): read too

    def read_small(ref: TensorRef) -> Any:
        nonlocal small
        data = reader.tensor_bytes(ref)
        small += ref.nbytes
        return data

    with reader:
        group_quantized(plan, read_small)  # quantized weights as the fit sees them (reads no codes)
        fetched = reader.planning_bytes()
    return plan_of(plan, options, None if fetched is None else fetched + small)


def plan_of(plan: ModelPlan, options: FitOptions, bytes_read: int | None = None) -> Plan:
    """The Plan of an opened model (its quantized weights already grouped)."""
    notes: list[str] = []
    arch = complete_arch(arch_from_config(plan.config, notes), [(t.name, t.shape) for t in plan.tensors])
    work, skipped = plan_work(plan, arch, options.measurement)
    files = [s.name for s in plan.shards]
    by_name = {t.name: t for t in plan.tensors}

    def where(ref: TensorRef) -> str:
        return files[ref.shard] if ref.shard < len(files) else ""

    tensors: list[PlannedTensor] = []
    for item in work:
        ref, role = item.ref, item.role
        dtype = ref.stored_type or ref.dtype.name  # as the row's `dtype` (record.row.dtype_fields)
        fmt = ref.quant.spec.label if ref.quant is not None else ref.quantization
        fate = "vector" if item.vector else "matrix"
        if item.views:
            for i, v in enumerate(item.views):
                tensors.append(
                    PlannedTensor(
                        f"{ref.name}[{v.label}]",
                        fate,  # a tensor read as a vector gives vector records only (measure._as_reduced)
                        ref.name,
                        where(ref),
                        dtype,
                        tuple(v.shape),
                        v.role.kind,
                        v.role.cls,
                        v.role.block,
                        v.role.expert,
                        view=v.label,
                        nbytes=ref.file_nbytes if i == 0 else 0,
                        format=fmt,
                    )
                )
            continue
        parts = tuple(kind for kind, _ in _parts(item, arch, options)[0]) if fate == "matrix" else ()
        tensors.append(
            PlannedTensor(
                ref.name,
                fate,
                ref.name,
                where(ref),
                dtype,
                tuple(ref.shape),
                role.kind,
                role.cls if fate == "matrix" else None,
                role.block,
                role.expert,
                parts=parts,
                nbytes=ref.file_nbytes,
                format=fmt,
            )
        )
    for entry in skipped:
        ref = by_name[entry["name"]]
        tensors.append(
            PlannedTensor(
                entry["name"],
                "skipped",
                ref.name,
                where(ref),
                entry["dtype"],
                tuple(entry["shape"]),
                reason=entry["reason"],
            )
        )
    for ref in plan.tensors:
        if not selected(ref.name, options.include, options.exclude):
            tensors.append(
                PlannedTensor(
                    ref.name,
                    "not selected",
                    ref.name,
                    where(ref),
                    ref.dtype.name,
                    tuple(ref.shape),
                    reason="left out by include/exclude",
                )
            )
    return Plan(
        plan.model_id,
        plan.source,
        plan.location,
        plan.revision,
        files,
        _with_spectra(tensors, work, arch, options),
        sum(item.ref.file_nbytes for item in work),
        bytes_read,
        [*plan.notes, *notes],
    )


def _with_spectra(tensors: list[PlannedTensor], work: list[Any], arch: Any, options: FitOptions) -> list[PlannedTensor]:
    """The matrices marked with what `fit --spectrum` would do with them: the spectrum pass's own plan
    (run/spectrum.py plan_spectra, from the shapes and layouts alone), as the fit makes it."""
    from .spectrum import SpectrumInput, plan_spectra, record_names

    inputs = [
        SpectrumInput(item.ref, item.views, [] if item.views else _parts(item, arch, options)[0])
        for item in work
        if not item.vector
    ]
    planned = plan_spectra(inputs, lambda i: record_names(i.views, i.ref.name))
    taken = {target.key for targets in planned.targets for target in targets}
    out = []
    for t in tensors:
        if t.fate == "matrix":
            whole = planned.skipped.get((t.name, None))
            parts = [
                f"part {kind}: {planned.skipped[(t.name, i)]}"
                for i, kind in enumerate(t.parts)
                if (t.name, i) in planned.skipped
            ]
            t = replace(t, spectrum=(t.name, None) in taken, spectrum_skipped=whole or "; ".join(parts) or None)
        out.append(t)
    return out
