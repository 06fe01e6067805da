"""The precision of each layer and each module kind of a training config, and the Transformer Engine NVFP4 knobs.

Pure Python over the resolved config (stdlib only, no I/O), shared by the validation rules and the dry run:

* layers: Megatron-Core runs every layer of the hybrid pattern in NVFP4 except the first num_layers_at_start_in_bf16
  and the last num_layers_at_end_in_bf16 (when first_last_layers_bf16), as the Megatron-Bridge preset sets them.
* modules: Megatron-Core's per-module quantization recipe (TransformerConfig.quant_recipe) forces the module paths
  matching a glob of precision.bf16_modules to BF16; the globs are matched here with fnmatch, as its GlobMatcher
  does, against the paths Megatron-Core gives each Transformer Engine linear. Embedding, router and output layer are
  not Transformer Engine linears and never run in NVFP4.
* knobs: NVFP4BlockScaling reads its options from environment variables when Transformer Engine is imported, so the
  job exports them (TE_KNOBS) before the runtime starts.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from .dotted import get
from .model_math import PATTERN_SYMBOLS, Precision, bf16_layer_counts, pos_int, precision
from .model_params import layer_types

BF16_MODULES = "precision.bf16_modules"


@dataclass(frozen=True)
class Knob:
    key: str  # precision.<key>: true (the default) keeps the technique on
    env: str  # the Transformer Engine env var that turns it off with "1" (read by NVFP4BlockScaling at import)
    what: str


TE_KNOBS = (
    Knob("random_hadamard_transform", "NVTE_NVFP4_DISABLE_RHT", "random Hadamard transform"),
    Knob("stochastic_rounding", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "stochastic rounding"),
    Knob("weight_2d_blocks", "NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "2D weight blocks"),
)


def knob_values(cfg: dict) -> dict[str, bool]:
    """precision.<knob> -> on/off; unset means on, Transformer Engine's default and the tech report's recipe."""
    return {k.key: get(cfg, f"precision.{k.key}") is not False for k in TE_KNOBS}


def knob_env(cfg: dict) -> dict[str, str]:
    """The env vars of the knobs for an NVFP4 job ({} otherwise): "1" turns a technique off, "0" keeps it on."""
    prec = precision(cfg)
    if prec is None or not prec.nvfp4:
        return {}
    values = knob_values(cfg)
    return {k.env: "0" if values[k.key] else "1" for k in TE_KNOBS}


@dataclass(frozen=True)
class ModuleKind:
    name: str
    layer: str | None  # the pattern symbol of the layers that hold it; None: outside the decoder layers
    paths: tuple[str, ...] = ()  # its Transformer Engine linears as Megatron-Core names them; () = none
    fixed: str = ""  # the precision of a module without Transformer Engine linears, and why
    needs: str = ""  # the model key without which the module does not exist


MODULE_KINDS = (
    ModuleKind("embedding", None, fixed="BF16   a table lookup, never quantized"),
    ModuleKind("Mamba-2 in_proj", "M", ("decoder.layers.0.mixer.in_proj",)),
    ModuleKind("Mamba-2 out_proj", "M", ("decoder.layers.0.mixer.out_proj",)),
    ModuleKind("attention QKV", "*", ("decoder.layers.0.self_attention.linear_qkv",)),
    ModuleKind("attention out", "*", ("decoder.layers.0.self_attention.linear_proj",)),
    ModuleKind("latent projections", "E",
               ("decoder.layers.0.mlp.fc1_latent_proj", "decoder.layers.0.mlp.fc2_latent_proj"),
               needs="model.moe_latent_size"),
    ModuleKind("routed experts", "E",
               ("decoder.layers.0.mlp.experts.linear_fc1", "decoder.layers.0.mlp.experts.linear_fc2"),
               needs="model.num_moe_experts"),
    ModuleKind("shared expert", "E",
               ("decoder.layers.0.mlp.shared_experts.linear_fc1", "decoder.layers.0.mlp.shared_experts.linear_fc2"),
               needs="model.moe_shared_expert_intermediate_size"),
    ModuleKind("router", "E", fixed="FP32   not a Transformer Engine linear (moe_router_dtype=fp32)",
               needs="model.num_moe_experts"),
    ModuleKind("MTP", None, ("mtp.layers.0.eh_proj", "mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_qkv",
                             "mtp.layers.0.mtp_model_layer.layers.1.mlp.experts.linear_fc1"),
               needs="model.mtp_num_layers"),
    ModuleKind("output layer", None, fixed="BF16   a Megatron-Core ColumnParallelLinear, never quantized"),
)
MODULE_PATHS = tuple(p for kind in MODULE_KINDS for p in kind.paths)


def bf16_globs(cfg: dict) -> list[str]:
    globs = get(cfg, BF16_MODULES)
    return [g for g in globs if isinstance(g, str)] if isinstance(globs, list) else []


def forced_bf16(path: str, globs: list[str]) -> str | None:
    """The first glob that matches `path` (Megatron-Core's matchers go in order), None when none does."""
    return next((g for g in globs if fnmatch.fnmatch(path, g)), None)


def unmatched_globs(cfg: dict) -> list[str]:
    """The globs of precision.bf16_modules that match none of the known module paths."""
    return [g for g in bf16_globs(cfg) if not any(fnmatch.fnmatch(p, g) for p in MODULE_PATHS)]


def low_precision(prec: Precision | None) -> str | None:
    """The format the quantized GEMMs run in; None for BF16."""
    if prec is None:
        return None
    return "NVFP4" if prec.nvfp4 else "MXFP8" if prec.mxfp8 else "FP8" if prec.fp8 else None


@dataclass(frozen=True)
class LayerMap:
    symbols: list[str]  # the main decoder's layer types, one pattern symbol per layer
    quantized: list[bool]  # per layer: runs its GEMMs in NVFP4
    source: str  # where the layer types come from
    start: int  # BF16 layers at the start
    end: int  # BF16 layers at the end


def layer_map(cfg: dict) -> LayerMap | None:
    """Per layer of the main decoder: its type and whether it trains in NVFP4; None without model.num_layers."""
    layers = pos_int(get(cfg, "model.num_layers"))
    if layers is None:
        return None
    symbols, source = layer_types(cfg, layers)
    prec = precision(cfg)
    start, end = bf16_layer_counts(cfg, prec, len(symbols)) if prec and prec.nvfp4 else (0, 0)
    quantized = [bool(prec and prec.nvfp4) and start <= i < len(symbols) - end for i in range(len(symbols))]
    return LayerMap(symbols, quantized, source, start, end)


def _mix(symbols: list[str]) -> str:
    counts = {s: symbols.count(s) for s in dict.fromkeys(symbols)}
    return ", ".join(f"{n} {PATTERN_SYMBOLS.get(s, s)}" for s, n in counts.items())


def layer_rows(cfg: dict, m: LayerMap) -> list[tuple[str, str]]:
    """The layer table: runs of equal precision and, under NVFP4, the one-character-per-layer map."""
    prec = precision(cfg)
    name = prec.name if prec else "unset"
    rows = [("mixed_precision", name)]
    low = low_precision(prec)
    if low and low != "NVFP4":
        rows.append(("layers", f"{low} except the BF16 layers {name} sets (the layer map is drawn for NVFP4 and BF16)"))
        return rows
    if low:
        values = knob_values(cfg)
        rows.append(("NVFP4 knobs", ", ".join(f"{k.what} {'on' if values[k.key] else 'OFF'}" for k in TE_KNOBS)))
    i = 0
    while i < len(m.symbols):
        j = i
        while j < len(m.symbols) and m.quantized[j] == m.quantized[i]:
            j += 1
        why = "" if m.quantized[i] or not low else (
            f" (first {m.start}: num_layers_at_start_in_bf16)" if i == 0
            else f" (last {m.end}: num_layers_at_end_in_bf16)")
        rows.append((f"layers {i + 1}-{j}", f"{'NVFP4' if m.quantized[i] else 'BF16'}{why}: {_mix(m.symbols[i:j])}"))
        i = j
    if low:
        legend = ", ".join(f"{s} {PATTERN_SYMBOLS[s]}" for s in dict.fromkeys(m.symbols) if s in PATTERN_SYMBOLS)
        rows.append(("layer types", f"{''.join(m.symbols)}  ({legend}; {m.source})"))
        rows.append(("layer precision", f"{''.join('4' if q else 'B' for q in m.quantized)}  (4 NVFP4, B BF16)"))
    return rows


def module_rows(cfg: dict, m: LayerMap) -> list[tuple[str, str]]:
    """The module table of an NVFP4 run: each module kind of the model, its precision and why."""
    globs = bf16_globs(cfg)
    rows = []
    for kind in MODULE_KINDS:
        if kind.needs and not pos_int(get(cfg, kind.needs)):
            continue
        if kind.layer is not None and kind.layer not in m.symbols:
            continue
        rows.append((kind.name, kind.fixed or _module_precision(kind, m, globs)))
    return rows


def _module_precision(kind: ModuleKind, m: LayerMap, globs: list[str]) -> str:
    matched = [g for g in (forced_bf16(p, globs) for p in kind.paths) if g]
    if matched and len(matched) == len(kind.paths):
        return f"BF16   {BF16_MODULES}: {', '.join(dict.fromkeys(matched))}"
    partly = f"; {BF16_MODULES} forces {len(matched)} of its {len(kind.paths)} linears to BF16" if matched else ""
    if kind.layer is None:  # MTP: its block's layers run under the NVFP4 layer rule as layers 1, 2, ...
        return f"NVFP4  not in {BF16_MODULES}{partly}"
    of_type = [q for s, q in zip(m.symbols, m.quantized) if s == kind.layer]
    low = of_type.count(True)
    if low == 0:
        return "BF16"
    where = "every" if low == len(of_type) else f"{low} of the {len(of_type)}"
    return f"NVFP4  in {where} {PATTERN_SYMBOLS[kind.layer]} layer{'s' if len(of_type) > 1 else ''}{partly}"
