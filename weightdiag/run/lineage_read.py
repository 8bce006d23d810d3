"""A model's lineage samples read from its files without fitting it (`lineage --declared` against a base that
has no row): ranged reads of the values at the fingerprint's positions (reduce/sample.py) of each matrix the
fit would sample, nothing else, and how many bytes that took (docs/lineage.md).

Only a prefix of each matrix's positions is read (SAMPLED_K, at most the fit's own k): the candidate's samples
are compared on the positions both have. The pair cosines need whole rows or columns and are not read: the
samples suffice for a base whose weights are close to the candidate's, which is what a declaration claims.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..layout import arch_from_config, complete_arch
from ..reduce.sample import sample_positions, samples_per_matrix
from ..reduce.vectors import values_of
from ..source.open import open_model
from ..source.plan import TensorRef
from .measure import FitOptions, fingerprinted, plan_work

SAMPLED_K = 64  # samples read per matrix: a few requests each, and z ~ 20 for a close copy
GAP = 64  # positions closer than this many bytes are read in one request
CONNECTIONS = 8


@dataclass
class SampledBase:
    """What judging needs of a base read by samples: a row-like object for diagnose.lineage.Fingerprint."""

    row: dict[str, Any]
    bytes_read: int  # headers and sampled ranges of the weight files
    total_bytes: int  # the weight files' tensors


def sampled_base(spec: str, token: str | None = None) -> SampledBase | None:
    """The base's samples by ranged reads; None where they cannot be read that way (a checkpoint that is not
    safetensors, or no matrix stored unquantized): the caller fits the model instead."""
    from ..record.lineage import fingerprint_json

    plan, reader = open_model(spec, token=token)
    with reader:
        if plan.file_format != "safetensors":
            return None
        arch = complete_arch(arch_from_config(plan.config, []), [(t.name, t.shape) for t in plan.tensors])
        work, _ = plan_work(plan, arch, FitOptions().measurement)
        # quantized weights' codes are not their values: ranged reads take the matrices stored as floats only
        chosen = [i for i in fingerprinted(work) if work[i].ref.quant is None and work[i].ref.dtype.bits % 8 == 0]
        if not chosen:
            return None
        k = min(SAMPLED_K, samples_per_matrix(len(chosen)))
        reads = [(work[i].ref, sample_positions(tuple(work[i].ref.shape), k)) for i in chosen]
        with ThreadPoolExecutor(CONNECTIONS, thread_name_prefix="weightdiag-sampled") as pool:
            got = list(pool.map(lambda item: _read_samples(reader, *item), reads))
        headers = reader.planning_bytes() or 0
    samples = {ref.name: values for (ref, _), (values, _) in zip(reads, got, strict=True)}
    records = [
        {
            "name": work[i].ref.name,
            "kind": work[i].role.kind,
            "block": work[i].role.block,
            "expert": work[i].role.expert,
            "shape": list(work[i].ref.shape),
            "dtype": work[i].ref.dtype.name,
        }
        for i in chosen
    ]
    row = {
        "model": {"id": plan.model_id, "source": plan.source, "location": plan.location},
        "matrices": records,
        "lineage": fingerprint_json(samples, k),
    }
    total = sum(t.file_nbytes for t in plan.tensors)
    return SampledBase(row, headers + sum(n for _, n in got), total)


def _read_samples(reader: Any, ref: TensorRef, positions: np.ndarray) -> tuple[np.ndarray, int]:
    """The values at `positions` (flat, in sampling order) of one tensor, and the bytes read: runs of positions
    closer than GAP bytes share a ranged read."""
    size = ref.dtype.bits // 8
    order = np.argsort(positions, kind="stable")
    at = positions[order] * size
    cuts = np.flatnonzero(np.diff(at) > GAP) + 1
    values = np.empty(positions.size, dtype=np.float64)
    read = 0
    for run in np.split(np.arange(at.size), cuts):
        lo, hi = int(at[run[0]]), int(at[run[-1]]) + size
        raw = reader.tensor_bytes(replace(ref, start=ref.start + lo, end=ref.start + hi))
        read += hi - lo
        picked = np.concatenate([raw[int(a) - lo : int(a) - lo + size] for a in at[run]])
        values[order[run]] = values_of(picked, ref.dtype.name)
    return values, read
