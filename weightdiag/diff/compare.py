"""The comparison of tensor pairs read in lockstep from two readers: each pair's exact figures and ΔW's spectrum
folded over its row blocks in order, its verdicts; what a local diff runs on all pairs and each task of
`diff --executor ray` on its own (diff/cluster.py): a pair's result depends on its blocks alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..execution import Execution
from ..layout import ArchInfo, classify_tensor
from ..source.plan import TensorRef
from ..source.reader import Reader
from .findings import is_low_rank, is_scaled
from .measures import Totals, block_part, figures
from .paired import Block, block_rows, matrix_shape, stream_pairs
from .pairing import Pair
from .result import DiffOptions, TensorDiff
from .spectrum import Accumulator, accumulator

Progress = Callable[[str, Any], None]  # the fit's progress events: start, bytes, advance (render.tables.FitProgress)


def _dtype_label(ref: TensorRef) -> str:
    return ref.quantization or ref.dtype.name


def compare(
    pairs: list[Pair],
    arch: ArchInfo,
    base_reader: Reader,
    tuned_reader: Reader,
    options: DiffOptions,
    execution: Execution,
    verify: bool = False,
    verifying: dict[str, bool] | None = None,
    progress: Progress | None = None,
) -> tuple[list[TensorDiff], list[TensorDiff]]:
    totals: dict[int, Totals] = {}
    spectra: dict[int, Accumulator | None] = {}

    def start(i: int) -> None:
        pair = pairs[i]
        totals[i] = Totals()
        m, n = matrix_shape(pair.base.shape)
        spectral = options.spectrum and len(pair.base.shape) >= 2 and min(m, n) > 1
        if spectral:
            step = block_rows(pair)
            spectra[i] = accumulator(m, n, step >= m, seed=options.seed, cap=options.sketch, device=execution.device)
        else:
            spectra[i] = None

    def work(block: Block, b, t) -> tuple[Any, Any]:
        acc = spectra[block.pair]
        part, delta = block_part(b, t, delta=acc is not None)
        if acc is None or delta is None:
            return part, None
        n = matrix_shape(pairs[block.pair].base.shape)[1]
        return part, acc.block_part(block.r0, delta.reshape(block.r1 - block.r0, n))

    matrices: list[TensorDiff] = []
    vectors: list[TensorDiff] = []
    for block, (part, spec) in stream_pairs(
        pairs,
        base_reader,
        tuned_reader,
        work,
        workers=options.workers or execution.threads,
        before_tensor=start,
        verify=verify,
        verifying=verifying,
    ):
        i = block.pair
        if progress is not None:
            progress("bytes", block.base.nbytes + block.tuned.nbytes)
        totals[i].fold(part)
        acc = spectra[i]
        if acc is not None:
            acc.fold(spec)
        if not block.last:
            continue
        pair = pairs[i]
        is_matrix = len(pair.base.shape) >= 2
        fig = figures(totals.pop(i), fits=is_matrix)
        spectrum = acc.result(fig.delta_norm**2) if acc is not None else None
        spectra.pop(i)
        role = classify_tensor(pair.name, tuple(pair.base.shape), arch.n_layers, arch.family, arch.n_experts)
        m, n = matrix_shape(pair.base.shape)
        untouched = fig.delta_norm == 0 and fig.nonfinite == 0
        item = TensorDiff(
            name=pair.name,
            tuned_name=pair.tuned.name,
            kind=role.kind,
            block=role.block,
            shape=tuple(pair.base.shape),
            base_dtype=_dtype_label(pair.base),
            tuned_dtype=_dtype_label(pair.tuned),
            figures=fig,
            spectrum=spectrum,
            untouched=untouched,
            low_rank=is_matrix and is_low_rank((m, n), spectrum.rank90 if spectrum else None, fig.relative_change),
            scaled=is_matrix and is_scaled(fig.alignment, fig.relative_change),
        )
        (matrices if is_matrix else vectors).append(item)
        if progress is not None:
            progress("advance", pair.base)
    return matrices, vectors
