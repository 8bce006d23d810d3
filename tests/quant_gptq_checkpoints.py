"""GPTQ and AWQ checkpoints for end-to-end tests: quantizers with the interface of tests/quant_checkpoints.py
(`quantize(name, w) -> ({stored name: tensor}, (logical name, float32 dequantized values))`) and the
reference dequantizers that give the twins' values, written from the published code in torch bit ops.

Quantization is round to nearest, asymmetric, per group of inputs (GPTQ's Hessian updates are not needed:
the packing is what is tested); the packing is the published one:
- GPTQ: AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, QuantLinear.pack (qweight packs
  32 / bits consecutive inputs per word, low bits first; qzeros packs outputs, v1 storing zero - 1);
  with desc_act, g_idx[i] = (rank of input i in a random activation order) // group, as GPTQ's act_order
  writes it (groups over the permuted inputs);
- AWQ: AutoAWQ awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear (8 outputs per word in the order
  [0, 2, 4, 6, 1, 3, 5, 7]) over awq/quantize/quantizer.py's pseudo_quantize_tensor (zero point clamped
  to 0..15).
Twin values: `gptq_reference` (AutoGPTQ qlinear_cuda.py's torch dequantization with g_idx, GPTQModel's
for gptq_v2) and `awq_reference` (AutoAWQ awq/utils/packing_utils.py dequantize_gemm), with the scales
taken to float32 (the libraries multiply in F16).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch

GPTQ_CONFIG = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": False,
    "sym": False,
    "checkpoint_format": "gptq",
}
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


# --- reference dequantizers (the oracles) ------------------------------------------------------------------


def gptq_reference(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int, fmt: str
) -> torch.Tensor:
    """float32 [out, in], as AutoGPTQ's QuantLinear (qlinear_cuda.py) dequantizes, scales in float32."""
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    small = torch.int16 if bits == 8 else torch.int8
    zeros = torch.bitwise_right_shift(torch.unsqueeze(qzeros, 2).expand(-1, -1, 32 // bits), wf.unsqueeze(0)).to(small)
    zeros = torch.bitwise_and(zeros, (2**bits) - 1)
    if fmt == "gptq":  # v1 stores zero - 1; GPTQModel's v2 the zero itself
        zeros = zeros + 1
    zeros = zeros.reshape(scales.shape)
    weight = torch.bitwise_right_shift(torch.unsqueeze(qweight, 1).expand(-1, 32 // bits, -1), wf.unsqueeze(-1)).to(
        small
    )
    weight = torch.bitwise_and(weight, (2**bits) - 1)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    g = g_idx.long()
    weights = scales.float()[g] * (weight - zeros[g])  # [in, out]
    return weights.t().contiguous()


def awq_reference(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """float32 [out, in], as AutoAWQ's dequantize_gemm (packing_utils.py) computes it, scales in float32."""
    bits = 4
    shifts = torch.arange(0, 32, bits)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    order = torch.arange(izeros.shape[-1], dtype=torch.int32).view(-1, 32 // bits)[:, AWQ_REVERSE_ORDER].view(-1)
    izeros, iweights = izeros[:, order], iweights[:, order]
    iweights = torch.bitwise_and(iweights, (2**bits) - 1)
    izeros = torch.bitwise_and(izeros, (2**bits) - 1)
    s = scales.float().repeat_interleave(group, dim=0)
    izeros = izeros.repeat_interleave(group, dim=0)
    return ((iweights - izeros) * s).t().contiguous()


# --- packing --------------------------------------------------------------------------------------------------


def _as_i32(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(words.astype(np.uint32).view(np.int32)))


def pack_rows(intweight: np.ndarray, bits: int) -> torch.Tensor:
    """[in, out] codes -> I32 [in * bits / 32, out]: input r * per + k at bits k * bits of word (r, j)."""
    per = 32 // bits
    x = intweight.astype(np.uint64).reshape(-1, per, intweight.shape[1])
    shifts = (np.arange(per, dtype=np.uint64) * bits)[None, :, None]
    return _as_i32((x << shifts).sum(axis=1))


def pack_columns(values: np.ndarray, bits: int, order: list[int] | None = None) -> torch.Tensor:
    """[g, n] -> I32 [g, n * bits / 32]: the value at column w * per + order[k] at bits k * bits of word w."""
    per = 32 // bits
    x = values.astype(np.uint64).reshape(values.shape[0], -1, per)
    if order is not None:
        x = x[:, :, order]
    shifts = (np.arange(per, dtype=np.uint64) * bits)[None, None, :]
    return _as_i32((x << shifts).sum(axis=2))


# --- quantizers -----------------------------------------------------------------------------------------------


def _group_minmax(w: torch.Tensor, g_idx: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    index = g_idx.long()[None, :].expand(w.shape[0], -1)
    big = torch.full((w.shape[0], groups), float("inf"))
    xmin = big.scatter_reduce(1, index, w, "amin", include_self=True)
    xmax = (-big).scatter_reduce(1, index, w, "amax", include_self=True)
    return xmin, xmax


def gptq(bits: int = 4, group: int = 128, desc_act: bool = False, fmt: str = "gptq", seed: int = 0):
    """Round-to-nearest GPTQ packing (AutoGPTQ QuantLinear.pack), asymmetric (sym=False)."""
    maxq = 2**bits - 1

    def quantize(name: str, w: torch.Tensor):
        w = w.to(torch.float32)
        inputs = w.shape[1]
        size = group if group > 0 else inputs
        groups = math.ceil(inputs / size)
        if desc_act:  # act_order: groups are runs of the permuted inputs; g_idx maps each input to its group
            gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
            perm = torch.randperm(inputs, generator=gen)
            g_idx = (torch.argsort(perm) // size).to(torch.int32)
        else:
            g_idx = (torch.arange(inputs) // size).to(torch.int32)
        xmin, xmax = _group_minmax(w, g_idx, groups)  # GPTQ's Quantizer: the range always holds 0
        xmin, xmax = xmin.clamp(max=0), xmax.clamp(min=0)
        scale = (xmax - xmin) / maxq
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zero = torch.round(-xmin / scale).clamp(0, maxq)
        scales16 = scale.half()  # [out, groups]
        s = scales16.float()[:, g_idx.long()]
        z = zero[:, g_idx.long()]
        codes = torch.clamp(torch.round(w / s) + z, 0, maxq).to(torch.int64)  # [out, in]
        stored_zero = zero.to(torch.int64).t().numpy()  # [groups, out]
        if fmt == "gptq":  # v1 stores zero - 1 (a zero of 0 reads back as 2^bits)
            stored_zero = (stored_zero - 1) & maxq
        module = name[: -len(".weight")]
        qweight = pack_rows(codes.t().numpy(), bits)
        qzeros = pack_columns(stored_zero, bits)
        scales = scales16.t().contiguous()
        stored = {
            module + ".qweight": qweight,
            module + ".qzeros": qzeros,
            module + ".scales": scales,
            module + ".g_idx": g_idx,
        }
        values = gptq_reference(qweight, qzeros, scales, g_idx, bits, fmt)
        return stored, (name, values)

    return quantize


def awq(group: int = 128):
    """AutoAWQ's pseudo_quantize_tensor (asymmetric, zero point) and WQLinear_GEMM.from_linear packing."""
    max_int = 15

    def quantize(name: str, w: torch.Tensor):
        w = w.to(torch.float32)
        out, inputs = w.shape
        size = group if group > 0 else inputs
        grouped = w.reshape(out, inputs // size, size)
        max_val, min_val = grouped.amax(dim=2), grouped.amin(dim=2)
        scales = (max_val - min_val).clamp(min=1e-5) / max_int
        zeros = (-torch.round(min_val / scales)).clamp(0, max_int)  # [out, groups]
        scales16 = scales.half()
        s = scales16.float().repeat_interleave(size, dim=1)
        z = zeros.repeat_interleave(size, dim=1)
        intweight = torch.clamp(torch.round((w + z * s) / s), 0, max_int).to(torch.int64)  # from_linear's rounding
        module = name[: -len(".weight")]
        qweight = pack_columns(intweight.t().numpy(), 4, AWQ_ORDER)  # [in, out / 8]
        qzeros = pack_columns(zeros.to(torch.int64).t().numpy(), 4, AWQ_ORDER)  # [groups, out / 8]
        scales_stored = scales16.t().contiguous()  # [groups, out]
        stored = {module + ".qweight": qweight, module + ".qzeros": qzeros, module + ".scales": scales_stored}
        return stored, (name, awq_reference(qweight, qzeros, scales_stored, size))

    return quantize
