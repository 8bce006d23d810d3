"""Quantized checkpoints and their dequantized float32 twins, for end-to-end tests.

A *quantizer* turns one float32 weight into the tensors its format stores ({suffix or name: tensor}) and
the float32 values that format's own dequantizer gives back (the twin's tensor). `write_pair` applies it
to every linear weight of real trained weights (all-MiniLM-L6-v2's encoder) and writes:
- the quantized checkpoint, two shards: the codes in the first, every companion in the second (so a
  weight's scales are never where its codes are), an index, and config.json with the format's
  quantization_config (or hf_quant_config.json);
- the twin: one F32 file of the dequantized values under the logical names, the same config less the
  quantization.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

# name -> (stored tensors by full name, dequantized float32 weight under its logical name)
Quantizer = Callable[[str, torch.Tensor], tuple[dict[str, torch.Tensor], tuple[str, torch.Tensor]]]


def linear_weights(minilm_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of all-MiniLM-L6-v2 (float32, position ids as they are)."""
    return load_file(str(minilm_dir / "model.safetensors"))


def is_linear(name: str, w: torch.Tensor) -> bool:
    return w.ndim == 2 and w.dtype == torch.float32 and name.endswith(".weight") and "embeddings" not in name


def write_pair(
    root: Path,
    minilm_dir: Path,
    quantize: Quantizer,
    quantization_config: dict[str, Any] | None,
    *,
    hf_quant_config: dict[str, Any] | None = None,
    extra: dict[str, torch.Tensor] | None = None,
    layers: int = 6,
) -> tuple[Path, Path]:
    """(quantized folder, twin folder) under `root`; `layers` < 6 keeps the first encoder layers and no
    embeddings (a small checkpoint for tests that read it in many small pieces)."""
    tensors = linear_weights(minilm_dir)
    if layers < 6:
        tensors = {
            k: v
            for k, v in tensors.items()
            if k.startswith(tuple(f"encoder.layer.{i}." for i in range(layers))) or k.startswith("pooler.")
        }
    tensors.update(extra or {})
    config = json.loads((minilm_dir / "config.json").read_text())
    codes: dict[str, torch.Tensor] = {}
    companions: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not is_linear(name, w):
            codes[name] = w
            twin[name] = w
            continue
        stored, (logical, values) = quantize(name, w)
        main = max(stored, key=lambda k: stored[k].numel())  # the codes: the largest stored tensor
        codes[main] = stored[main]
        companions.update({k: v for k, v in stored.items() if k != main})
        twin[logical] = values.to(torch.float32).contiguous()
    qdir, tdir = root / "quantized", root / "twin"
    qdir.mkdir(parents=True)
    tdir.mkdir(parents=True)
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({k: v.contiguous() for k, v in codes.items()}, str(qdir / first))
    save_file({k: v.contiguous() for k, v in companions.items()}, str(qdir / second))
    weight_map = {k: first for k in codes} | {k: second for k in companions}
    (qdir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    qconfig = dict(config)
    if quantization_config is not None:
        qconfig["quantization_config"] = quantization_config
    (qdir / "config.json").write_text(json.dumps(qconfig))
    if hf_quant_config is not None:
        (qdir / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    save_file(twin, str(tdir / "model.safetensors"))
    (tdir / "config.json").write_text(json.dumps(config))
    return qdir, tdir


# --- FP8 E4M3 with a float32 scale per 128x128 block (DeepSeek-V3's fp8_cast and weight_dequant) ----------


def fp8_block(block: int = 128) -> Quantizer:
    def quantize(name: str, w: torch.Tensor):
        rows, cols = w.shape
        grid = (math.ceil(rows / block), math.ceil(cols / block))
        scale = torch.empty(grid)
        codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
        for i in range(grid[0]):
            for j in range(grid[1]):
                tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
                scale[i, j] = tile.abs().max().clamp(min=1e-12) / 448.0
                codes[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / scale[i, j]).to(
                    torch.float8_e4m3fn
                )
        expanded = scale.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
        values = codes.to(torch.float32) * expanded  # weight_dequant: x.float() * s, per block
        return {name: codes, name + "_scale_inv": scale}, (name, values)

    return quantize


FP8_BLOCK_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def fit_row(path: Path | str, **options: Any) -> dict[str, Any]:
    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    return api.fit_model(str(path), FitOptions(device="cpu", **options))


def same_fits(quantized: dict[str, Any], twin: dict[str, Any], *, k_tol: float = 0.0, lam_rel: float = 0.0) -> None:
    """Every matrix of the twin is in the quantized row, with the same fits, statistics and argmax."""
    q = {m["name"]: m for m in quantized["matrices"]}
    t = {m["name"]: m for m in twin["matrices"]}
    assert set(q) == set(t), set(q) ^ set(t)
    for name, tm in t.items():
        qm = q[name]
        assert qm["shape"] == tm["shape"], name
        assert qm["argmax"] == tm["argmax"], name
        assert qm["stats"]["distinct_values"] == tm["stats"]["distinct_values"], name
        assert qm["stats"]["max_abs"] == tm["stats"]["max_abs"], name
        for trim, tf in tm["fits"].items():
            qf = qm["fits"][trim]
            assert abs(qf["k"] - tf["k"]) <= k_tol, (name, trim, qf["k"], tf["k"])
            assert abs(qf["lambda"] / tf["lambda"] - 1) <= lam_rel, (name, trim, qf["lambda"], tf["lambda"])
        for stat in ("mean", "std", "mean_abs", "q99_abs", "zero_fraction"):
            a, b = qm["stats"][stat], tm["stats"][stat]
            assert a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b)), (name, stat, a, b)


# --- bitsandbytes (its own quantizer and dequantizer, on the CPU) --------------------------------------------


def _bnb():
    import bitsandbytes as bnb

    return bnb


def bnb_4bit_values(codes: torch.Tensor, state: Any) -> torch.Tensor:
    """bitsandbytes' dequantization of 4-bit codes with their QuantState, in float32, through its torch kernel
    (backends/default/ops.py `_dequantize_4bit_compute`): the same on every machine. Not `dequantize_4bit`, which
    on the CPU calls the C library, whose result depends on the machine: its AVX-512 kernel gives +0.0 for FP4's
    code 8 (negative zero), as get_4bit_type and the torch kernel do, its kernel for other machines (AVX2 only)
    -0.0, so a twin made there held one more distinct value than the quantized checkpoint (weightdiag follows
    +0.0: decode/formats/bnb.py). Flat blocks, as the quantizer and the CUDA kernels use."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code
    from bitsandbytes.functional import dequantize_blockwise

    absmax = state.absmax
    if state.nested:
        absmax = dequantize_blockwise(state.absmax, state.state2) + state.offset
    code = _get_4bit_code(state.quant_type, codes.device)
    return _dequantize_4bit_compute(codes.reshape(-1), absmax, code, state.blocksize, state.shape, torch.float32)


def bnb_4bit(quant_type: str = "nf4", nested: bool = True, blocksize: int = 64) -> Quantizer:
    def quantize(name: str, w: torch.Tensor):
        bnb = _bnb()

        linear = bnb.nn.Linear4bit(
            w.shape[1], w.shape[0], bias=False, quant_type=quant_type, compress_statistics=nested
        )
        linear.weight = bnb.nn.Params4bit(
            w, requires_grad=False, quant_type=quant_type, compress_statistics=nested, blocksize=blocksize
        )
        linear = linear.to("cpu")  # quantizes
        state = linear.weight.quant_state
        state.dtype = torch.float32  # the values before bitsandbytes' cast to the checkpoint's dtype
        values = bnb_4bit_values(linear.weight.data, state)
        base = name[: -len("weight")]
        stored = {base + k: v.contiguous() for k, v in linear.state_dict().items()}
        return stored, (name, values)

    return quantize


def bnb_int8() -> Quantizer:
    def quantize(name: str, w: torch.Tensor):
        bnb = _bnb()
        from bitsandbytes.functional import int8_vectorwise_dequant

        linear = bnb.nn.Linear8bitLt(w.shape[1], w.shape[0], bias=False, has_fp16_weights=False)
        linear.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
        linear = linear.to("cpu")
        base = name[: -len("weight")]
        stored = {base + k: v.contiguous() for k, v in linear.state_dict().items()}
        values = int8_vectorwise_dequant(stored[base + "weight"], stored[base + "SCB"])
        return stored, (name, values)

    return quantize


BNB_4BIT_CONFIG = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
}
BNB_8BIT_CONFIG = {"quant_method": "bitsandbytes", "load_in_8bit": True}


# --- compressed-tensors (its own compressors and dequantizer, on the CPU) -------------------------------------
# Each weight is quantized and packed by compressed-tensors' compressor for the format; the twin is the same
# library's decompress, with the scale handed over as float32 (so the library computes in float32, as the
# decoders do; it would otherwise compute in the scale's BF16).


def _ct_args(**weights: Any):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(**weights)
    return args, QuantizationScheme(targets=["Linear"], weights=args)


def _ct_config(fmt: str, **weights: Any) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "format": fmt}},
        "ignore": [],
    }


def ct_pack(bits: int = 4, group: int | None = 128, symmetric: bool = True) -> Quantizer:
    """pack-quantized INT`bits`: group (or channel when group is None) scales in BF16, zero points when asymmetric."""

    def quantize(name: str, w: torch.Tensor):
        from compressed_tensors.compressors import PackedQuantizationCompressor
        from compressed_tensors.quantization.utils import calculate_qparams

        strategy = "group" if group else "channel"
        args, scheme = _ct_args(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group)
        parts = w.reshape(w.shape[0], -1, group or w.shape[1])
        scale, zero = calculate_qparams(parts.amin(-1), parts.amax(-1), args)
        state = {"weight": w, "weight_scale": scale.to(torch.bfloat16), "weight_zero_point": zero}
        stored = PackedQuantizationCompressor.compress(state, scheme)
        back = PackedQuantizationCompressor.decompress(
            {**stored, "weight_scale": stored["weight_scale"].float()}, scheme
        )
        base = name[: -len("weight")]
        return {base + k: v for k, v in stored.items()}, (name, back["weight"])

    return quantize


def ct_pack_config(bits: int = 4, group: int | None = 128, symmetric: bool = True) -> dict[str, Any]:
    strategy = "group" if group else "channel"
    return _ct_config(
        "pack-quantized", num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group
    )


def _fp4_values(packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    return unpack_fp4_from_uint8(packed, rows, cols, dtype=torch.float32)


def _nvfp4_codes(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors NVFP4: packed E2M1 codes, an FP8 scale per 16 and the float32 global scale."""
    from compressed_tensors.compressors import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    args, scheme = _ct_args(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)
    global_scale = generate_gparam(w.min(), w.max())
    parts = w.reshape(w.shape[0], -1, 16)
    scale, _ = calculate_qparams(parts.amin(-1), parts.amax(-1), args, global_scale=global_scale)
    state = {"weight": w, "weight_scale": scale, "weight_global_scale": global_scale}
    return NVFP4PackedCompressor.compress(state, scheme)


def nvfp4_ct() -> Quantizer:
    def quantize(name: str, w: torch.Tensor):
        from compressed_tensors.quantization.lifecycle.forward import dequantize

        stored = _nvfp4_codes(w)
        args, _ = _ct_args(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)
        values = dequantize(
            _fp4_values(stored["weight_packed"], *w.shape),
            stored["weight_scale"].to(torch.float32),
            args=args,
            global_scale=stored["weight_global_scale"],
            dtype=torch.float32,
        )
        base = name[: -len("weight")]
        return {base + k: v for k, v in stored.items()}, (name, values)

    return quantize


NVFP4_CT_CONFIG = _ct_config(
    "nvfp4-pack-quantized", num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16
)


def nvfp4_modelopt() -> Quantizer:
    """modelopt's layout of the same codes: `weight` U8, `weight_scale` FP8, `weight_scale_2` = 1 / global scale;
    dequantized as TensorRT Model Optimizer does (NVFP4QTensor.dequantize): e2m1 * (scale * weight_scale_2)."""

    def quantize(name: str, w: torch.Tensor):
        stored = _nvfp4_codes(w)
        scale_2 = (1 / stored["weight_global_scale"]).reshape(())
        block = stored["weight_scale"].to(torch.float32) * scale_2
        values = (
            _fp4_values(stored["weight_packed"], *w.shape).reshape(w.shape[0], -1, 16) * block[..., None]
        ).reshape(w.shape)
        return {name: stored["weight_packed"], name + "_scale": stored["weight_scale"], name + "_scale_2": scale_2}, (
            name,
            values,
        )

    return quantize


NVFP4_MODELOPT_HF_CONFIG = {
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": []},
}


def _mxfp4_codes(w: torch.Tensor) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors import MXFP4PackedCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    args, scheme = _ct_args(num_bits=4, type="float", symmetric=True, strategy="group", group_size=32)
    parts = w.reshape(w.shape[0], -1, 32)
    scale, _ = calculate_qparams(parts.amin(-1), parts.amax(-1), args)
    return MXFP4PackedCompressor.compress({"weight": w, "weight_scale": scale}, scheme)


def mxfp4_ct() -> Quantizer:
    def quantize(name: str, w: torch.Tensor):
        from compressed_tensors.compressors.mx_utils import decompress_mx_scale
        from compressed_tensors.quantization.lifecycle.forward import dequantize

        stored = _mxfp4_codes(w)
        args, _ = _ct_args(num_bits=4, type="float", symmetric=True, strategy="group", group_size=32)
        scale = decompress_mx_scale(stored["weight_scale"]).to(torch.float32)
        values = dequantize(_fp4_values(stored["weight_packed"], *w.shape), scale, args=args, dtype=torch.float32)
        base = name[: -len("weight")]
        return {base + k: v for k, v in stored.items()}, (name, values)

    return quantize


MXFP4_CT_CONFIG = _ct_config(
    "mxfp4-pack-quantized", num_bits=4, type="float", symmetric=True, strategy="group", group_size=32
)


def mxfp4_gpt_oss() -> Quantizer:
    """gpt-oss's layout: `X_blocks` U8 [rows, groups, 16] and `X_scales` U8 [rows, groups]; the twin is what
    transformers' convert_moe_packed_tensors gives (in float32), turned back from its [in, out] to [out, in]."""

    def quantize(name: str, w: torch.Tensor):
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        stored = _mxfp4_codes(w)
        rows, cols = w.shape
        blocks = stored["weight_packed"].reshape(rows, cols // 32, 16)
        scales = stored["weight_scale"].reshape(rows, cols // 32)
        values = convert_moe_packed_tensors(blocks[None], scales[None], dtype=torch.float32)[0].T
        return {name + "_blocks": blocks, name + "_scales": scales}, (name, values)

    return quantize


MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": ["pooler"]}


# --- FP8 by transformers' own quantizer (finegrained_fp8.py: Fp8Quantize, and Fp8Dequantize for the twin) ------


def fp8_transformers(block: tuple[int, int] = (128, 128), scale_fmt: str | None = None) -> Quantizer:
    """`quant_method: fp8` as transformers writes it (weight F8_E4M3, weight_scale_inv per block); with
    scale_fmt "ue8m0" the inverse scales are powers of two stored as F8_E8M0 (DeepSeek-V3.1's format)."""

    def quantize(name: str, w: torch.Tensor):
        from types import SimpleNamespace

        from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

        quantizer = SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=block, scale_fmt=scale_fmt))
        stored = Fp8Quantize(quantizer).convert({name: w})
        scale_name = name[: -len(".weight")] + ".weight_scale_inv"
        codes, scale = stored[name], stored[scale_name]
        values = Fp8Dequantize(quantizer).convert({"weight": codes, "weight_scale_inv": scale})["weight"]
        if scale.dtype != torch.float32:  # E8M0: the oracle computes in BF16 unless told; ask again in float32
            values = Fp8Dequantize(quantizer)._dequantize_one(codes, scale, output_dtype=torch.float32)
        return {name: codes, scale_name: scale}, (name, values)

    return quantize


def fp8_transformers_config(scale_fmt: str | None = None) -> dict[str, Any]:
    return {k: v for k, v in {**FP8_BLOCK_CONFIG, "scale_fmt": scale_fmt}.items() if v is not None}


# --- compressed-tensors FP8 (float-quantized) and INT8 (naive-quantized), its own compressors -----------------


def _ct_scales(w: torch.Tensor, args: Any, strategy: str, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    from compressed_tensors.quantization.utils import calculate_qparams

    rows, cols = w.shape
    if strategy == "channel":
        parts = w.reshape(rows, 1, cols)
    elif strategy == "tensor":
        parts = w.reshape(1, 1, -1)
    else:  # block
        parts = (
            w.reshape(rows // block, block, cols // block, block)
            .permute(0, 2, 1, 3)
            .reshape(rows // block, -1, block * block)
        )
    return calculate_qparams(parts.amin(-1), parts.amax(-1), args)


def ct_float(
    strategy: str = "channel", scale_dtype: torch.dtype = torch.bfloat16, input_scale: bool = False
) -> Quantizer:
    """float-quantized FP8 E4M3 (the FP8 / FP8_DYNAMIC / FP8_BLOCK presets): weight_scale [out, 1], [1] or per
    128x128 block in `scale_dtype`; a static `input_scale` beside it when asked (listed, never fitted)."""

    def quantize(name: str, w: torch.Tensor):
        from compressed_tensors.compressors import FloatQuantizationCompressor

        extra = {"block_structure": [128, 128]} if strategy == "block" else {}
        args, scheme = _ct_args(num_bits=8, type="float", symmetric=True, strategy=strategy, **extra)
        scale, zero = _ct_scales(w, args, strategy)
        scale = scale.to(scale_dtype)
        if strategy == "tensor":
            scale = scale.reshape(1)
        stored = FloatQuantizationCompressor.compress(
            {"weight": w, "weight_scale": scale, "weight_zero_point": zero}, scheme
        )
        back = FloatQuantizationCompressor.decompress(
            {**stored, "weight_scale": stored["weight_scale"].float()}, scheme
        )
        base = name[: -len("weight")]
        out = {base + k: v for k, v in stored.items()}
        if input_scale:
            out[base + "input_scale"] = torch.tensor([0.0123], dtype=torch.float32)
        return out, (name, back["weight"])

    return quantize


def ct_float_config(strategy: str = "channel") -> dict[str, Any]:
    extra = {"block_structure": [128, 128]} if strategy == "block" else {}
    return _ct_config("float-quantized", num_bits=8, type="float", symmetric=True, strategy=strategy, **extra)


def ct_naive_int8() -> Quantizer:
    """naive-quantized INT8 per channel (the W8A16 preset): weight I8 and weight_scale [out, 1]."""

    def quantize(name: str, w: torch.Tensor):
        from compressed_tensors.compressors import NaiveQuantizationCompressor

        args, scheme = _ct_args(num_bits=8, type="int", symmetric=True, strategy="channel")
        scale, zero = _ct_scales(w, args, "channel")
        state = {"weight": w, "weight_scale": scale.to(torch.bfloat16), "weight_zero_point": zero}
        stored = NaiveQuantizationCompressor.compress(state, scheme)
        back = NaiveQuantizationCompressor.decompress(
            {**stored, "weight_scale": stored["weight_scale"].float()}, scheme
        )
        base = name[: -len("weight")]
        return {base + k: v for k, v in stored.items()}, (name, back["weight"])

    return quantize


CT_NAIVE_INT8_CONFIG = _ct_config("naive-quantized", num_bits=8, type="int", symmetric=True, strategy="channel")


# --- fbgemm FP8 and modelopt FP8 (no CPU quantizer: their published arithmetic, by hand) ---------------------


def fbgemm_fp8() -> Quantizer:
    """`quant_method: fbgemm_fp8` (Llama-3.1-405B-FP8): weight F8_E4M3 with a float32 weight_scale [out, 1] =
    row amax / 448 (fbgemm_gpu quantize_fp8_per_row); transformers' FbgemmFp8Linear computes with
    weight.float() * weight_scale (integrations/fbgemm_fp8.py)."""

    def quantize(name: str, w: torch.Tensor):
        scale = (w.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1e-12)
        codes = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        return {name: codes, name + "_scale": scale}, (name, codes.to(torch.float32) * scale)

    return quantize


FBGEMM_FP8_CONFIG = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": []}


def modelopt_fp8() -> Quantizer:
    """TensorRT Model Optimizer FP8 (hf_quant_config quant_algo FP8): weight F8_E4M3, a scalar float32
    weight_scale = amax / 448 and a scalar input_scale; dequantized as weight.float() * weight_scale."""

    def quantize(name: str, w: torch.Tensor):
        scale = (w.abs().max() / 448.0).reshape(())
        codes = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        base = name[: -len("weight")]
        stored = {name: codes, name + "_scale": scale, base + "input_scale": torch.tensor(0.05)}
        return stored, (name, codes.to(torch.float32) * scale)

    return quantize


MODELOPT_FP8_HF_CONFIG = {
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": []},
}
