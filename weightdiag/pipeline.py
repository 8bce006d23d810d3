"""Fit a whole model: plan -> read each tensor once -> reduce -> fit -> one row.

This is F1 + F2 + F3 of the paper as one streaming pass. Memory stays at a few tensors: two
reusable read buffers (one being filled while the other is reduced) plus the small reductions.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from . import __version__, kernels
from .codes import BIN_EDGES, HIST_BINS
from .device import resolve_device
from .diagnose import lambda_axis
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
    # Training hyperparameters for the lambda axis (T/tau); a preset or a step* revision fills gaps.
    lr: float | None = None
    weight_decay: float | None = None
    steps: float | None = None
    preset: str | None = None
    # Ranged requests kept in flight when streaming from the Hub (--connections).
    connections: int = 8

    def validate(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise BadInputError(f"--protocol {self.protocol!r}: choose one of {', '.join(PROTOCOLS)}")
        if self.trim not in TRIMS:
            raise BadInputError(f"--trim {self.trim!r}: choose one of {', '.join(TRIMS)}")
        if self.preset and self.preset not in lambda_axis.PRESETS:
            raise BadInputError(f"--preset {self.preset!r}: unknown; choose one of {', '.join(lambda_axis.PRESETS)}")
        if not (isinstance(self.connections, int) and 1 <= self.connections <= 64):
            raise BadInputError(f"--connections {self.connections}: choose a whole number from 1 to 64")
        for name in ("lr", "weight_decay", "steps"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise BadInputError(f"--{name.replace('_', '-')} must be a positive finite number, not {value}")


def selected(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(name, pat) for pat in include):
        return False
    return not any(fnmatch.fnmatchcase(name, pat) for pat in exclude)


@dataclass
class _Work:
    ref: TensorRef
    role: TensorRole


def plan_work(plan: ModelPlan, arch: ArchInfo, options: FitOptions) -> tuple[list[_Work], list[dict[str, Any]]]:
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
            skipped.append({"name": ref.name, "dtype": ref.dtype.name, "shape": list(ref.shape), "reason": reason})
        else:
            work.append(_Work(ref, role))
    # Read in file order: sequential I/O on disks and in the page cache.
    work.sort(key=lambda w: (w.ref.shard, w.ref.start))
    return work, skipped


Reducer = Callable[[np.ndarray, str, Sequence[Segments | None]], list[Reduction]]


def _reducer(device: str) -> Reducer:
    """Reduce one tensor's raw bytes over several selections (None: the whole tensor; else a fused part)."""
    if device == "cpu":
        return lambda raw, dtype, segs: [reduce_array(raw.view(_np_storage(dtype)), dtype, seg) for seg in segs]
    from .reduce_torch import reduce_torch, upload

    def on_device(raw: np.ndarray, dtype: str, segs: Sequence[Segments | None]) -> list[Reduction]:
        data = upload(raw, dtype, device)  # once per tensor, however many parts it has
        return [reduce_torch(data, dtype, device, seg) for seg in segs]

    return on_device


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

    def work_on(item: _Work, raw: np.ndarray) -> _Reduced:
        return _reduce_item(item, raw, reduce, arch, options)

    try:
        for item, reduced in _reduce_stream(work, reader, device, work_on):
            ref, role = item.ref, item.role
            if reduced.values is not None:
                values = reduced.values
                vectors.append(vector_record(ref.name, role, ref.dtype.name, values, arch.norm_offset))
            else:
                note = "F64 rounded to F32 for fitting" if ref.dtype.name == "F64" else ref.note
                matrices.append(
                    matrix_record(
                        ref.name,
                        role,
                        ref.dtype.name,
                        ref.shape,
                        reduced.whole,
                        options.protocol,
                        reduced.parts,
                        reduced.parts_note,
                        note,
                    )
                )
            if progress:
                progress("advance", ref)
    finally:
        reader.close()
    elapsed = time.perf_counter() - started
    return build_row(plan, arch, matrices, vectors, skipped, options, device, elapsed, total_bytes)


@dataclass
class _Reduced:
    """What the workers hand back for one tensor: a reduction (and parts), or a vector's values."""

    whole: Reduction | None = None
    parts: list[tuple[str, Reduction]] = field(default_factory=list)
    parts_note: str | None = None
    values: np.ndarray | None = None


def _reduce_item(item: _Work, raw: np.ndarray, reduce, arch: ArchInfo, options: FitOptions) -> _Reduced:
    ref, role = item.ref, item.role
    if len(ref.shape) == 1:
        return _Reduced(values=_decode(storage_view(ref, raw), ref.dtype.name))
    segments: list[tuple[str, Segments]] = []
    parts_note = None
    if options.split_fused and role.kind in ("qkv", "ffn_in"):
        segments, parts_note = split_parts(role, ref.name, ref.shape, arch)
    whole, *parts = reduce(raw, ref.dtype.name, [None, *(seg for _, seg in segments)])
    return _Reduced(
        whole=whole, parts=[(kind, r) for (kind, _), r in zip(segments, parts, strict=True)], parts_note=parts_note
    )


IN_FLIGHT = min(8, 2 * kernels.THREADS)  # CPU: tensors reduced at once (measured best at 2 per core)


def _reduce_stream(
    work: list[_Work], reader: TensorReader, device: str, work_on: Callable[[_Work, np.ndarray], _Reduced]
) -> Iterator[tuple[_Work, _Reduced]]:
    """Reduce every tensor, yielding results in file order.

    On the CPU, readers that can map files hand out zero-copy mappings of one tensor at a time
    (no copy, no fresh pages). Several tensors are reduced at once in worker threads while this
    thread fits and records finished ones; the mapped bytes in flight stay below twice the
    largest tensor, so peak memory does not grow with the model. Other readers (CUDA staging,
    network) fill two reusable buffers in a reader thread while this thread reduces.
    """
    mapper = getattr(reader, "map", None)
    if device != "cpu" or mapper is None:
        # Readers may ask for more reads in flight (network: hide per-request latency).
        slots, workers = getattr(reader, "prefetch", (2, 1))
        prefetch = Prefetcher(
            work,
            lambda w: w.ref.nbytes,
            lambda w, out: reader.read_into(w.ref, out),
            slots=slots,
            workers=workers,
            allocate=_allocator(device),
        )
        for item, raw in prefetch:
            yield item, work_on(item, raw)
        return
    byte_cap = 2 * max(w.ref.nbytes for w in work)

    def task(item: _Work, budget: int) -> _Reduced:
        # Mapping in the worker: page-table set-up runs in parallel too, and the mapping is gone
        # (unmapped) as soon as the reduction returns.
        with kernels.thread_budget(budget), mapper(item.ref) as raw:
            return work_on(item, raw)

    pending: deque[tuple[_Work, Future[_Reduced]]] = deque()
    in_flight_bytes = 0
    with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="weightdiag-reduce") as pool:
        try:
            for i, item in enumerate(work):
                while pending and (len(pending) >= IN_FLIGHT or in_flight_bytes + item.ref.nbytes > byte_cap):
                    done, future = pending.popleft()
                    in_flight_bytes -= done.ref.nbytes
                    yield done, future.result()
                if i + 1 < len(work):
                    reader.advise(work[i + 1].ref)  # type: ignore[attr-defined]
                # Near the end fewer tensors remain: give each more of the cores.
                budget = max(1, kernels.THREADS // min(IN_FLIGHT, len(work) - i))
                pending.append((item, pool.submit(task, item, budget)))
                in_flight_bytes += item.ref.nbytes
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
        finally:
            for _, future in pending:  # on errors: do not start what is still queued
                future.cancel()


def _decode(values: np.ndarray, dtype: str) -> np.ndarray:
    """Storage-form elements -> float64 values (small 1-D tensors only)."""
    if dtype in ("BF16", "F8_E4M3", "F8_E5M2"):  # stored as integer codes: look their values up
        from .codes import code_values

        return code_values(dtype)[values]
    return values.astype(np.float64)


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
            {"name": s.name, "size": s.size, "sha256": s.sha256, "header_sha256": s.header_sha256} for s in plan.shards
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
        "hyperparameters": lambda_axis.resolve(
            plan.model_id,
            plan.revision,
            lr=options.lr,
            weight_decay=options.weight_decay,
            steps=options.steps,
            preset=options.preset,
        ).to_json(),
        "kinds": kind_summaries(matrices, options.trim),
        "part_kinds": kind_summaries(matrices, options.trim, parts=True),
        "matrices": matrices,
        "vectors": vectors,
        "skipped": skipped,
        "unclassified": others,
        "notes": list(plan.notes),
    }
    return row


def fit_path(spec: str, options: FitOptions, progress: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Fit a model given as a local path (Hub ids are handled by fit_model in api.py)."""
    from .source.local import open_local

    plan, reader = open_local(spec, options.model_id)
    return fit_plan(plan, reader, options, progress)
