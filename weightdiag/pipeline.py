"""Fit a whole model: plan -> read each tensor once -> reduce -> fit -> one row.

This is F1 + F2 + F3 of the paper as one streaming pass. Memory stays at a few tensors: two
reusable read buffers (one being filled while the other is reduced) plus the small reductions.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from . import __version__
from .codes import BIN_EDGES, HIST_BINS
from .device import resolve_device
from .dtypes import skip_reason
from .errors import BadInputError
from .fit import PROTOCOLS, TRIMS
from .layout import (
    ArchInfo,
    TensorRole,
    arch_from_config,
    attention_architecture,
    classify_tensor,
    complete_arch,
    split_parts,
)
from .prefetch import Prefetcher
from .reduce import Reduction, Segments, reduce_array
from .row import SCHEMA, kind_summaries, matrix_record, vector_record
from .source.plan import ModelPlan, TensorReader, TensorRef, storage_view

ProgressFn = Callable[[TensorRef, int], None]


@dataclass
class FitOptions:
    protocol: str = "hist1024"
    trim: str = "mid80"  # the trim used for per-kind medians and classes; all three are stored
    device: str = "auto"
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    split_fused: bool = True
    model_id: str | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise BadInputError(f"--protocol {self.protocol!r}: choose one of {', '.join(PROTOCOLS)}")
        if self.trim not in TRIMS:
            raise BadInputError(f"--trim {self.trim!r}: choose one of {', '.join(TRIMS)}")


def selected(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(name, pat) for pat in include):
        return False
    return not any(fnmatch.fnmatchcase(name, pat) for pat in exclude)


@dataclass
class _Work:
    ref: TensorRef
    role: TensorRole


def plan_work(
    plan: ModelPlan, arch: ArchInfo, options: FitOptions
) -> tuple[list[_Work], list[dict[str, Any]]]:
    """Decide per tensor: read it (matrix or vector) or skip it with a reason."""
    work: list[_Work] = []
    skipped: list[dict[str, Any]] = []
    for ref in plan.tensors:
        if not selected(ref.name, options.include, options.exclude):
            continue
        role = classify_tensor(ref.name, ref.shape, arch.n_layers, arch.family)
        reason = None
        if not ref.dtype.fittable:
            reason = skip_reason(ref.dtype)
        elif ref.numel == 0:
            reason = "empty tensor"
        elif len(ref.shape) == 0:
            reason = "scalar"
        if reason:
            skipped.append(
                {"name": ref.name, "dtype": ref.dtype.name, "shape": list(ref.shape), "reason": reason}
            )
        else:
            work.append(_Work(ref, role))
    # Read in file order: sequential I/O on disks and in the page cache.
    work.sort(key=lambda w: (w.ref.shard, w.ref.start))
    return work, skipped


def _reducer(device: str) -> Callable[[np.ndarray, str, Segments | None], Reduction]:
    if device == "cpu":
        return lambda raw, dtype, seg: reduce_array(raw.view(_np_storage(dtype)), dtype, seg)
    from .reduce_torch import reduce_torch

    return lambda raw, dtype, seg: reduce_torch(raw, dtype, device, seg)


def _np_storage(dtype: str) -> np.dtype:
    from .source.plan import STORAGE_NUMPY

    return STORAGE_NUMPY[dtype]


def _allocator(device: str) -> Callable[[int], np.ndarray] | None:
    if device == "cpu":
        return None
    import torch

    # Pinned host memory lets the copy to the GPU run at full PCIe speed.
    return lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True).numpy()


def fit_plan(
    plan: ModelPlan,
    reader: TensorReader,
    options: FitOptions,
    progress: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """Stream every selected tensor of `plan` through the reducer and build the row."""
    options.validate()
    device = resolve_device(options.device)
    arch = complete_arch(arch_from_config(plan.config), [(t.name, t.shape) for t in plan.tensors])
    work, skipped = plan_work(plan, arch, options)
    if not work:
        raise BadInputError(
            f"{plan.location}: no fittable tensors selected"
            + (" (check --include/--exclude)" if options.include or options.exclude else "")
        )
    total_bytes = sum(w.ref.nbytes for w in work)
    if progress:
        progress("start", {"tensors": len(work), "bytes": total_bytes, "model": plan.model_id})
    reduce = _reducer(device)
    matrices: list[dict[str, Any]] = []
    vectors: list[dict[str, Any]] = []
    started = time.perf_counter()
    prefetch = Prefetcher(
        work, lambda w: w.ref.nbytes, lambda w, out: reader.read_into(w.ref, out), allocate=_allocator(device)
    )
    try:
        for item, raw in prefetch:
            ref, role = item.ref, item.role
            if len(ref.shape) == 1:
                values = storage_view(ref, raw)
                vectors.append(
                    vector_record(
                        ref.name, role, ref.dtype.name, _decode(values, ref.dtype.name), arch.norm_offset
                    )
                )
            else:
                matrices.append(_matrix(ref, role, raw, reduce, arch, options))
            if progress:
                progress("advance", ref)
    finally:
        reader.close()
    elapsed = time.perf_counter() - started
    return build_row(plan, arch, matrices, vectors, skipped, options, device, elapsed, total_bytes)


def _decode(values: np.ndarray, dtype: str) -> np.ndarray:
    """Storage-form elements -> float64 values (small 1-D tensors only)."""
    if dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        from .codes import code_values

        return code_values(dtype)[values]
    return values.astype(np.float64)


def _matrix(ref: TensorRef, role: TensorRole, raw: np.ndarray, reduce, arch: ArchInfo, options: FitOptions):
    red = reduce(raw, ref.dtype.name, None)
    parts: list[tuple[str, Reduction]] = []
    parts_note = None
    if options.split_fused and role.kind in ("qkv", "ffn_in"):
        segments, parts_note = split_parts(role, ref.name, ref.shape, arch)
        parts = [(kind, reduce(raw, ref.dtype.name, seg)) for kind, seg in segments]
    note = "F64 rounded to F32 for fitting" if ref.dtype.name == "F64" else ref.note
    return matrix_record(
        ref.name, role, ref.dtype.name, ref.shape, red, options.protocol, parts, parts_note, note
    )


def build_row(
    plan: ModelPlan,
    arch: ArchInfo,
    matrices: list[dict[str, Any]],
    vectors: list[dict[str, Any]],
    skipped: list[dict[str, Any]],
    options: FitOptions,
    device: str,
    elapsed: float,
    total_bytes: int,
) -> dict[str, Any]:
    from .source.local import content_fingerprint

    others = [m["name"] for m in matrices if m["kind"] == "other"]
    arch_json = arch.to_json()
    arch_json["attention"] = attention_architecture(arch)
    row: dict[str, Any] = {
        "schema": SCHEMA,
        "model": {
            "id": plan.model_id,
            "source": plan.source,
            "location": plan.location,
            "revision": plan.revision,
            "commit": plan.commit,
            "fingerprint": f"local-{content_fingerprint(plan)}" if plan.source == "local" else None,
            "format": plan.file_format,
        },
        "files": [
            {"name": s.name, "size": s.size, "sha256": s.sha256, "header_sha256": s.header_sha256}
            for s in plan.shards
        ],
        "metadata": plan.metadata,
        "architecture": arch_json,
        "protocol": {
            "name": options.protocol,
            "trim": options.trim,
            "trims": list(TRIMS),
            **(
                {"bins": HIST_BINS, "log10_range": [float(BIN_EDGES[0]), float(BIN_EDGES[-1])]}
                if options.protocol == "hist1024"
                else {"plotting_positions": "hazen (i - 0.5) / N, ties pooled"}
            ),
        },
        "tool": {"name": "weightdiag", "version": __version__},
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run": {
            "device": device,
            "seconds": round(elapsed, 3),
            "bytes_read": total_bytes,
            "include": list(options.include),
            "exclude": list(options.exclude),
        },
        "hyperparameters": options.hyperparameters or None,
        "kinds": kind_summaries(matrices, options.trim),
        "part_kinds": kind_summaries(matrices, options.trim, parts=True),
        "matrices": matrices,
        "vectors": vectors,
        "skipped": skipped,
        "unclassified": others,
        "notes": list(plan.notes),
    }
    return row


def fit_path(
    spec: str, options: FitOptions, progress: Callable[[str, Any], None] | None = None
) -> dict[str, Any]:
    """Fit a model given as a local path (Hub ids are handled by fit_model in api.py)."""
    from .source.local import open_local

    plan, reader = open_local(spec, options.model_id)
    return fit_plan(plan, reader, options, progress)
