"""The same `Reduction` as reduce.py, computed with torch on any device (the CUDA path).

On CUDA the raw bytes are copied to the GPU once and every count is a `bincount` there, over REPLICAS
copies of the bins; nothing is read back per chunk (the chunks' largest |w| are read back together, with the
65,536 counts and small side tables, once per tensor). The code runs unchanged on the CPU device, which
is how it is tested on machines without a GPU (tests/test_reduce.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import tuning
from ..codes import FINITE_LIMIT16, code_values, f32_bin_tables
from ..segments import Segments
from .reduction import Reduction, f32_shift, finite_mask, reduce_array

# Each count array replicated this many times, element i counted in copy i % REPLICAS: on a GPU, bincount's
# atomics serialise on the few hot bins trained weights fill (issue 19, one H100: 15 G elements/s plain,
# 46 G with 16 copies); the copies are summed once per chunk.
REPLICAS = 16


def _flat_view(t, segments: Segments):
    """Flattened (count, length) selection of a 1-D device tensor (a copy only for strided parts)."""
    import torch

    if segments.count == 1:
        return t[segments.offset : segments.offset + segments.length]
    view = torch.as_strided(t, (segments.count, segments.length), (segments.stride, 1), segments.offset)
    return view.reshape(-1)


_DEVICE_DTYPES = ("BF16", "F16", "F32", "F64")  # FP8: rare and small; the CPU path is exact


def upload(raw: np.ndarray, dtype: str, device) -> Any:
    """The raw bytes on `device` (left on the host for dtypes reduced there): one copy per tensor."""
    import torch

    return torch.from_numpy(raw).to(device, non_blocking=True) if dtype in _DEVICE_DTYPES else raw


def reduce_torch(raw: Any, dtype: str, device, segments: Segments | None = None) -> Reduction:
    """Summarise a tensor's raw little-endian bytes on `device` (a torch device or string).

    `raw` is a host uint8 array, or what `upload` made of one (to reduce several parts of a fused
    tensor from a single copy).
    """
    import torch

    n_elem = raw.numel() if isinstance(raw, torch.Tensor) else raw.size
    n_elem = n_elem * 8 // {"BF16": 16, "F16": 16, "F32": 32, "F64": 64}.get(dtype, 8)
    segments = segments or Segments.whole(n_elem)
    if dtype not in _DEVICE_DTYPES:
        from ..source.plan import STORAGE_NUMPY

        return reduce_array(np.asarray(raw).view(STORAGE_NUMPY[dtype]), dtype, segments)
    data = raw if isinstance(raw, torch.Tensor) else upload(raw, dtype, device)
    if dtype in FINITE_LIMIT16:
        return _reduce16(_flat_view(data.view(torch.int16), segments), dtype, segments)
    if dtype == "F64":
        values = _flat_view(data.view(torch.float64), segments).to(torch.float32)
        red = _reduce_f32(values.view(torch.int32), Segments.whole(segments.numel))
        red.argmax = segments.original_index(red.argmax) if red.argmax >= 0 else -1
        return red
    return _reduce_f32(_flat_view(data.view(torch.int32), segments), segments)


def _bincount(codes, size: int, offsets):
    """torch.bincount(codes, minlength=size) through REPLICAS copies of the bins (see REPLICAS)."""
    import torch

    spread = codes.to(torch.int64) + offsets[: codes.numel()]
    return torch.bincount(spread, minlength=size * REPLICAS).view(REPLICAS, size).sum(0)


def _replica_offsets(n: int, size: int, device, step: int):
    import torch

    return (torch.arange(min(n, step), device=device, dtype=torch.int64) % REPLICAS) * size


def _chunk_top(mags):
    """Device scalar: (largest magnitude << 32) | (2^32 - 1 - its first index in the chunk), -1 when no
    finite magnitude (mags: int64, -1 where not finite). Read back once per tensor (`_first_top`), so that
    no chunk waits on the host."""
    import torch

    local = torch.arange(mags.numel(), device=mags.device, dtype=torch.int64)
    keys = torch.where(mags >= 0, (mags << 32) | (0xFFFFFFFF - local), torch.full_like(mags, -1))
    return keys.max()


def _first_top(tops: list, starts: list[int]) -> tuple[int, int]:
    """(largest magnitude, its first flat index) from the chunks' _chunk_top values; (-1, -1) when none."""
    import torch

    best_value, best_at = -1, -1
    if not tops:
        return best_value, best_at
    for key, start in zip(torch.stack(tops).cpu().tolist(), starts, strict=True):
        if key >= 0 and (key >> 32) > best_value:  # strictly: a tie keeps the earlier chunk's index
            best_value, best_at = key >> 32, start + 0xFFFFFFFF - (key & 0xFFFFFFFF)
    return best_value, best_at


def _reduce16(bits, dtype: str, segments: Segments) -> Reduction:
    import torch

    step = tuning.current().torch_chunk  # elements per step: bounds the int64 temporaries on the device
    counts = torch.zeros(65536, dtype=torch.int64, device=bits.device)
    offsets = _replica_offsets(bits.numel(), 65536, bits.device, step)
    tops, starts = [], []
    for start in range(0, bits.numel(), step):
        codes = bits[start : start + step].to(torch.int64) & 0xFFFF
        counts += _bincount(codes, 65536, offsets)
        mags = codes & 0x7FFF
        tops.append(_chunk_top(torch.where(mags < FINITE_LIMIT16[dtype], mags, torch.full_like(mags, -1))))
        starts.append(start)
    best_value, best_at = _first_top(tops, starts)
    counts_np = counts.cpu().numpy()
    argmax = segments.original_index(best_at) if best_value >= 0 else -1
    max_abs = float(code_values(dtype)[best_value]) if best_value >= 0 else float("nan")
    return Reduction(dtype, segments.numel, counts_np, True, argmax, max_abs)


def _reduce_f32(bits, segments: Segments) -> Reduction:
    import torch

    device = bits.device
    tables = f32_bin_tables()
    thresholds = torch.from_numpy(tables.thresholds.astype(np.int64)).to(device)
    irregular = torch.from_numpy(tables.irregular).to(device)
    n_irr = max(len(tables.irregular_bins), 1)
    counts = torch.zeros(65536, dtype=torch.int64, device=device)
    above = torch.zeros(32768, dtype=torch.int64, device=device)
    irregular_hist = torch.zeros(n_irr * 65536, dtype=torch.int64, device=device)
    step = tuning.current().torch_chunk  # elements per step: bounds the int64 temporaries on the device
    offsets = _replica_offsets(bits.numel(), 65536, device, step)
    tops, starts = [], []
    for start in range(0, bits.numel(), step):
        chunk = bits[start : start + step].to(torch.int64) & 0xFFFFFFFF
        counts += _bincount(chunk >> 16, 65536, offsets)
        mags = chunk & 0x7FFFFFFF
        keys = mags >> 16
        # one count array for both: [2 * key + (reaches its bucket's threshold)], as the C pass does
        pairs = _bincount((keys << 1) | (mags >= thresholds[keys]).to(torch.int64), 65536, offsets)
        above += pairs.view(32768, 2)[:, 1]
        if len(tables.irregular_bins):  # none on the platforms seen so far; a sync per chunk only then
            irr = irregular[keys]
            sel = irr >= 0
            if bool(sel.any()):
                irregular_hist += torch.bincount(irr[sel] * 65536 + (mags[sel] & 0xFFFF), minlength=n_irr * 65536)
        tops.append(_chunk_top(torch.where(mags < 0x7F800000, mags, torch.full_like(mags, -1))))
        starts.append(start)
    best_value, best_at = _first_top(tops, starts)
    counts_np = counts.cpu().numpy()
    hist = tables.histogram(counts_np, above.cpu().numpy(), irregular_hist.cpu().numpy().reshape(n_irr, 65536))
    n_finite = int(counts_np[finite_mask("F32")].sum())
    shift = f32_shift(counts_np)
    sums = torch.zeros(5, dtype=torch.float64, device=device)  # as kernels.power_sums
    n_inf = 0
    values = bits.view(torch.float32)
    for start in range(0, values.numel(), step):
        x = values[start : start + step]
        ok = torch.isfinite(x)
        if n_finite != segments.numel:
            n_inf += int(torch.isinf(x).sum())
            x = x[ok]
        x64 = x.to(torch.float64)
        d = x64 - shift
        d2 = d * d
        sums += torch.stack([d.sum(), d2.sum(), (d2 * d).sum(), (d2 * d2).sum(), x64.abs().sum()])
    argmax = segments.original_index(best_at) if best_value >= 0 else -1
    max_abs = float(np.array([best_value], dtype=np.uint32).view(np.float32)[0]) if best_value >= 0 else float("nan")
    return Reduction("F32", segments.numel, counts_np, False, argmax, max_abs, hist, sums.cpu().numpy(), shift, n_inf)
