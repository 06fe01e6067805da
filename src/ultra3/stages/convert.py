"""`ultra3 convert hf-to-megatron` and `ultra3 convert megatron-to-hf`: a Hugging Face Nemotron-H checkpoint into a
Megatron-Bridge one (NVIDIA's released model, to fine-tune from) and back (a trained model, to publish), with
Megatron-Bridge's AutoBridge on the torchrun ranks, gated by the logits of the converted model against its source
(recipes/convert.py). Its schema, rules and cost model are here; the runtime is recipes/convert.py."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from ..stage import Input, Output, Parts, Stage

CHECKS = ("python_version", "image", "training_packages", "gpus", "inputs")
BYTES_PER_PARAM = 2  # BF16 weights, on both sides
HBM_SHARE = 0.9  # of a GPU's memory the weights may fill (the rest: CUDA context, the conversion's buffers)
# model.* keys a Megatron checkpoint's run_config.yaml must agree with (what its weights' shapes follow)
SHAPE_KEYS = ("num_layers", "hybrid_layer_pattern", "hidden_size", "ffn_hidden_size", "num_attention_heads",
              "num_query_groups", "kv_channels", "mamba_num_heads", "mamba_head_dim", "mamba_state_dim",
              "mamba_num_groups", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
              "moe_shared_expert_intermediate_size", "moe_latent_size", "mtp_num_layers", "vocab_size")


@cache  # the schema is built from the Megatron-Bridge record: once
def parts() -> Parts:
    return Parts(_schema(), _validate, _cost)


HF_TO_MEGATRON = Stage(
    ("convert", "hf-to-megatron"), "Import a Hugging Face Nemotron-H checkpoint into Megatron-Bridge, gated by "
    "logit parity.", "convert/hf_to_megatron", "convert", "torchrun", CHECKS, parts,
    inputs=(Input("model", "hf_model", ("hf-checkpoint",), unless="make_checkpoint"),),
    outputs=(Output("pretrain-checkpoint", "output_dir"),),
    examples=("ultra3 convert hf-to-megatron --batch mycluster --dry-run",
              "ultra3 convert hf-to-megatron --batch mycluster output_dir=/lustre/ckpt/ultra-base",
              "ultra3 convert hf-to-megatron -c tiny --run gpu-box"),
)
MEGATRON_TO_HF = Stage(
    ("convert", "megatron-to-hf"), "Export a Megatron-Bridge checkpoint to Hugging Face, gated by logit parity.",
    "convert/megatron_to_hf", "convert", "torchrun", CHECKS, parts,
    inputs=(Input("checkpoint", "megatron_checkpoint", ("sft-checkpoint", "pretrain-checkpoint")),),
    outputs=(Output("hf-checkpoint", "output_dir"),),
    examples=("ultra3 convert megatron-to-hf --batch mycluster --dry-run megatron_checkpoint=/lustre/ckpt/sft",
              "ultra3 convert megatron-to-hf --batch mycluster megatron_checkpoint=/lustre/ckpt/sft "
              "output_dir=/lustre/hf"),
)


# -- schema and rules ---------------------------------------------------------------------------------------------


def _schema() -> dict:
    from ..forms import Count
    from ..megatron_api import container_sections

    return {
        "run": None,
        "hf_model": str,  # hf-to-megatron: the source; megatron-to-hf: the model whose config the export takes
        "megatron_checkpoint": str,  # megatron-to-hf: the source (a checkpoint.save dir)
        "output_dir": str,
        "make_checkpoint": bool,  # build a seeded random hf_model of `model` first (the tiny flow)
        "tokenizer": str,  # tokenizer.json of a made checkpoint
        "seed": int,
        "parity": {"tokens": Count(1), "data": str, "max_relative_error": float, "min_top1": float},
        "model": container_sections()["model"],  # the layout the Megatron side runs at, and the shape
    }


def _validate(cfg: dict, report) -> None:
    _output_dir(cfg, report)
    _hf_model(cfg, report)
    if (cfg.get("job") or {}).get("stage") == MEGATRON_TO_HF.name:
        _checkpoint(cfg, report)
    _parity(cfg, report)
    from ..validation import parallelism

    parallelism.check(cfg, report)
    _memory(cfg, report)


def _local(path: Any) -> str | None:
    """The path on this machine of a value that is one (not a hub id, not a placeholder of the job's dir)."""
    if isinstance(path, str) and path.startswith(("/", "~", "./", "../")):
        return os.path.expanduser(path)
    return None


def _refuse(cfg: dict, key: str, problem: str, fix: str, report, seen: bool = True) -> None:
    """An error where the job runs on this machine, or where this machine sees the path (`seen`) and submits from the
    cluster's login node (no run.host); over SSH, or for a path not here, a warning: the cluster may see another file
    system, and the job's runtime checks again before it converts."""
    from ..dotted import get
    from ..schema import where_from

    text = f"{problem}{where_from(key, report.origin)}; {fix}"
    if get(cfg, "job.runs_here") or (seen and not get(cfg, "run.host")):
        report.error(key, text)
    else:
        report.warn(key, f"{text} (on this machine; the job checks again before converting)")


def _output_dir(cfg: dict, report) -> None:
    out = cfg.get("output_dir")
    if not out:
        report.error("output_dir", "output_dir is not set; set where the converted checkpoint goes")
        return
    path = _local(out)
    if path and os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        _refuse(cfg, "output_dir", f"{out} exists and is not an empty directory", "choose a new output_dir", report)


def _hf_model(cfg: dict, report) -> None:
    path = _local(cfg.get("hf_model"))
    if not path or cfg.get("make_checkpoint") or not os.path.exists(path):
        return  # a hub id, made by the job, or missing: the artifact resolver's error (ultra3.artifacts)
    from ..contract import read_small

    if not os.path.isdir(path):
        _refuse(cfg, "hf_model", f"{cfg['hf_model']} is not a directory", "give a Hugging Face model dir or a hub "
                "id", report)
        return
    try:
        import json

        model_type = json.loads(read_small(os.path.join(path, "config.json"))).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != "nemotron_h":
        _refuse(cfg, "hf_model", f"{cfg['hf_model']} is not a Nemotron-H Hugging Face checkpoint (its config.json "
                f"says model_type {model_type!r}, not 'nemotron_h')", "give a Nemotron-H model dir", report)


def _checkpoint(cfg: dict, report) -> None:
    """A local Megatron checkpoint: its tracker names an iteration whose run_config.yaml has our model's shape."""
    path = _local(cfg.get("megatron_checkpoint"))
    if not path or not os.path.isdir(path):
        return  # a missing path is the artifact resolver's error (ultra3.artifacts)
    from ..contract import checkpoint_iteration, read_small

    iteration = checkpoint_iteration(path)
    try:
        run_config = read_small(os.path.join(path, f"iter_{iteration:07d}", "run_config.yaml"))
    except (OSError, ValueError, TypeError):  # TypeError: no tracker
        _refuse(cfg, "megatron_checkpoint", f"{cfg['megatron_checkpoint']} is not a Megatron-Bridge checkpoint "
                f"(a tracker and an iter_NNNNNNN/ with its run_config.yaml)", "give the checkpoint.save dir "
                "of a pretrain/sft job, or the output_dir of `ultra3 convert hf-to-megatron`", report)
        return
    import yaml

    saved = (yaml.safe_load(run_config) or {}).get("model") or {}
    ours = cfg.get("model") or {}
    differ = [f"{k} {saved[k]!r} (config: {ours[k]!r})" for k in SHAPE_KEYS
              if ours.get(k) is not None and k in saved and _shape(saved[k]) != _shape(ours[k])]
    if differ:
        _refuse(cfg, "megatron_checkpoint", f"{cfg['megatron_checkpoint']} holds another model: "
                f"{', '.join(differ[:3])}", "pick the config of the model it holds (-c), or set model.* to it",
                report)


def _shape(value: Any) -> Any:
    """A layer pattern without its pipeline splits ('|') and the MTP block Megatron-Bridge appends when it saves
    ('MEM*EME/*E/*E'), so neither a layout change nor the save is a model change."""
    return value.replace("|", "").split("/")[0] if isinstance(value, str) else value


def _parity(cfg: dict, report) -> None:
    parity = cfg.get("parity") or {}
    rel, top1 = parity.get("max_relative_error"), parity.get("min_top1")
    if isinstance(rel, (int, float)) and not 0 < rel < 1:
        report.error("parity.max_relative_error", f"{rel!r} is not between 0 and 1 (a share of the logits' norm)")
    if isinstance(top1, (int, float)) and not 0 <= top1 <= 1:
        report.error("parity.min_top1", f"{top1!r} is not between 0 and 1 (a share of the tokens)")
    data = parity.get("data")
    from ..paths import RECIPES_DIR

    if isinstance(data, str) and not os.path.exists(RECIPES_DIR.parent / os.path.expanduser(data)):  # repo-relative
        _refuse(cfg, "parity.data", f"{data} does not exist", "give a JSONL(.gz) of held-out text", report, seen=False)


def _weights(cfg: dict) -> tuple[float, float, int] | None:
    """(BF16 bytes of weights on the busiest GPU of the Megatron side, of the whole model, GPUs) or None when the
    model's shape is not known."""
    from ..model_math import pos_int
    from ..model_params import count, dims, layer_types

    model = cfg.get("model") or {}
    layers = pos_int(model.get("num_layers"))
    d, _ = dims(cfg)
    if d is None or layers is None:
        return None
    params = count(cfg, d, layer_types(cfg, layers)[0])
    split = {k: pos_int(model.get(f"{k}_model_parallel_size")) or 1 for k in ("tensor", "pipeline", "expert")}
    etp = pos_int(model.get("expert_tensor_parallel_size")) or 1
    per_gpu = params.dense / (split["tensor"] * split["pipeline"]) + \
        params.expert / (split["expert"] * etp * split["pipeline"])
    run = cfg.get("run") or {}
    gpus = (pos_int(run.get("nodes")) or 1) * (pos_int(run.get("gpus_per_node")) or 0)
    return per_gpu * BYTES_PER_PARAM, params.total * BYTES_PER_PARAM, gpus


def _memory(cfg: dict, report) -> None:
    """The Megatron side's weights on its busiest GPU against the GPU's memory; the table shows the figures."""
    from ..gpus import GPU_TYPES
    from ..model_math import pos_int

    sizes = _weights(cfg)
    if sizes is None:
        return
    per_gpu, total, gpus = sizes
    gpu = GPU_TYPES.get(str((cfg.get("cluster") or {}).get("gpu")))
    rows = [("model weights (BF16)", f"{total / 1e9:,.1f} GB"), ("busiest GPU holds", f"{per_gpu / 1e9:,.1f} GB"),
            ("GPUs", str(gpus))]
    if gpu:
        rows.append(("GPU memory", f"{gpu.memory_gb:g} GB ({gpu.name})"))
        node = gpu.memory_gb * (pos_int((cfg.get("run") or {}).get("gpus_per_node")) or 1)
        rows.append(("parity: HF model on node 0", f"{total / 1e9:,.1f} GB of {node:,.0f} GB GPU memory"))
        if total / 1e9 > HBM_SHARE * node:
            report.warn("parity.tokens", f"the gate's Hugging Face model ({total / 1e9:,.0f} GB) does not fit the "
                        f"first node's GPUs ({node:,.0f} GB): the rest is offloaded to CPU memory, slow and needing "
                        "that much host memory; use a profile of larger GPUs")
        if per_gpu / 1e9 > HBM_SHARE * gpu.memory_gb:
            report.error("model.pipeline_model_parallel_size", f"the busiest GPU would hold {per_gpu / 1e9:,.0f} GB of "
                         f"weights, over {HBM_SHARE:.0%} of a {gpu.name}'s {gpu.memory_gb:g} GB; raise "
                         "model.pipeline_model_parallel_size or model.expert_model_parallel_size (and run.nodes)")
    report.tables["conversion memory"] = rows


def _cost(config: dict, measured: list[dict]):
    """Reading and writing the checkpoint at the assumed per-node I/O rate, and the parity check's forward passes
    (both models, 2 FLOPs per active parameter per token) at the calibration MFU."""
    from ..cost import (CALIBRATION_MFU, IO_BYTES_PER_S_PER_NODE, Estimate, _bytes, _from_measured, _gpu_rate, _gpus,
                        _stage, _unknown)
    from ..model_math import pos_int

    stage, gpus = _stage(config), _gpus(config)
    if found := _from_measured(stage, measured, None, None, gpus):
        return found
    sizes = _weights(config)
    if sizes is None or gpus == 0:
        return _unknown(stage, "model.* does not give the model's shape" if sizes is None else "no GPU")
    _, total_bytes, _ = sizes
    rate, why, where = _gpu_rate(config, "bf16", CALIBRATION_MFU)
    if rate is None:
        return _unknown(stage, why)
    nodes = pos_int(config["run"].get("nodes")) or 1
    tokens = pos_int((config.get("parity") or {}).get("tokens")) or 0
    io_s = 2 * total_bytes / (IO_BYTES_PER_S_PER_NODE * nodes)
    forward_s = 2 * 2 * (total_bytes / BYTES_PER_PARAM) * tokens / (rate * gpus)  # upper bound: all params active
    wall = io_s + forward_s
    basis = (f"{_bytes(2 * total_bytes)} checkpoint read and write at {IO_BYTES_PER_S_PER_NODE / 1e9:g} GB/s per node "
             f"(assumed), + parity forward passes of both models over {tokens} tokens at {CALIBRATION_MFU:.0%} MFU of "
             f"{where}")
    return Estimate(stage, wall / 3600, wall * gpus / 3600, None, basis)
