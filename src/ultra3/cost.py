"""What a job will cost, estimated before it is submitted: wall time and GPU-hours (CPU core-hours for CPU
stages) from the config's token or step budget and a stated throughput model, or, when an earlier run of the
same config completed, from its measured rate. Each stage's module gives its model (`Parts.cost`): one
per kind of work, `(config, measured) -> Estimate`, where `measured` are the artifact manifests
(recipes/contract.py) of earlier jobs of the same stage and config digest, newest first.

Training model FLOPs per token (forward and backward, recomputation not counted):
    6 x (active params + each MTP depth's block and output layer) + 6 x seq x heads x kv_channels per attention
    layer (causal: half the seq x seq scores); Mamba-2 scans and norms are left out.
For Ultra at seq 8192 that is 359.7 GFLOP/token; NVIDIA's published 1,281 model TFLOP/s at 3,552 tokens/s per
GPU (field.md §3.4) make 360.6.

Stdlib only (the dry run stays fast); docs/cost.md lists every figure with its source.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .dotted import get
from . import model_params as P
from .model_math import fmt_count, number, pos_int, precision, slurm_seconds

# Dense (no sparsity) tensor-core peak per GPU, TFLOP/s. BF16 and FP8: the datasheet values of field.md §3.4.
# NVFP4: NVIDIA's datasheets: HGX B200 144 PFLOP/s sparse FP4 over 8 GPUs, GB200 NVL72 1,440 sparse over 72,
# GB300 NVL72 1,080 dense over 72. Hopper has no FP4 tensor cores.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "a100": {"bf16": 312},  # the A100 datasheet's dense BF16; Ampere has no FP8 tensor cores
    "h100": {"bf16": 989, "fp8": 1979},
    "h200": {"bf16": 989, "fp8": 1979},
    "b200": {"bf16": 2250, "fp8": 4500, "nvfp4": 9000},
    "gb200": {"bf16": 2500, "fp8": 5000, "nvfp4": 10000},
    "gb300": {"bf16": 2500, "fp8": 5000, "nvfp4": 15000},
}
PRECISION_NAMES = {"nvfp4": "NVFP4", "fp8": "FP8", "bf16": "BF16"}

# Model FLOP/s over the peak of the precision the GEMMs run in (field.md §3.4, Megatron-Bridge perf summary
# 26.08, Ultra at seq 8192):
# * nvfp4: Ultra MXFP8 does 1,281 TFLOP/s per GB300 and 923 per GB200; NVFP4 adds 4% on hybrid MoE (Super
#   on GB300: 864 vs 831), so 1,332 / 15,000 = 8.9% and 960 / 10,000 = 9.6% of the NVFP4 peak.
# * fp8: the same runs are 26% (GB300) and 18% (GB200) of the FP8 peak: their middle.
# * bf16: below those runs' 51% / 37% of the BF16 peak; fine-grained BF16 MoE reaches 39% on H100
#   (Qwen2-57B-A14B, arXiv:2504.14960).
MFU = {"nvfp4": 0.09, "fp8": 0.22, "bf16": 0.35}
FULL_RECOMPUTE = 4 / 3  # full activation recompute runs each forward twice: 8 instead of 6 FLOPs per param

# Quantization: BF16 forward of one sequence at a time through the pipeline stages with ModelOpt's quantizers
# observing (no published rate: assumed), and the checkpoint read in BF16 (2 bytes/param) and written at about
# 0.6 bytes/param (Ultra: 1.1 TB -> 331 GB, field.md §4.3) at an assumed 1 GB/s per node.
CALIBRATION_MFU = 0.10
CHECKPOINT_BYTES_PER_PARAM = 2 + 0.6
IO_BYTES_PER_S_PER_NODE = 1e9

# Stopping at the time-limit signal (Parts.stop_time): one step, then one save of the BF16 weights and the distributed
# optimizer's FP32 main weights and two Adam moments (2 + 4 + 4 + 4 bytes/param) at IO_BYTES_PER_S_PER_NODE, written
# whole before the exit (an asynchronous save too: Megatron-Bridge waits for it), then the processes' exit.
SAVE_BYTES_PER_PARAM = 2 + 12
STOP_MARGIN_S = 30  # the step-end check of the signal, the exit of every rank
STOP_FLOOR_S = 60  # Slurm checks its timers about once a minute
# How long a save holds training up (the Young/Daly interval's cost): a synchronous one its whole write; an
# asynchronous one (Megatron-Bridge's Ultra recipes: checkpoint.async_save) the hand-over to its writer: the Ultra
# report, 60 s blocked -> <1 s (field.md §3.4)
ASYNC_BLOCK_S = 1.0


@dataclass
class Estimate:
    stage: str
    wall_hours: float | None
    gpu_hours: float | None
    cpu_core_hours: float | None
    basis: str  # the throughput model, or `measured: ...`
    unknown: str = ""  # why it cannot be estimated


# -- the models -------------------------------------------------------------------------------------------------


def training(config: dict, measured: list[dict]) -> Estimate:
    """Pretraining and fine-tuning: tokens = iterations x global batch x seq_length at 6 FLOPs per active param."""
    stage = _stage(config)
    gpus = _gpus(config)
    seq, gbs = pos_int(get(config, "model.seq_length")), pos_int(get(config, "train.global_batch_size"))
    samples = pos_int(get(config, "train.train_samples"))
    iters = pos_int(get(config, "train.train_iters")) or (samples // gbs if samples and gbs else None)
    if found := _from_measured(stage, measured, "iterations", iters, gpus):
        return found
    if gpus == 0:
        return _unknown(stage, "no GPU (run.gpus_per_node=0): CPU training is not modelled; a completed run of "
                               "this config gives a measured rate")
    if not (iters and gbs and seq):
        return _unknown(stage, "train.train_iters (or train_samples), train.global_batch_size and "
                               "model.seq_length must be set")
    flops, what = _training_flops(config, seq)
    if flops is None:
        return _unknown(stage, what)
    prec = _precision(config)
    rate, why, where = _gpu_rate(config, prec, MFU[prec])
    if rate is None:
        return _unknown(stage, why)
    recompute = get(config, "model.recompute_granularity") == "full"
    tokens = iters * gbs * seq
    gpu_s = tokens * flops * (FULL_RECOMPUTE if recompute else 1) / rate
    basis = (f"{what}, {fmt_count(tokens)} tokens, {MFU[prec]:.0%} MFU of {where}"
             + (", x4/3 for full recompute" if recompute else "") + " (assumed)")
    return Estimate(stage, gpu_s / gpus / 3600, gpu_s / 3600, None, basis)


def step_and_save(config: dict) -> tuple[float | None, float | None, int | None, str]:
    """(seconds of one step by the throughput model, of one synchronous save, the checkpoint's bytes, why a step is
    unknown); None where unknown."""
    iters = pos_int(get(config, "train.train_iters"))
    step = training(config, [])
    step_s = step.wall_hours * 3600 / iters if step.wall_hours and iters else None
    params, _ = _quantize_params(config)
    nodes = pos_int(get(config, "run.nodes")) or 1
    size = params[0] * SAVE_BYTES_PER_PARAM if params else None
    return step_s, size / (nodes * IO_BYTES_PER_S_PER_NODE) if size else None, size, step.unknown


def training_stop(config: dict, step_s: float | None = None, save_s: float | None = None) -> tuple[int, str]:
    """Seconds from the time-limit signal to a saved exit: one step + one save + the exit, by the model, or with a
    measured step_s or save_s (an earlier run's) in its place."""
    model_step, model_save, size, unknown = step_and_save(config)
    nodes = pos_int(get(config, "run.nodes")) or 1
    step = f"one step {_secs(step_s)} (measured)" if step_s else \
        f"one step {_secs(model_step)}" if model_step else f"one step (unknown: {unknown})"
    save = f"one save {_secs(save_s)} (measured)" if save_s else \
        f"one save {_secs(model_save)} ({_bytes(size)} at {IO_BYTES_PER_S_PER_NODE / 1e9:g} GB/s per node x {nodes}, " \
        "assumed)" if model_save is not None else "one save (unknown model size)"
    need = (step_s or model_step or 0) + (save_s or model_save or 0) + STOP_MARGIN_S
    floor = f", at least {STOP_FLOOR_S} s" if need < STOP_FLOOR_S else ""
    return max(STOP_FLOOR_S, math.ceil(need)), f"{step} + {save} + {STOP_MARGIN_S} s to exit{floor}"


def async_save(config: dict) -> bool:
    """Whether the job saves asynchronously: checkpoint.async_save, else the Ultra recipes' default (true), which
    the runtime turns off where nothing is saved."""
    value = get(config, "checkpoint.async_save")
    return bool(value if value is not None else get(config, "checkpoint.save"))


def blocking_save(config: dict) -> tuple[float | None, str]:
    """(seconds a save holds training up, how they were had): the model's whole write, or an asynchronous hand-over."""
    if async_save(config):
        return ASYNC_BLOCK_S, f"asynchronous, {_secs(ASYNC_BLOCK_S)} assumed (the Ultra report: under 1 s)"
    save_s = step_and_save(config)[1]
    return save_s, "synchronous, the whole write by the model" if save_s else "unknown model size"


def image_build(config: dict, measured: list[dict]) -> Estimate:
    """An image build: one node's CPUs, dominated by pulling the base and installing packages, which no model
    predicts: known from a completed build of the same config."""
    stage = _stage(config)
    if found := _from_measured(stage, measured, None, None, 0):
        return found
    return _unknown(stage, f"no completed build of this config yet; it runs up to its time limit "
                           f"({get(config, 'run.time')})")


def quantize(config: dict, measured: list[dict]) -> Estimate:
    """Post-training quantization: calibration forward passes (2 FLOPs per active param per token) plus the
    checkpoint's read and export."""
    stage = _stage(config)
    gpus = _gpus(config)
    if found := _from_measured(stage, measured, None, None, gpus):
        return found
    if gpus == 0:
        return _unknown(stage, "no GPU (run.gpus_per_node=0): CPU quantization is estimated only from a "
                               "completed run of this config")
    params, source = _quantize_params(config)
    if params is None:
        return _unknown(stage, source)
    total, active = params
    calib = config.get("calibration") or {}
    seq = pos_int(calib.get("seq_length")) or 4096  # the runtime's defaults (recipes/quantize.py)
    windows = (pos_int(calib.get("samples")) or 512) + 2 * (pos_int(calib.get("held_out")) or 16)  # held out: 2 passes
    tokens = windows * seq
    rate, why, where = _gpu_rate(config, "bf16", CALIBRATION_MFU)
    if rate is None:
        return _unknown(stage, why)
    nodes = pos_int(get(config, "run.nodes")) or 1
    io_bytes = total * CHECKPOINT_BYTES_PER_PARAM
    wall_s = 2 * active * tokens / (rate * gpus) + io_bytes / (IO_BYTES_PER_S_PER_NODE * nodes)
    basis = (f"2·{fmt_count(active)} active params/token ({source}) over {fmt_count(tokens)} calibration tokens at "
             f"{CALIBRATION_MFU:.0%} MFU of {where}, + {_bytes(io_bytes)} checkpoint I/O at "
             f"{IO_BYTES_PER_S_PER_NODE / 1e9:g} GB/s per node (assumed)")
    return Estimate(stage, wall_s / 3600, wall_s * gpus / 3600, None, basis)


def rl(config: dict, measured: list[dict]) -> Estimate:
    """RL steps are mostly rollouts, whose length the policy decides: no rate is modelled. A completed job of
    the same config gives a measured one; else the bound is the allocation itself, run.time on every GPU
    (NeMo RL checkpoints and the next job of the experiment resumes)."""
    stage = _stage(config)
    gpus = _gpus(config)
    if found := _from_measured(stage, measured, None, None, gpus):
        return found
    seconds = slurm_seconds(str(get(config, "run.time") or ""))
    if seconds is None:
        return _unknown(stage, "RL step time is not modelled; set run.time for the allocation's bound")
    hours = seconds / 3600
    return Estimate(stage, hours, hours * gpus, None, f"at most one allocation: run.time {get(config, 'run.time')} "
                                                      f"on {gpus} GPUs (the RL step rate is not modelled)")


def estimate(job) -> Estimate | None:
    """A compiled job's cost by its stage's model, from the measured runs of the same config digest in the
    job's artifact store when there are any."""
    measured = [m for m in job.store.manifests()
                if m.get("stage") == job.stage.name and m.get("config_digest") == job.digest]
    return job.stage.parts().cost(job.config, measured)


def total(estimates: list[Estimate], critical: list[str] | None = None) -> Estimate:
    """The sums of what is known, and which stages are unknown. A graph whose independent stages run side by side
    gives its critical path (stage names, ultra3.pipe_graph): the wall time is that path's alone."""
    known = [e for e in estimates if not e.unknown]
    missing = [e.stage for e in estimates if e.unknown]

    def add(field: str, over: list[Estimate]) -> float | None:
        values = [getattr(e, field) for e in over if getattr(e, field) is not None]
        return sum(values) if values else None

    basis = f"sum of {len(known)} of {len(estimates)} stages" + (f"; unknown: {', '.join(missing)}" if missing else "")
    on_path = known if critical is None else [e for e in known if e.stage in critical]
    if critical is not None:
        basis = f"wall: the critical path {' -> '.join(critical)}; GPU/core-h: {basis}"
    return Estimate("total", add("wall_hours", on_path), add("gpu_hours", known), add("cpu_core_hours", known), basis,
                    "" if known else f"no stage could be estimated ({len(missing)} unknown)")


def format_line(e: Estimate) -> str:
    """`pretrain   ~ 134 d wall, 2.5 M GPU-h   (basis)`, or the reason it is unknown."""
    if e.unknown:
        return f"{e.stage:<18} ? unknown: {e.unknown}"
    parts = [f"{_duration(e.wall_hours)} wall" if e.wall_hours is not None else "wall unknown"]
    if e.gpu_hours is not None:
        parts.append(_amount(e.gpu_hours, "GPU"))
    if e.cpu_core_hours is not None:
        parts.append(_amount(e.cpu_core_hours, "core"))
    return f"{e.stage:<18} ~ {', '.join(parts)}   ({e.basis})"


# -- pieces -----------------------------------------------------------------------------------------------------


def _stage(config: dict) -> str:
    return str(get(config, "job.stage", ""))


def _unknown(stage: str, why: str) -> Estimate:
    return Estimate(stage, None, None, None, "", why)


def _gpus(config: dict) -> int:
    nodes, per_node = get(config, "run.nodes", 1), get(config, "run.gpus_per_node", 0)
    return nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else 0


def _from_measured(stage: str, measured: list[dict], count_key: str | None, budget: int | None, gpus: int,
                   cores: int | None = None) -> Estimate | None:
    """The newest manifest with a duration, scaled by budget / its count when both are known (a manifest of
    the same config digest without a count did the same work)."""
    for m in measured:
        seconds = number(m.get("seconds"))
        if not seconds or seconds <= 0:
            continue
        count = pos_int((m.get("metadata") or {}).get(count_key)) if count_key else None
        basis = f"measured: {_duration(seconds / 3600)}" + (f" for {count:,} {count_key}" if count else "")
        basis += f" by {m.get('producer') or m.get('name') or 'an earlier job'}"
        if count and budget and budget != count:
            seconds *= budget / count
            basis += f", scaled to {budget:,}"
        wall = seconds / 3600
        return Estimate(stage, wall, wall * gpus if gpus else None, wall * cores if cores and not gpus else None,
                        basis)
    return None


def _precision(config: dict) -> str:
    prec = precision(config)
    return "nvfp4" if prec and prec.nvfp4 else "fp8" if prec and prec.fp8 else "bf16"


def _gpu_rate(config: dict, prec: str, mfu: float) -> tuple[float | None, str, str]:
    """(achieved FLOP/s per GPU, why unknown, 'PEAK per GPU' text)."""
    name = get(config, "cluster.gpu")
    if not isinstance(name, str) or not name.strip():
        return None, "cluster.gpu is unset: the profile's `gpu` names the GPU whose peak FLOP/s the estimate needs", ""
    name = name.strip().lower()
    peaks = PEAK_TFLOPS.get(name)
    if peaks is None:
        return None, f"no peak FLOP/s known for GPU type {name!r} (known: {', '.join(PEAK_TFLOPS)})", ""
    if prec not in peaks:
        return None, f"{name} has no {PRECISION_NAMES[prec]} tensor cores", ""
    peak = peaks[prec] * 1e12
    return mfu * peak, "", f"{peak / 1e15:g} PFLOP/s dense {PRECISION_NAMES[prec]} per {name}"


def _training_flops(config: dict, seq: int) -> tuple[float | None, str]:
    """(model FLOPs per token, forward and backward; how they were counted) or (None, why)."""
    num_layers = pos_int(get(config, "model.num_layers"))
    d, why = P.dims(config)
    if d is None or num_layers is None:
        return None, f"parameter count: {why or 'model.num_layers is unset'}"
    symbols, _ = P.layer_types(config, num_layers)
    model = P.count(config, d, symbols)
    copies = model.mtp_depths if get(config, "model.mtp_use_repeated_layer") is False else 1
    mtp_depth = model.mtp.active // copies + d.vocab * d.h if model.mtp_depths else 0  # block + output layer
    mtp_pattern = get(config, "model.mtp_hybrid_override_pattern")
    mtp_pattern = mtp_pattern if isinstance(mtp_pattern, str) and mtp_pattern else "*E"  # as params.mtp_block
    attention_layers = sum(s in "*D+" for s in symbols) + model.mtp_depths * sum(s in "*D+" for s in mtp_pattern)
    params = model.active + model.mtp_depths * mtp_depth
    flops = 6 * params + 6 * seq * (d.heads or 0) * (d.kv or 0) * attention_layers
    what = f"6·{fmt_count(params)} active params/token"
    if model.mtp_depths:
        what += f" (with {model.mtp_depths} MTP depths)"
    if attention_layers and d.heads:
        what += f" + causal attention at seq {seq:,}"
        if get(config, "dataset.packed_dir") or get(config, "dataset.pack_size"):
            what += " (upper bound: packs attend per sequence)"
    return flops, what


def _quantize_params(config: dict) -> tuple[tuple[float, float] | None, str]:
    """((total, active) parameters, where from): the model dims, else the checkpoint's name (`...-550B-A55B-...`)."""
    num_layers = pos_int(get(config, "model.num_layers"))
    d, why = P.dims(config)
    if d is not None and num_layers is not None:
        model = P.count(config, d, P.layer_types(config, num_layers)[0])
        return (model.total, model.active), "from model.*"
    name = str(config.get("bf16_checkpoint") or "")
    if m := re.search(r"(\d+(?:\.\d+)?)B-A(\d+(?:\.\d+)?)B", name):
        return (float(m[1]) * 1e9, float(m[2]) * 1e9), "from the checkpoint's name"
    return None, f"parameter count: {why or 'model.num_layers is unset'}, and bf16_checkpoint names no size"


# -- units ------------------------------------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def _duration(hours: float) -> str:
    seconds = hours * 3600
    if seconds >= 2 * 86400:
        return f"{_num(seconds / 86400)} d"
    if seconds >= 3600:
        return f"{_num(hours)} h"
    if seconds >= 60:
        return f"{_num(seconds / 60)} min"
    return f"{_num(seconds)} s" if seconds >= 1 else "<1 s"


def _amount(hours: float, what: str) -> str:
    """`7.6 M GPU-h`, `410 GPU-h`, `12 GPU-min`, `3 core-s`."""
    for scale, prefix in ((1e6, "M "), (1e3, "k ")):
        if hours >= scale:
            return f"{_num(hours / scale)} {prefix}{what}-h"
    if hours >= 1:
        return f"{_num(hours)} {what}-h"
    if hours * 60 >= 1:
        return f"{_num(hours * 60)} {what}-min"
    return f"{_num(hours * 3600)} {what}-s" if hours * 3600 >= 1 else f"<1 {what}-s"


def _secs(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 1 else "<1 s"


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{_num(n / size)} {unit}"
    return f"{n:.0f} B"
