"""Detect a checkpoint's quantization and group each quantized weight with its companions.

Input: the plan's tensor table (every stored tensor) and its configs (config.json's
`quantization_config` or `compression_config`, modelopt's hf_quant_config.json). Output: the same
table where each quantized weight is ONE `TensorRef` of its logical (dequantized) shape, delivered
as float32, whose `quant` names its packed codes and companions; companions and activation scales
are gone from the table (they are the weight's quantization record, never matrices or vectors).

The config says which method and parameters (the block size in particular: shapes alone are
ambiguous); tensor names are the safety net: a quantized-looking tensor the method does not explain
(a packed integer weight, an FP8 weight without its scale, a stray scale) stops the fit with
QuantizationError (exit 2) rather than a fit of raw codes or a model with weights left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..dtypes import DTYPES
from ..errors import QuantizationError
from ..source.plan import ModelPlan, Quantized, QuantSpec, TensorRef

ReadSmall = Callable[[TensorRef], np.ndarray]  # a small tensor's stored bytes (uint8), read now

# Scales of activations and of the KV cache: part of a quantized model, never a weight's companion
# the dequantization needs, never fitted.
ACTIVATION_SUFFIXES = (
    ".input_scale",
    ".input_zero_point",
    ".input_global_scale",
    ".output_scale",
    ".output_zero_point",
    ".input_scale_ub",
    ".k_scale",
    ".v_scale",
    ".q_scale",
    ".prob_scale",
    ".kv_scale",
    ".weight_format",  # bitsandbytes int8: a layout tag ("row"), not data
)
# Every suffix that marks a tensor as part of a quantized weight (for the safety net).
COMPANION_SUFFIXES = (
    "_scale_inv",
    ".weight_scale",
    ".weight_scale_2",
    ".weight_zero_point",
    ".weight_global_scale",
    ".weight_g_idx",
    ".weight_shape",
    ".weight_packed",
    ".qweight",
    ".qzeros",
    ".scales",
    ".g_idx",
    ".SCB",
    ".absmax",
    ".quant_map",
    ".nested_absmax",
    ".nested_quant_map",
    "_blocks",
    "_scales",
)
_QUANT_STATE = re.compile(r"\.quant_state\.bitsandbytes__(nf4|fp4)$")
LOW_PRECISION = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0")

SOURCES = {
    "fp8": "DeepSeek-V3 inference/kernel.py (weight_dequant); transformers integrations/finegrained_fp8.py",
    "compressed-tensors": "compressed-tensors quantization/lifecycle/forward.py (dequantize) and its compressors",
    "fbgemm_fp8": "transformers integrations/fbgemm_fp8.py",
    "modelopt": "NVIDIA TensorRT Model Optimizer; vLLM quantization/modelopt.py",
    "mxfp4": "transformers integrations/mxfp4.py (convert_moe_packed_tensors); OCP Microscaling Formats v1.0",
    "bitsandbytes": "bitsandbytes functional.py (dequantize_4bit, int8_vectorwise_dequant)",
    "gptq": "AutoGPTQ nn_modules/qlinear/qlinear_cuda_old.py (pack, dequantization)",
    "awq": "AutoAWQ modules/linear/gemm.py and utils/packing_utils.py (dequantize_gemm)",
}
SUPPORTED_METHODS = tuple(SOURCES)
TO_DO = "fit the unquantized base model instead (the model card's base_model names it)"


def _refuse(what: str, method: str | None, todo: str = TO_DO) -> QuantizationError:
    return QuantizationError(
        f"{what}; weightdiag cannot dequantize it exactly, so it does not fit it; {todo}", method=method
    )


def quantization_config(plan: ModelPlan) -> dict[str, Any] | None:
    """The checkpoint's quantization settings: config.json's quantization_config (or the older
    compression_config of compressed-tensors), else hf_quant_config.json's `quantization` (modelopt)."""
    config = plan.config or {}
    for key in ("quantization_config", "compression_config"):
        value = config.get(key)
        if isinstance(value, dict):
            return value
    if isinstance(plan.quant_config, dict):
        inner = plan.quant_config.get("quantization", plan.quant_config)
        if isinstance(inner, dict):
            return {"quant_method": "modelopt", **inner}
    return None


def group_quantized(plan: ModelPlan, read_small: ReadSmall | None = None) -> None:
    """Replace the plan's stored tensors by logical quantized weights (in place); raise QuantizationError
    for what cannot be dequantized exactly. A plan with nothing quantized is left as it is."""
    try:
        _group(plan, read_small)
    except QuantizationError as err:
        if plan.base_model and TO_DO in str(err):  # the model card names the model to fit instead
            raise QuantizationError(
                str(err).replace(TO_DO, f"fit its unquantized base model instead: weightdiag fit {plan.base_model}"),
                method=err.method,
            ) from None
        raise


def _group(plan: ModelPlan, read_small: ReadSmall | None) -> None:
    qc = quantization_config(plan)
    method = str(qc.get("quant_method") or "").lower() if qc else None
    by_name = {t.name: t for t in plan.tensors}
    suspicious = [t for t in plan.tensors if _looks_quantized(t, by_name)]
    if method is None and not suspicious:
        return
    if method is None:
        method = _method_from_names(suspicious, by_name)
    if method not in SUPPORTED_METHODS:
        if not suspicious:  # a config that names a method, over plain float weights (a dequantized save)
            plan.notes.append(f"quantization_config names {method!r}, but the weights are stored as plain floats")
            return
        raise _refuse(f"{plan.location}: quantization method {method!r} ({suspicious[0].name})", method)
    if plan.file_format != "safetensors":
        raise _refuse(
            f"{plan.location}: a {method} checkpoint in {plan.file_format} files",
            method,
            "use its safetensors release, or fit the unquantized base model",
        )
    grouper = _GROUPERS[method]
    quantized: dict[str, Quantized] = {}
    for ref in plan.tensors:
        q = grouper(ref, by_name, qc or {}, read_small)
        if q is not None:
            quantized[q.codes.name] = q
    used = {name for q in quantized.values() for name in q.stored_names}
    activation = [t.name for t in plan.tensors if t.name not in used and t.name.endswith(ACTIVATION_SUFFIXES)]
    leftovers = [
        t for t in plan.tensors if t.name not in used and t.name not in activation and _looks_quantized(t, by_name)
    ]
    if leftovers:
        t = leftovers[0]
        more = f" and {len(leftovers) - 1} more" if len(leftovers) > 1 else ""
        raise _refuse(
            f"{plan.location}: {t.name} ({t.dtype.name}{list(t.shape)}){more} is not part of any weight "
            f"the {method} layout explains",
            method,
        )
    dropped = used | set(activation)
    tensors: list[TensorRef] = []
    for ref in plan.tensors:
        if ref.name in quantized:
            tensors.append(_logical_ref(quantized[ref.name]))
        elif ref.name not in dropped:
            tensors.append(ref)
    plan.tensors = tensors
    if quantized:
        labels = sorted({q.spec.label for q in quantized.values()})
        plan.notes.append(
            f"quantized ({method}): {len(quantized)} weights dequantized exactly while streaming ({'; '.join(labels)})"
        )
    if activation:
        plan.notes.append(f"{len(activation)} activation and KV-cache scales are part of the quantization, not fitted")


def _logical_ref(q: Quantized) -> TensorRef:
    codes = q.codes
    return TensorRef(
        _logical_name(q),
        DTYPES["F32"],
        q.logical_shape,
        codes.shard,
        codes.start,
        codes.end,
        note=f"dequantized from {q.spec.label}",
        stored_type=codes.dtype.name,
        quantization=q.spec.label,
        quant=q,
    )


def _logical_name(q: Quantized) -> str:
    name = q.codes.name
    for suffix, logical in ((".qweight", ".weight"), (".weight_packed", ".weight"), ("_blocks", "")):
        if name.endswith(suffix):
            return name[: -len(suffix)] + logical
    return name


def _looks_quantized(ref: TensorRef, by_name: Mapping[str, TensorRef]) -> bool:
    """A tensor only a quantized checkpoint has: a companion, a packed integer weight, or a low-precision
    float weight with a scale beside it."""
    name = ref.name
    if name.endswith(COMPANION_SUFFIXES) or _QUANT_STATE.search(name):
        return True
    if name.endswith(".weight") and ref.dtype.name in LOW_PRECISION and len(ref.shape) >= 2:
        return any(name + s in by_name for s in ("_scale", "_scale_inv", "_scale_2"))
    if name.endswith(".weight") and ref.dtype.kind == "int" and len(ref.shape) >= 2:
        return True
    return name.endswith(".weight") and ref.dtype.name == "U8" and len(ref.shape) == 2 and ref.shape[-1] == 1


def _method_from_names(suspicious: list[TensorRef], by_name: Mapping[str, TensorRef]) -> str:
    """The method when no config names it, from names that are unambiguous on their own."""
    names = [t.name for t in suspicious]
    if any(_QUANT_STATE.search(n) for n in names) or any(n.endswith(".SCB") for n in names):
        return "bitsandbytes"
    if all(n.endswith(("_blocks", "_scales")) for n in names):
        return "mxfp4"
    raise _refuse(
        f"{suspicious[0].name} looks quantized ({suspicious[0].dtype.name}), but config.json has no "
        "quantization_config saying how",
        None,
        "add the checkpoint's config.json (with its quantization_config), or fit the unquantized base model",
    )


# --- per method: is this tensor the codes of a quantized weight, and with what? --------------------------

Grouper = Callable[[TensorRef, Mapping[str, TensorRef], Mapping[str, Any], "ReadSmall | None"], "Quantized | None"]


def _companions(name: str, by_name: Mapping[str, TensorRef], roles: Mapping[str, str]) -> dict[str, TensorRef]:
    return {role: by_name[name + suffix] for role, suffix in roles.items() if name + suffix in by_name}


def _inputs(name: str, by_name: Mapping[str, TensorRef]) -> dict[str, TensorRef]:
    """Activation scales of the same layer: carried with the weight (listed, never loaded or fitted)."""
    base = name.rsplit(".", 1)[0]
    return {f"activation{s}": by_name[base + s] for s in ACTIVATION_SUFFIXES if base + s in by_name}


def _fp8_name(dtype: str) -> str:
    return {"F8_E4M3": "FP8 E4M3", "F8_E5M2": "FP8 E5M2", "I8": "INT8"}.get(dtype, dtype)


def _scaled_spec(method: str, codes: TensorRef, scale: TensorRef, block: tuple[int, int] | None, **params: Any):
    rows, cols = (codes.shape[-2], codes.shape[-1]) if len(codes.shape) > 1 else (1, codes.shape[-1])
    n_scale = math.prod(scale.shape)
    experts = math.prod(codes.shape[:-2]) if len(codes.shape) > 2 else 1
    if block is None:  # read the granularity off the scale's shape
        if n_scale == experts:
            block = (rows, cols)
        elif n_scale == experts * rows:
            block = (1, cols)
        else:
            return None
    bh, bw = block
    if bh >= rows and bw >= cols:
        fmt, how = "fp8-tensor", "per tensor"
    elif bh == 1 and bw >= cols:
        fmt, how = "fp8-channel", "per channel"
    else:
        fmt, how = "fp8-block", f"block {bh}x{bw}"
    zero = params.get("zero")
    kind = _fp8_name(codes.dtype.name)
    if codes.dtype.name in ("I8", "U8"):
        fmt = "int8"
    arithmetic = "(code - zero) * scale" if zero else "code * scale"
    return QuantSpec(fmt, method, 8, f"{kind}, {how}", f"float32: {arithmetic}", SOURCES[method], block=(bh, bw))


def _group_fp8(ref, by_name, qc, read_small):
    if not (ref.name.endswith(".weight") and ref.dtype.name in ("F8_E4M3", "F8_E5M2")):
        return None
    scale = by_name.get(ref.name + "_scale_inv") or by_name.get(ref.name + "_scale")
    if scale is None:
        raise _refuse(f"{ref.name} is {ref.dtype.name} but has no weight_scale_inv", "fp8")
    block = qc.get("weight_block_size")
    if block is not None and not (
        isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise _refuse(
            f"quantization_config.weight_block_size {block!r} is not two positive integers", "fp8", "fix config.json"
        )
    spec = _scaled_spec("fp8", ref, scale, tuple(block) if block else None)
    if spec is None:
        raise _refuse(
            f"{scale.name} has shape {list(scale.shape)}, which fits no FP8 scale layout of {ref.name}", "fp8"
        )
    _check_grid(ref, scale, spec)
    return Quantized(spec, ref, {"scale": scale, **_inputs(ref.name, by_name)}, ref.shape)


def _check_grid(ref: TensorRef, scale: TensorRef, spec: QuantSpec) -> None:
    rows, cols = (ref.shape[-2], ref.shape[-1]) if len(ref.shape) > 1 else (1, ref.shape[-1])
    bh, bw = spec.block or (rows, cols)
    experts = math.prod(ref.shape[:-2]) if len(ref.shape) > 2 else 1
    expected = experts * math.ceil(rows / bh) * math.ceil(cols / bw)
    if math.prod(scale.shape) != expected:
        raise _refuse(
            f"{scale.name} has {math.prod(scale.shape)} scales where a {bh}x{bw} grid over {ref.name}"
            f" {list(ref.shape)} has {expected}",
            spec.method,
            "check quantization_config's block size",
        )


def _group_fbgemm(ref, by_name, qc, read_small):
    if not (ref.name.endswith(".weight") and ref.dtype.name in ("F8_E4M3", "F8_E5M2")):
        return None
    scale = by_name.get(ref.name + "_scale")
    if scale is None:
        raise _refuse(f"{ref.name} is {ref.dtype.name} but has no weight_scale", "fbgemm_fp8")
    spec = _scaled_spec("fbgemm_fp8", ref, scale, None)
    if spec is None:
        raise _refuse(f"{scale.name} {list(scale.shape)} fits no FP8 scale layout of {ref.name}", "fbgemm_fp8")
    return Quantized(spec, ref, {"scale": scale, **_inputs(ref.name, by_name)}, ref.shape)


# compressed-tensors ----------------------------------------------------------------------------------


def _ct_scheme(module: str, qc: Mapping[str, Any]) -> dict[str, Any]:
    """The `weights` quantization args of the config group whose targets match `module` ({} if none)."""
    groups = qc.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, dict) else []:
        if not isinstance(group, dict):
            continue
        targets = group.get("targets") or []
        for target in targets:
            if not isinstance(target, str):
                continue
            if target.startswith("re:"):
                hit = re.match(target[3:], module) is not None
            else:  # a class name (Linear, ...) matches every quantized module; else an exact module name
                hit = target[:1].isupper() or target == module
            if hit:
                weights = group.get("weights") or {}
                return {**weights, "format": group.get("format") or qc.get("format")}
    return {}


def _fp4_spec(fmt: str, method: str, group: int, scaling: str, global_scale: str | None = None) -> QuantSpec:
    """MXFP4 or NVFP4 (`fmt`) as `method` stores it: E2M1 codes, one scale per `group` of them, applied as
    `scaling` says; NVFP4's tensor-wide scale divides ("divide") or multiplies ("multiply") the group scales."""
    return QuantSpec(
        fmt,
        method,
        4,
        f"{fmt.upper()}, group {group}",
        f"float32: e2m1(code) * {scaling}",
        SOURCES[method],
        group=group,
        params={} if global_scale is None else {"global": global_scale},
    )


def _group_ct(ref, by_name, qc, read_small):
    group: int | None  # the codes' group size; None: one scale per output channel
    name = ref.name
    if name.endswith(".weight_packed"):
        base = name[: -len("_packed")]
        module = base[: -len(".weight")]
        args = _ct_scheme(module, qc)
        if ref.dtype.name == "U8":  # NVFP4 or MXFP4: two E2M1 codes per byte
            roles = {"scale": "_scale", "global_scale": "_global_scale"}
            comps = _companions(base, by_name, roles)
            shape = (*ref.shape[:-1], ref.shape[-1] * 2)
            if "scale" in comps and "global_scale" not in comps and comps["scale"].dtype.name in ("U8", "F8_E8M0"):
                spec = _fp4_spec("mxfp4", "compressed-tensors", int(args.get("group_size") or 32), "2^(scale - 127)")
                return Quantized(spec, ref, {"scale": comps["scale"], **_inputs(base, by_name)}, shape)
            if set(comps) != set(roles):
                raise _refuse(f"{name}: NVFP4 codes without weight_scale and weight_global_scale", "compressed-tensors")
            group = int(args.get("group_size") or 16)
            spec = _fp4_spec("nvfp4", "compressed-tensors", group, "(fp8(scale) / global_scale)", global_scale="divide")
            return Quantized(spec, ref, {**comps, **_inputs(base, by_name)}, shape)
        if ref.dtype.name != "I32":
            raise _refuse(
                f"{name} is {ref.dtype.name}; compressed-tensors packs integers into I32", "compressed-tensors"
            )
        bits = int(args.get("num_bits") or 4)
        if bits not in (2, 4, 8):
            raise _refuse(f"{name}: {bits}-bit packing (codes straddle bytes)", "compressed-tensors")
        roles = {"scale": "_scale", "zero": "_zero_point", "g_idx": "_g_idx", "shape": "_shape"}
        comps = _companions(base, by_name, roles)
        if "scale" not in comps:
            raise _refuse(f"{name} has no weight_scale", "compressed-tensors")
        strategy = args.get("strategy") or ("group" if args.get("group_size") else "channel")
        group = int(args["group_size"]) if strategy == "group" and args.get("group_size") else None
        symmetric = bool(args.get("symmetric", "zero" not in comps))
        how = f"group {group}" if group else "per channel"
        spec = QuantSpec(
            "int-pack",
            "compressed-tensors",
            bits,
            f"INT{bits} (compressed-tensors), {how}",
            "float32: (code - zero) * scale" if not symmetric else "float32: code * scale",
            SOURCES["compressed-tensors"],
            group=group,
            params={"symmetric": symmetric, "strategy": strategy, "actorder": "g_idx" in comps},
        )
        shape = (*ref.shape[:-1], ref.shape[-1] * (32 // bits))
        # weight_shape is checked by the decoder (rows padded to whole words are refused there)
        return Quantized(spec, ref, {**comps, **_inputs(base, by_name)}, shape)
    if name.endswith(".weight") and ref.dtype.name in ("F8_E4M3", "F8_E5M2", "I8") and name + "_scale" in by_name:
        module = name[: -len(".weight")]
        args = _ct_scheme(module, qc)
        scale = by_name[name + "_scale"]
        strategy = args.get("strategy")
        rows, cols = (ref.shape[-2], ref.shape[-1]) if len(ref.shape) > 1 else (1, ref.shape[-1])
        block: tuple[int, int] | None
        if strategy == "tensor":
            block = (rows, cols)
        elif strategy == "channel":
            block = (1, cols)
        elif strategy == "block":
            structure = args.get("block_structure") or []
            block = tuple(int(x) for x in structure) if len(structure) == 2 else None  # type: ignore[assignment]
        elif strategy == "group" and args.get("group_size"):
            block = (1, int(args["group_size"]))
        else:
            block = None
        zero = by_name.get(name + "_zero_point")
        spec = _scaled_spec("compressed-tensors", ref, scale, block, zero=zero is not None)
        if spec is None:
            raise _refuse(f"{scale.name} {list(scale.shape)} fits no scale layout of {name}", "compressed-tensors")
        _check_grid(ref, scale, spec)
        comps = {"scale": scale, **({"zero": zero} if zero is not None else {})}
        g_idx = by_name.get(name + "_g_idx")
        if g_idx is not None:
            raise _refuse(f"{name}: 8-bit weights with activation ordering (weight_g_idx)", "compressed-tensors")
        return Quantized(spec, ref, {**comps, **_inputs(name, by_name)}, ref.shape)
    return None


# modelopt, MXFP4 --------------------------------------------------------------------------------------


def _group_modelopt(ref, by_name, qc, read_small):
    name = ref.name
    if not name.endswith(".weight"):
        return None
    if ref.dtype.name in ("F8_E4M3", "F8_E5M2") and name + "_scale" in by_name:
        scale = by_name[name + "_scale"]
        spec = _scaled_spec("modelopt", ref, scale, None)
        if spec is None:
            raise _refuse(f"{scale.name} {list(scale.shape)} fits no FP8 scale layout of {name}", "modelopt")
        return Quantized(spec, ref, {"scale": scale, **_inputs(name, by_name)}, ref.shape)
    if ref.dtype.name == "U8" and name + "_scale" in by_name and name + "_scale_2" in by_name:
        group = int(qc.get("group_size") or 16)
        spec = _fp4_spec("nvfp4", "modelopt", group, "fp8(scale) * weight_scale_2", global_scale="multiply")
        comps = {"scale": by_name[name + "_scale"], "global_scale": by_name[name + "_scale_2"]}
        return Quantized(spec, ref, {**comps, **_inputs(name, by_name)}, (*ref.shape[:-1], ref.shape[-1] * 2))
    return None


def _group_mxfp4(ref, by_name, qc, read_small):
    if not ref.name.endswith("_blocks"):
        return None
    base = ref.name[: -len("_blocks")]
    scale = by_name.get(base + "_scales")
    if scale is None or ref.dtype.name != "U8" or len(ref.shape) < 2 or ref.shape[-1] != 16:
        raise _refuse(
            f"{ref.name} ({ref.dtype.name}{list(ref.shape)}) is not an MXFP4 block tensor with its _scales", "mxfp4"
        )
    spec = _fp4_spec("mxfp4", "mxfp4", 32, "2^(scale - 127)")
    shape = (*ref.shape[:-2], ref.shape[-2] * 32)
    return Quantized(spec, ref, {"scale": scale}, shape)


# bitsandbytes -----------------------------------------------------------------------------------------


def _group_bnb(ref, by_name, qc, read_small):
    name = ref.name
    if not name.endswith(".weight"):
        return None
    if ref.dtype.name == "I8" and name[: -len("weight")] + "SCB" in by_name:
        spec = QuantSpec(
            "bnb-int8",
            "bitsandbytes",
            8,
            "bitsandbytes LLM.int8",
            "float32: code * SCB / 127",
            SOURCES["bitsandbytes"],
            block=(1, ref.shape[-1]),
        )
        return Quantized(spec, ref, {"scb": by_name[name[: -len("weight")] + "SCB"]}, ref.shape)
    states = [n for n in (f"{name}.quant_state.bitsandbytes__{t}" for t in ("nf4", "fp4")) if n in by_name]
    if not states:
        return None
    if read_small is None:
        raise _refuse(f"{name}: bitsandbytes 4-bit weights need their quant state read first", "bitsandbytes")
    from .formats.bnb import parse_quant_state

    state = parse_quant_state(bytes(read_small(by_name[states[0]])))
    roles = {
        "absmax": ".absmax",
        "quant_map": ".quant_map",
        "nested_absmax": ".nested_absmax",
        "nested_quant_map": ".nested_quant_map",
    }
    comps = _companions(name, by_name, roles)
    comps["quant_state"] = by_name[states[0]]
    if "absmax" not in comps or "quant_map" not in comps:
        raise _refuse(f"{name}: bitsandbytes 4-bit codes without absmax and quant_map", "bitsandbytes")
    nested = "nested_absmax" in comps
    quant_type = state["quant_type"]
    blocksize = int(state["blocksize"])
    label = f"bitsandbytes {quant_type.upper()}, block {blocksize}" + (", double quant" if nested else "")
    spec = QuantSpec(
        "bnb-4bit",
        "bitsandbytes",
        4,
        label,
        "float32: quant_map[code] * absmax[block]" + (" (absmax itself 8-bit, dequantized first)" if nested else ""),
        SOURCES["bitsandbytes"],
        group=blocksize,
        params={
            "quant_type": quant_type,
            "blocksize": blocksize,
            "nested": nested,
            "nested_blocksize": state.get("nested_blocksize"),
            "nested_offset": state.get("nested_offset"),
        },
    )
    shape = tuple(int(x) for x in state["shape"])
    return Quantized(spec, ref, comps, shape)


# GPTQ, AWQ --------------------------------------------------------------------------------------------


def _group_gptq(ref, by_name, qc, read_small):
    return _group_packed_linear("gptq", ref, by_name, qc)


def _group_awq(ref, by_name, qc, read_small):
    return _group_packed_linear("awq", ref, by_name, qc)


def _group_packed_linear(method: str, ref: TensorRef, by_name: Mapping[str, TensorRef], qc: Mapping[str, Any]):
    if not ref.name.endswith(".qweight"):
        return None
    base = ref.name[: -len(".qweight")]
    bits = int(qc.get("bits") or qc.get("w_bit") or 4)
    group = int(qc.get("group_size") or qc.get("q_group_size") or -1)
    comps = _companions(base, by_name, {"scales": ".scales", "qzeros": ".qzeros", "g_idx": ".g_idx"})
    missing = [role for role in ("scales", "qzeros") if role not in comps]
    if ref.dtype.name != "I32" or len(ref.shape) != 2 or missing:
        what = f"has no {' or '.join(missing)}" if missing else "is not a 2-D I32 tensor"
        raise _refuse(f"{method.upper()} weight {ref.name} ({ref.dtype.name}{list(ref.shape)}) {what}", method)
    if 32 % bits:
        raise _refuse(f"{ref.name}: {bits}-bit {method.upper()} packing (words are shared across values)", method)
    per = 32 // bits
    name = method.upper()
    if method == "gptq":
        fmt = str(qc.get("checkpoint_format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise _refuse(f"GPTQ checkpoint_format {fmt!r}", method)
        shape = (ref.shape[1], ref.shape[0] * per)
        params: dict[str, Any] = {
            "checkpoint_format": fmt,
            "desc_act": bool(qc.get("desc_act")),
            "sym": bool(qc.get("sym", True)),
        }
    else:
        version = str(qc.get("version") or "gemm").lower()
        if version != "gemm" or qc.get("zero_point") is False:
            raise _refuse(f"AWQ version {version!r}", method)
        shape = (ref.shape[1] * per, ref.shape[0])
        params = {"version": version}
    how = f"group {group}" if group > 0 else "one group per column"
    spec = QuantSpec(
        method,
        method,
        bits,
        f"{name} int{bits}, {how}",
        "float32: (code - zero) * scale",
        SOURCES[method],
        group=group if group > 0 else None,
        params=params,
    )
    return Quantized(spec, ref, comps, shape)


_GROUPERS: dict[str, Grouper] = {
    "fp8": _group_fp8,
    "fbgemm_fp8": _group_fbgemm,
    "compressed-tensors": _group_ct,
    "modelopt": _group_modelopt,
    "mxfp4": _group_mxfp4,
    "bitsandbytes": _group_bnb,
    "gptq": _group_gptq,
    "awq": _group_awq,
}


def describe(q: Quantized) -> dict[str, Any] | None:
    """The row's `dequantized` record of one weight: its format and how values were computed. None for GGUF:
    its records name the stored type in `dtype`, `quantization` and `note` (GGUF rows kept their fields when
    GGUF moved from whole-tensor dequantization to the stream's decoders)."""
    if q.spec.method == "gguf":
        return None
    return {**q.spec.to_json(), "stored": {role: ref.name for role, ref in {"codes": q.codes, **q.companions}.items()}}
