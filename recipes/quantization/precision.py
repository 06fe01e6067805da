"""What a recipe does to a model, read from its quantizers: the format of every weight and input, a per-module
precision table, and the bits per element. It needs no weights: `plan()` applies a recipe to the model built
on the meta device from its config.json alone.

Bits per element: sum(numel x bits) / sum(numel) over the weights of the HF model class (MTP, which it does not
build, is excluded). NVFP4 costs 4 + 8/16 = 4.5 bits (an E2M1 code and its share of the E4M3 scale of a block
of 16), FP8 8 bits, anything unquantized 16 (BF16); per-tensor FP32 scales are negligible and not counted."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import quiet

BF16_BITS = 16.0


@dataclass(frozen=True)
class Format:
    name: str  # NVFP4, FP8, BF16, or e.g. INT4 / E3M2 / block-32 variants
    bits: float  # per element, block scales included


BF16 = Format("BF16", BF16_BITS)


def quantizer_format(q) -> Format:
    """The storage format a (weight or input) quantizer stands for; BF16 when it is off."""
    if q is None or not q.is_enabled:
        return BF16
    bits = q.num_bits
    if isinstance(bits, tuple):
        element, name = 1 + bits[0] + bits[1], f"E{bits[0]}M{bits[1]}"
    else:
        element, name = bits, f"INT{bits}"
    blocks = q.block_sizes or {}
    block, scale = blocks.get(-1), blocks.get("scale_bits")
    if not block:
        return Format("FP8" if name == "E4M3" else name, element)
    scale_bits = 1 + scale[0] + scale[1] if isinstance(scale, tuple) else 16
    if name == "E2M1" and block == 16 and scale == (4, 3):
        name = "NVFP4"
    elif name == "E2M1" and block == 32 and scale == (8, 0):
        name = "MXFP4"
    else:
        name = f"{name}/block{block}"
    return Format(name, element + scale_bits / block)


@dataclass
class Weight:
    module: str  # dotted module name
    param: str
    numel: int
    weight: Format
    input: Format


def weights(model) -> list[Weight]:
    """Every parameter with the format its quantizers give it: a Linear's `weight` (weight_quantizer), a fused
    expert tensor `up_proj` of shape [experts, ...] (up_proj_weight_quantizers, one per expert)."""
    out = []
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            per_expert = getattr(module, f"{pname}_weight_quantizers", None)
            if per_expert is not None:
                formats = {quantizer_format(q) for q in per_expert}
                weight = formats.pop() if len(formats) == 1 else Format("mixed", _mean_bits(per_expert))
                inp = quantizer_format(getattr(module, f"{pname}_input_quantizer", None))
            elif pname == "weight":
                weight = quantizer_format(getattr(module, "weight_quantizer", None))
                inp = quantizer_format(getattr(module, "input_quantizer", None))
            else:
                weight = inp = BF16
            out.append(Weight(name, pname, p.numel(), weight, inp))
    return out


def _mean_bits(quantizers) -> float:
    return sum(quantizer_format(q).bits for q in quantizers) / len(quantizers)


def bits_per_element(rows: list[Weight]) -> float:
    total = sum(w.numel for w in rows)
    return sum(w.numel * w.weight.bits for w in rows) / total if total else BF16_BITS


def kv_cache_format(model) -> Format:
    formats = {quantizer_format(q) for n, q in model.named_modules()
               if n.endswith(("k_bmm_quantizer", "v_bmm_quantizer"))}
    return formats.pop() if len(formats) == 1 else BF16


_LAYER = re.compile(r"\.(\d+)(?=\.|$)")


def table(rows: list[Weight]) -> list[dict]:
    """One row per kind of module (layer and expert indices folded into N): its layers, parameters, share
    of all parameters, and the weight and input formats."""
    total = sum(w.numel for w in rows) or 1
    groups: dict[tuple, dict] = {}
    for w in rows:
        kind = _LAYER.sub(".N", w.module) + ("" if w.param == "weight" else f".{w.param}")
        key = (kind, w.weight.name, w.input.name)
        g = groups.setdefault(key, {"module": kind, "weights": w.weight.name, "inputs": w.input.name,
                                    "tensors": 0, "params": 0})
        g["tensors"] += 1
        g["params"] += w.numel
    out = sorted(groups.values(), key=lambda g: -g["params"])
    for g in out:
        g["share"] = round(g["params"] / total, 6)
    return out


def summary(model) -> dict:
    """Bits per element, the share of parameters per format, the KV-cache format and the table."""
    rows = weights(model)
    total = sum(w.numel for w in rows) or 1
    shares: dict[str, float] = {}
    for w in rows:
        shares[w.weight.name] = shares.get(w.weight.name, 0) + w.numel / total
    return {"bits_per_element": round(bits_per_element(rows), 4), "parameters": total,
            "share_by_format": {k: round(v, 6) for k, v in sorted(shares.items())},
            "kv_cache": kv_cache_format(model).name, "modules": table(rows)}


def plan(config, quant_cfg: dict):
    """The model of `config` (a transformers config) on the meta device with the recipe's quantizers in place
    and nothing calibrated: what the recipe will do, without weights, in about a second."""
    import torch
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with quiet.prints():
        return mtq.quantize(model, {**quant_cfg, "algorithm": None}, None)


def enabled_quantizers(model) -> list[str]:
    from modelopt.torch.quantization.nn import TensorQuantizer

    return [n for n, q in model.named_modules() if isinstance(q, TensorQuantizer) and q.is_enabled]


def format_table(s: dict) -> str:
    """The summary as aligned text for the log and the report."""
    head = ("module", "tensors", "params", "share", "weights", "inputs")
    lines = [(g["module"], str(g["tensors"]), f"{g['params']:,}", f"{100 * g['share']:.2f}%", g["weights"],
              g["inputs"]) for g in s["modules"]]
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" if i in (0, 4, 5) else f"{{:>{w}}}" for i, w in enumerate(widths))
    shares = ", ".join(f"{k} {100 * v:.2f}%" for k, v in s["share_by_format"].items())
    return "\n".join([fmt.format(*head), *(fmt.format(*r) for r in lines),
                      f"bits per element {s['bits_per_element']:.3f} over {s['parameters']:,} parameters ({shares}); "
                      f"KV cache {s['kv_cache']}"])
