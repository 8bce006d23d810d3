"""The same `Reduction` as reduce.py, computed with torch on any device (the CUDA path).

Two phases, so that a chunk of many tensors waits on the device once (issue 41): `launch` queues a part's
work on the device and returns a `Pending` that holds only device tensors (no host read); `resolve` reads
every pending part of a chunk back with one copy (one synchronisation) and builds the reductions on the host.
F32 needs a second round for its power sums, which are taken around a shift computed from the counts on the
host (f32_shift: the CPU path's own float sum, so that both paths use the same shift).

Counting is privatised (`SubHistograms`): element i adds 1 to copy i % COPIES of the bins (parts under
SMALL_PART elements: one copy), int32 sub-counters
summed into int64 only when a tensor's part ends (or before a copy could reach 2^31), so that the atomics of a
GPU do not serialise on the few hot bins trained weights fill (issue 19, one H100: bincount at 15 G elements/s
on one set of bins, 46 G with 16 copies). The counts are integers: equal to the CPU path's whatever the order.

The code runs unchanged on the CPU device, which is how it is tested on machines without a GPU
(tests/test_reduce.py, tests/test_device_pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import tuning
from ..codes import FINITE_LIMIT16, code_values, f32_bin_tables
from ..segments import Segments
from .reduction import Reduction, f32_shift, finite_mask, reduce_array

# Copies of each count array (see the module docstring); element i is counted in copy i % COPIES.
COPIES = 16
_INT32_MAX = (1 << 31) - 1


def _flat_view(t, segments: Segments):
    """Flattened (count, length) selection of a 1-D device tensor (a copy only for strided parts)."""
    import torch

    if segments.count == 1:
        return t[segments.offset : segments.offset + segments.length]
    view = torch.as_strided(t, (segments.count, segments.length), (segments.stride, 1), segments.offset)
    return view.reshape(-1)


DEVICE_DTYPES = ("BF16", "F16", "F32", "F64")  # FP8: rare and small; the CPU path is exact
ITEM_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}


def upload(raw: np.ndarray, dtype: str, device) -> Any:
    """The raw bytes on `device` (left on the host for dtypes reduced there): one copy per tensor."""
    import torch

    return torch.from_numpy(raw).to(device, non_blocking=True) if dtype in DEVICE_DTYPES else raw


SMALL_PART = 1 << 20  # parts of fewer elements are counted in one copy: little contention, 16x less to clear
_CONSTANTS: dict[tuple[str, int, int, int], tuple[Any, Any]] = {}  # (device, size, copies, length) -> (ones, offsets)


def _constants(device, size: int, copies: int, length: int) -> tuple[Any, Any]:
    """int32 ones and the copies' offsets (i % copies · size), `length` of each, made once per device and shape."""
    import torch

    key = (str(device), size, copies, length)
    found = _CONSTANTS.get(key)
    if found is None:
        ones = torch.ones(length, dtype=torch.int32, device=device)
        offsets = (torch.arange(length, device=device, dtype=torch.int64) % copies) * size
        found = _CONSTANTS[key] = (ones, offsets)
    return found


class SubHistograms:
    """`size` bins counted in COPIES int32 copies on the device (privatised: see the module docstring), for a part
    of `n` elements counted `step` at a time."""

    def __init__(self, size: int, device, step: int, n: int) -> None:
        import torch

        self.size = size
        self.copies = COPIES if n >= SMALL_PART else 1
        length = 1 << max(10, (min(step, max(n, 1)) - 1).bit_length())  # a few shapes, whatever the parts' sizes
        self._ones, self._offsets = _constants(device, size, self.copies, length)
        self._sub = torch.zeros(self.copies * size, dtype=torch.int32, device=device)
        self._total = torch.zeros(size, dtype=torch.int64, device=device)
        self._per_copy = 0  # the most any one sub-counter may hold now

    def add(self, codes) -> None:
        """Count `codes` (int64 in [0, size), at most `step` of them)."""
        n = codes.numel()
        added = -(-n // self.copies)
        if self._per_copy + added > _INT32_MAX:
            self._flush()
        self._sub.scatter_add_(0, codes + self._offsets[:n], self._ones[:n])
        self._per_copy += added

    def _flush(self) -> None:
        import torch

        self._total += self._sub.view(self.copies, self.size).sum(0, dtype=torch.int64)
        self._sub.zero_()
        self._per_copy = 0

    def total(self):
        """The int64 counts (a device tensor); the sub-counters reduced once, here."""
        self._flush()
        return self._total


def _chunk_top(mags):
    """Device scalar: (largest magnitude << 32) | (2^32 - 1 - its first index in the step), -1 when no
    finite magnitude (mags: int64, -1 where not finite)."""
    import torch

    local = torch.arange(mags.numel(), device=mags.device, dtype=torch.int64)
    keys = torch.where(mags >= 0, (mags << 32) | (0xFFFFFFFF - local), torch.full_like(mags, -1))
    return keys.max()


def _first_top(keys: list[int], starts: list[int]) -> tuple[int, int]:
    """(largest magnitude, its first flat index) from the steps' _chunk_top values; (-1, -1) when none."""
    best_value, best_at = -1, -1
    for key, start in zip(keys, starts, strict=True):
        if key >= 0 and (key >> 32) > best_value:  # strictly: a tie keeps the earlier step's index
            best_value, best_at = key >> 32, start + 0xFFFFFFFF - (key & 0xFFFFFFFF)
    return best_value, best_at


@dataclass
class Pending:
    """One part's reduction queued on the device: its device tensors, read back by `resolve`."""

    dtype: str  # the input's dtype
    segments: Segments
    ints: list[Any] = field(default_factory=list)  # int64 device tensors, concatenated for the read back
    starts: list[int] = field(default_factory=list)  # each step's first flat index (its top is in `ints`)
    values: Any = None  # F32 (and F64 rounded): the int32 bits of the selected elements, for the power sums
    done: Reduction | None = None  # reduced on the host already (FP8)
    lo: int = 0  # the piece's first element in its tensor (the chunk engine's; argmax is shifted by it)
    # set by the chunk engine between launch and resolve (reduce/stream.py)
    grid: tuple[int, int] | None = None
    sample: np.ndarray | None = None
    lines: np.ndarray | None = None


def launch(raw: Any, dtype: str, device, segments: Segments | None = None) -> Pending:
    """Queue the reduction of a tensor's raw little-endian bytes on `device`; nothing is read back.

    `raw` is a host uint8 array, or a uint8 device tensor (what `upload` or the staging made of one: several
    parts of a fused tensor reduced from a single copy)."""
    import torch

    n_elem = raw.numel() if isinstance(raw, torch.Tensor) else raw.size
    n_elem = n_elem // ITEM_BYTES.get(dtype, 1)
    segments = segments or Segments.whole(n_elem)
    if dtype not in DEVICE_DTYPES:
        from ..source.plan import STORAGE_NUMPY

        done = reduce_array(np.asarray(raw).view(STORAGE_NUMPY[dtype]), dtype, segments)
        return Pending(dtype, segments, done=done)
    data = raw if isinstance(raw, torch.Tensor) else upload(raw, dtype, device)
    step = tuning.current().torch_chunk  # elements per step: bounds the int64 temporaries on the device
    if dtype in FINITE_LIMIT16:
        return _launch16(_flat_view(data.view(torch.int16), segments), dtype, segments, step)
    if dtype == "F64":
        bits = _flat_view(data.view(torch.float64), segments).to(torch.float32).view(torch.int32)
    else:
        bits = _flat_view(data.view(torch.int32), segments)
    return _launch_f32(bits, dtype, segments, step)


def _launch16(bits, dtype: str, segments: Segments, step: int) -> Pending:
    import torch

    counts = SubHistograms(65536, bits.device, step, bits.numel())
    pending = Pending(dtype, segments)
    tops = []
    for start in range(0, bits.numel(), step):
        codes = bits[start : start + step].to(torch.int64) & 0xFFFF
        counts.add(codes)
        mags = codes & 0x7FFF
        tops.append(_chunk_top(torch.where(mags < FINITE_LIMIT16[dtype], mags, torch.full_like(mags, -1))))
        pending.starts.append(start)
    pending.ints = [counts.total(), *[t.view(1) for t in tops]]
    return pending


def _launch_f32(bits, dtype: str, segments: Segments, step: int) -> Pending:
    import torch

    device = bits.device
    tables = f32_bin_tables()
    thresholds = torch.from_numpy(tables.thresholds.astype(np.int64)).to(device)
    irregular = torch.from_numpy(tables.irregular).to(device)
    n_irr = max(len(tables.irregular_bins), 1)
    counts = SubHistograms(65536, device, step, bits.numel())
    pairs = SubHistograms(
        65536, device, step, bits.numel()
    )  # [2 * key + (reaches its bucket's threshold)], as the C pass
    irregular_hist = torch.zeros(n_irr * 65536, dtype=torch.int64, device=device)
    pending = Pending(dtype, segments, values=bits)
    tops = []
    for start in range(0, bits.numel(), step):
        chunk = bits[start : start + step].to(torch.int64) & 0xFFFFFFFF
        counts.add(chunk >> 16)
        mags = chunk & 0x7FFFFFFF
        keys = mags >> 16
        pairs.add((keys << 1) | (mags >= thresholds[keys]).to(torch.int64))
        if len(tables.irregular_bins):  # none on the platforms seen so far; a sync per step only then
            irr = irregular[keys]
            sel = irr >= 0
            if bool(sel.any()):
                irregular_hist += torch.bincount(irr[sel] * 65536 + (mags[sel] & 0xFFFF), minlength=n_irr * 65536)
        tops.append(_chunk_top(torch.where(mags < 0x7F800000, mags, torch.full_like(mags, -1))))
        pending.starts.append(start)
    above = pairs.total().view(32768, 2)[:, 1]
    pending.ints = [counts.total(), above, irregular_hist, *[t.view(1) for t in tops]]
    return pending


def read_back(tensors: list[Any]) -> list[np.ndarray]:
    """Device int64 (or float64) tensors on the host with one copy: the one synchronisation of a round."""
    import torch

    if not tensors:
        return []
    flat = [t.reshape(-1).view(torch.int64) for t in tensors]
    host = torch.cat(flat).cpu().numpy()
    out, at = [], 0
    for t, src in zip(flat, tensors, strict=True):
        part = host[at : at + t.numel()]
        out.append(part.view(np.float64) if src.dtype == torch.float64 else part)
        at += t.numel()
    return out


def resolve(pendings: list[Pending]) -> list[Reduction]:
    """The reductions of pending parts: one read back for the counts of all of them, a second one for the F32
    power sums (taken around the host's shift)."""
    queued = [p for p in pendings if p.done is None]
    host = iter(read_back([t for p in queued for t in p.ints]))
    firsts: dict[int, list[np.ndarray]] = {id(p): [next(host) for _ in p.ints] for p in queued}
    f32 = [p for p in queued if p.values is not None]
    shifts = {id(p): f32_shift(firsts[id(p)][0]) for p in f32}
    sums = iter(read_back([_power_sums(p.values, shifts[id(p)]) for p in f32]))
    out = []
    for p in pendings:
        if p.done is not None:
            red = p.done
        elif p.values is None:
            red = _finish16(p, firsts[id(p)])
        else:
            red = _finish_f32(p, firsts[id(p)], shifts[id(p)], next(sums))
        red.grid, red.sample = p.grid or red.grid, p.sample if p.sample is not None else red.sample
        red.lines = p.lines if p.lines is not None else red.lines
        out.append(red)
    return out


def _finish16(p: Pending, host: list[np.ndarray]) -> Reduction:
    counts = host[0]
    best_value, best_at = _first_top([int(t[0]) for t in host[1:]], p.starts)
    argmax = p.segments.original_index(best_at) if best_value >= 0 else -1
    max_abs = float(code_values(p.dtype)[best_value]) if best_value >= 0 else float("nan")
    return Reduction(p.dtype, p.segments.numel, counts, True, argmax, max_abs)


def _power_sums(bits, shift: float):
    """Device float64 [sum d, d², d³, d⁴, |x|] over the finite values (d = x - shift), and, last, the count of
    infinities (as kernels.power_sums)."""
    import torch

    step = tuning.current().torch_chunk
    sums = torch.zeros(6, dtype=torch.float64, device=bits.device)
    values = bits.view(torch.float32)
    for start in range(0, values.numel(), step):
        x = values[start : start + step]
        ok = torch.isfinite(x)
        n_inf = torch.isinf(x).sum().to(torch.float64)
        x64 = torch.where(ok, x, torch.zeros_like(x)).to(torch.float64)  # non-finite: 0 here, masked below
        d = torch.where(ok, x64 - shift, torch.zeros_like(x64))
        d2 = d * d
        sums += torch.stack([d.sum(), d2.sum(), (d2 * d).sum(), (d2 * d2).sum(), x64.abs().sum(), n_inf])
    return sums


def _finish_f32(p: Pending, host: list[np.ndarray], shift: float, sums: np.ndarray) -> Reduction:
    tables = f32_bin_tables()
    n_irr = max(len(tables.irregular_bins), 1)
    counts, above, irregular_hist = host[0], host[1], host[2]
    hist = tables.histogram(counts, above, irregular_hist.reshape(n_irr, 65536))
    n_finite = int(counts[finite_mask("F32")].sum())
    n_inf = int(sums[5]) if n_finite != p.segments.numel else 0
    best_value, best_at = _first_top([int(t[0]) for t in host[3:]], p.starts)
    argmax = p.segments.original_index(best_at) if best_value >= 0 else -1  # F64: of its rounded values
    max_abs = float(np.array([best_value], dtype=np.uint32).view(np.float32)[0]) if best_value >= 0 else float("nan")
    return Reduction("F32", p.segments.numel, counts, False, argmax, max_abs, hist, sums[:5].copy(), shift, n_inf)


def reduce_torch(raw: Any, dtype: str, device, segments: Segments | None = None) -> Reduction:
    """Summarise a tensor's raw little-endian bytes on `device` (a torch device or string): `launch`, then
    `resolve` (for one part; the chunk engine resolves a whole chunk's parts at once)."""
    return resolve([launch(raw, dtype, device, segments)])[0]
