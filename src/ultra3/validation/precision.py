"""Mixed precision: what the GPU type can run, NVFP4 pitfalls, and gradient reduction with MTP.

`mixed_precision` is a Megatron-Bridge preset name (bf16_mixed, bf16_with_nvfp4_mixed,
nemotron_3_ultra_bf16_with_nvfp4_mixed, bf16_with_mxfp8_mixed, bf16_with_fp8_current_scaling_mixed, ...) or a
MixedPrecisionConfig-like dict. A name with "nvfp4" is NVFP4, "mxfp8" is MXFP8, any other "fp8" is FP8.

* NVFP4 trains on SM 10.0/10.3 only (Transformer Engine; no Hopper path): error elsewhere. MXFP8 needs SM ≥ 10.0,
  other FP8 SM ≥ 8.9.
* NVFP4 with model.fp8_recipe or model.fp8 set: error (FP4 and FP8 are exclusive; an inherited fp8_recipe caused
  MB PR#2764's memory spike).
* NVFP4 primary weights (fp4_param_gather) with Megatron-FSDP: error (no NVFP4 packed storage, MB PR#5920); with
  CUDA graphs: warning (OOM on GB300, MB#3500).
* ddp.grad_reduce_in_fp32=false with MTP layers: warning (the Ultra run diverged at ~8T tokens that way).
* NVFP4: a note with the layers that stay BF16, or a warning when none (or all) do; a warning when no module kind is
  kept in BF16 (precision.bf16_modules) or a glob of it matches no module. precision.<knob> off without NVFP4: warning.
* Tables: the precision of each layer and of each module kind (ultra3.precision_map).

Before the rules run, settle() adds what the job needs for its precision: the Transformer Engine knob env vars, and
FP32 gradient reduction with MTP under NVFP4/FP8 when no config layer sets ddp.grad_reduce_in_fp32.
"""

from __future__ import annotations

from ultra3.contract import NVFP4_CAPABILITIES
from ultra3.dotted import get
from ultra3.gpus import GPU_TYPES
from ultra3.precision_map import (
    BF16_MODULES,
    TE_KNOBS,
    knob_env,
    knob_values,
    layer_map,
    layer_rows,
    low_precision,
    module_rows,
    unmatched_globs,
)

from ..model_math import (
    NUM_LAYERS,
    bf16_layer_counts,
    flag,
    fp4_param_gather,
    gpu_type,
    is_int,
    pos_int,
    precision,
    precision_knob,
)

BLACKWELL = ", ".join(name for name, g in GPU_TYPES.items() if g.supports_nvfp4)
NVFP4_SM = "SM " + "/".join(f"{major}.{minor}" for major, minor in NVFP4_CAPABILITIES)
GRAD_REDUCE = "ddp.grad_reduce_in_fp32"
MIXED = "mixed_precision"
MTP = "model.mtp_num_layers"
PARAM_GATHER = (MIXED, "ddp.fp4_param_gather")  # what fp4_param_gather() reads
BF16_LAYER_KEYS = (MIXED, "model.first_last_layers_bf16", "model.num_layers_at_start_in_bf16",
                   "model.num_layers_at_end_in_bf16")  # what bf16_layer_counts() reads
FORCED = "the precision rules (MTP with NVFP4/FP8)"


def settle(cfg: dict, origin: dict[str, str], report) -> dict[str, object]:
    """What the job gets for its precision, as {dotted key: value} for the compile step to add: the knobs' env vars
    (set before Transformer Engine is imported, in every executor) and, with MTP under NVFP4/FP8, FP32 gradient
    reduction when no config layer set ddp.grad_reduce_in_fp32 (`origin` tells)."""
    added: dict[str, object] = {}
    for var, value in knob_env(cfg).items():
        key = f"run.env.{var}"
        if key in origin:
            knob = next(k.key for k in TE_KNOBS if k.env == var)
            report.error(key, f"{var} is exported from precision.{knob} (set in {origin[key]}); remove it and set "
                              f"precision.{knob}=true/false")
        added[key] = value
    prec = precision(cfg)
    mtp = get(cfg, "model.mtp_num_layers")
    if prec and (prec.fp8 or prec.nvfp4) and is_int(mtp) and mtp > 0 and GRAD_REDUCE not in origin:
        added[GRAD_REDUCE] = True
        report.note(GRAD_REDUCE, f"set to true by {FORCED}: with {mtp} MTP layers BF16 gradient reduction "
                                 "diverged Ultra pretraining at ~8T tokens; set it explicitly to choose otherwise")
    return added


def check(cfg: dict, report) -> None:
    _grad_reduce(cfg, report)
    prec = precision(cfg)
    if prec is None:
        return
    report.facts["precision"] = (low_precision(prec) or "bf16").lower()
    before = len(report.errors)
    _hardware(cfg, prec, report)
    if len(report.errors) == before:  # the GEMM widths matter once the GPU can run the precision at all
        _alignment(cfg, prec, report)
    _knobs(cfg, prec, report)
    if prec.nvfp4:
        _nvfp4(cfg, prec, report)
        _modules(cfg, report)
    layers = layer_map(cfg)
    if layers is not None:
        report.tables["precision by layer"] = layer_rows(cfg, layers)
        if True in layers.quantized:
            report.tables["precision by module"] = module_rows(cfg, layers)


def _grad_reduce(cfg: dict, report) -> None:
    mtp = get(cfg, MTP)
    if flag(cfg, GRAD_REDUCE) is False and is_int(mtp) and mtp > 0:
        report.warn(
            GRAD_REDUCE,
            f"BF16 gradient reduction with {mtp} MTP layers: Ultra pretraining diverged at ~8T tokens when the "
            "output layer's gradient accumulation dropped to BF16 (the MTP wgrad contributions were lost); "
            "keep ddp.grad_reduce_in_fp32=true",
            quoting=(MTP,),
        )


FP8_ALIGN = 16  # Transformer Engine's FP8/FP4 GEMMs take dimensions in multiples of 16


def gemm_widths(cfg: dict) -> dict[str, int]:
    """The output widths of the model's GEMMs per tensor-parallel rank, by what they are (known ones only)."""
    m = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    tp = pos_int(m.get("tensor_model_parallel_size")) or 1
    widths = {k: m.get(k) for k in ("hidden_size", "ffn_hidden_size", "moe_ffn_hidden_size",
                                     "moe_shared_expert_intermediate_size", "moe_latent_size")}
    heads, head_dim, groups, state = (m.get(k) for k in ("mamba_num_heads", "mamba_head_dim", "mamba_num_groups",
                                                          "mamba_state_dim"))
    if all(is_int(v) and v > 0 for v in (heads, head_dim, groups, state)):
        widths["Mamba in_proj (2·heads·head_dim + 2·groups·state_dim + heads)"] = \
            (2 * heads * head_dim + 2 * groups * state + heads) // tp
    return {k: v for k, v in widths.items() if is_int(v) and v > 0}


def unaligned(cfg: dict) -> dict[str, int]:
    return {k: v for k, v in gemm_widths(cfg).items() if v % FP8_ALIGN}


def _alignment(cfg: dict, prec, report) -> None:
    """FP8/FP4 GEMMs on widths that are not multiples of 16 fail in Transformer Engine at the first step."""
    if not (prec.fp8 or prec.nvfp4):
        return
    for what, width in unaligned(cfg).items():
        report.error("mixed_precision", f"{prec.name} runs the model's GEMMs in {'NVFP4' if prec.nvfp4 else 'FP8'}, "
                                        f"which needs widths in multiples of {FP8_ALIGN}, but {what} is {width}; "
                                        "set mixed_precision=bf16_mixed or change that size",
                     quoting=tuple(f"model.{k}" for k in ("mamba_num_heads", "mamba_head_dim", "mamba_num_groups",
                                                            "mamba_state_dim", "tensor_model_parallel_size")
                                   ) if what.startswith("Mamba") else (f"model.{what}",))


def _hardware(cfg: dict, prec, report) -> None:
    gpu = gpu_type(cfg)
    if gpu is None:
        return  # cluster.check warned once
    cc = f"SM {gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
    fp8_fits = not unaligned(cfg) and gpu.compute_capability >= (8, 9)  # only a suggestion the dry run passes
    if prec.nvfp4 and not gpu.supports_nvfp4:
        report.error(
            "mixed_precision",
            f"{prec.name} trains in NVFP4, which needs {NVFP4_SM} (Blackwell), but {gpu.name} is {cc}; "
            f"use a Blackwell profile ({BLACKWELL}), or set mixed_precision=bf16_mixed (BF16)"
            + (" or bf16_with_fp8_current_scaling_mixed (FP8, SM 8.9+)" if fp8_fits else ""),
            quoting=("cluster.gpu",),
        )
    elif prec.mxfp8 and gpu.compute_capability < (10, 0):
        report.error(
            "mixed_precision",
            f"{prec.name} trains in MXFP8, which needs SM 10.0+ (Blackwell), but {gpu.name} is {cc}; use a "
            f"Blackwell profile ({BLACKWELL}) or set mixed_precision="
            + ("bf16_with_fp8_current_scaling_mixed or bf16_mixed" if fp8_fits else "bf16_mixed"),
            quoting=("cluster.gpu",),
        )
    elif prec.fp8 and not prec.mxfp8 and gpu.compute_capability < (8, 9):
        report.error(
            "mixed_precision",
            f"{prec.name} trains in FP8, which needs SM 8.9+, but {gpu.name} is {cc}; set mixed_precision=bf16_mixed",
            quoting=("cluster.gpu",),
        )


def _nvfp4(cfg: dict, prec, report) -> None:
    recipe = precision_knob(cfg, prec, "fp8_recipe")
    if recipe is not None:
        report.error(
            "model.fp8_recipe",
            f"fp8_recipe={recipe!r} is set with NVFP4 ({prec.name}); FP4 recipes need fp8_recipe=None (an inherited "
            "fp8_recipe caused the NVFP4 memory spike of MB PR#2764); set model.fp8_recipe=null",
            quoting=(MIXED,),
        )
    fp8 = precision_knob(cfg, prec, "fp8")
    if fp8 not in (None, False):
        report.error(
            "model.fp8",
            f"fp8={fp8!r} is set with NVFP4 ({prec.name}); FP4 and FP8 are exclusive: unset model.fp8",
            quoting=(MIXED,),
        )

    if fp4_param_gather(cfg, prec):
        for key in ("ddp.use_megatron_fsdp", "dist.use_megatron_fsdp"):
            if flag(cfg, key):
                report.error(
                    key,
                    "Megatron-FSDP has no NVFP4 packed storage (MB PR#5920), so NVFP4 primary weights fault; "
                    "set ddp.fp4_param_gather=false (as MB's Ultra NVFP4 FSDP recipe does) or turn FSDP off",
                    quoting=PARAM_GATHER,
                )
                break
        graphs = get(cfg, "model.cuda_graph_impl")
        impl = isinstance(graphs, str) and graphs.lower() != "none"
        if impl or flag(cfg, "model.enable_cuda_graph"):
            report.warn(
                "model.cuda_graph_impl",
                "fp4_param_gather with CUDA graphs ran out of memory on GB300 (MB#3500); "
                "set ddp.fp4_param_gather=false as MB's performance recipes do, or turn CUDA graphs off",
                quoting=(*PARAM_GATHER, *(() if impl else ("model.enable_cuda_graph",))),
            )

    layers = pos_int(get(cfg, NUM_LAYERS))
    if layers is None:
        return
    start, end = bf16_layer_counts(cfg, prec, layers)
    report.facts["bf16_layers"] = {"start": start, "end": end}
    if start + end == 0:
        suggested = max(1, round(0.15 * layers))
        report.warn(
            "model.first_last_layers_bf16",
            f"all {layers} layers train in NVFP4; quantizing everything diverged in NVIDIA's NVFP4 study and Ultra "
            f"keeps its last 15% in BF16: set model.first_last_layers_bf16=true and "
            f"model.num_layers_at_end_in_bf16={suggested}",
            quoting=(NUM_LAYERS, *BF16_LAYER_KEYS),
        )
        return
    if start + end >= layers:
        report.warn(
            "model.num_layers_at_end_in_bf16",
            f"all {layers} layers stay BF16 (start {start} + end {end}), so NVFP4 has no effect; lower "
            "num_layers_at_start_in_bf16/num_layers_at_end_in_bf16 or use mixed_precision=bf16_mixed",
            quoting=(NUM_LAYERS, *BF16_LAYER_KEYS),
        )
        return
    spans = ([f"1-{start}"] if start else []) + ([f"{layers - end + 1}-{layers}"] if end else [])
    report.note(
        "model.num_layers_at_end_in_bf16",
        f"NVFP4 layer set: layers {' and '.join(spans)} ({start + end} of {layers}) stay BF16, layers "
        f"{start + 1}-{layers - end} train in NVFP4; embedding and output layer are never NVFP4",
    )


def _knobs(cfg: dict, prec, report) -> None:
    if prec.nvfp4:
        return
    for key, on in knob_values(cfg).items():
        if not on:
            report.warn(f"precision.{key}", f"precision.{key}=false has no effect: {prec.name} does not train in "
                                            "NVFP4; remove it or use an NVFP4 mixed_precision", quoting=(MIXED,))


def _modules(cfg: dict, report) -> None:
    if not get(cfg, BF16_MODULES):
        report.warn(BF16_MODULES, "no module kind is kept in BF16, so attention, Mamba-2 out_proj, latent "
                                  "projections and MTP train in NVFP4; the Ultra tech report keeps them in higher "
                                  "precision: list their globs as configs/pretrain/default.yaml does")
    for glob in unmatched_globs(cfg):
        report.warn(BF16_MODULES, f"{glob!r} matches none of the Megatron-Core module paths (e.g. "
                                  "decoder.layers.0.mixer.out_proj, mtp.layers.0.eh_proj), so it keeps nothing in "
                                  "BF16; fix the glob")
