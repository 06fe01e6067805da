"""`ultra3 eval`: score any checkpoint of the chain on lm-evaluation-harness tasks into an `eval-results` artifact.
Its schema, rules (tasks against lm-eval's recorded names, the hub data its tasks read, the backend against the
checkpoint's kind, vLLM's serving layout against the GPUs and the model's memory) and cost model are here; the
runtime is recipes/eval.py."""

from __future__ import annotations

import os
import re
from functools import cache
from ..stage import Input, Output, Parts, Stage

# later in the chain first: unset, the newest artifact of the first kind the store has; in a pipe, the latest
# earlier step's output of the first kind offered (an eval after quantize scores the quantized checkpoint)
KINDS = ("quantized-checkpoint", "mopd-policy", "rlvr-policy", "teacher-policy", "hf-checkpoint", "sft-checkpoint",
         "pretrain-checkpoint")
HBM_SHARE = 0.9  # vLLM's default gpu_memory_utilization: weights and KV cache share it
BYTES_PER_PARAM = {"bf16": 2.0, "nvfp4": 0.6}  # NVFP4 routed experts (4.5 bits) with FP8/BF16 rest: ~4.8 bits/param


@cache
def parts() -> Parts:
    return Parts(_schema(), _validate, _cost, pipe_end=_pipe_end)


def _pipe_end(results: list[str], completed: bool) -> list[str]:
    """A pipe's evaluations side by side once they completed; else the command that will show them."""
    if len(results) < 2:
        return []
    if not completed:
        return [f"  nemotron jobs compare {' '.join(results)}"]
    from ..eval_results import compare_lines, load

    return ["", "== evaluations side by side (nemotron jobs compare) ==",
            *compare_lines([load(ref) for ref in results])]


EVAL = Stage(
    ("eval",), "Score a checkpoint on lm-evaluation-harness tasks (vLLM-served on a cluster) into eval-results.",
    "eval", "eval", "process", ("python_version", "image", "gpus", "inputs"), parts,
    inputs=(Input("checkpoint", "checkpoint", KINDS, unless="make_checkpoint", same_config=False),),
    outputs=(Output("eval-results", "output_dir", "results.json"),),
    examples=("ultra3 eval -c tiny", "ultra3 eval -c tiny --dry-run",
              "ultra3 eval --batch mycluster --dry-run checkpoint=/lustre/ckpt/ultra-sft-hf",
              "ultra3 eval --batch mycluster checkpoint=/lustre/ckpt/ultra-nvfp4 "
              "hf_datasets_cache=/lustre/hf-datasets"),
    image="rl",  # vLLM (NeMo RL's environment)
)


# -- schema and rules ---------------------------------------------------------------------------------------------


def _schema() -> dict:
    from .. import megatron_api
    from ..forms import PORT, Count, Text

    return {
        "run": None,
        "checkpoint": str,  # a Hugging Face checkpoint (dir or hub id) or a Megatron-Bridge checkpoint dir
        "make_checkpoint": bool,  # build a seeded random checkpoint of `model` first (the tiny flow)
        "tokenizer": str,  # tokenizer.json of a made checkpoint
        "output_dir": str,
        "backend": Text(r"hf|vllm", "hf or vllm"),
        "device": Text(r"auto|cpu|cuda", "auto, cpu or cuda"),
        "batch_size": Count(1),
        "seed": int,
        "tasks": [{"name": Text(r"[A-Za-z0-9_.:-]+", "an lm-eval task, group or tag name"), "num_fewshot": Count(0),
                   "limit": Count(1)}],
        "generation": {"temperature": float, "top_p": float, "max_new_tokens": Count(1)},
        "serve": {"command": list[str], "tensor_parallel_size": Count(1), "pipeline_parallel_size": Count(1),
                  "port": PORT, "start_timeout_s": Count(1), "max_model_len": Count(1), "extra_args": list[str]},
        "hf_datasets_cache": str,  # a prefilled datasets cache the hub tasks read offline
        "model": megatron_api.container_sections()["model"],  # the made checkpoint's shape, the served model's size
    }


def _validate(cfg: dict, report) -> None:
    if not cfg.get("output_dir"):
        report.error("output_dir", "output_dir is not set; set where results.json goes")
    _tasks(cfg, report)
    _generation(cfg, report)
    kind = checkpoint_kind(cfg)
    if kind is None and _local(cfg.get("checkpoint")) and os.path.exists(os.path.expanduser(cfg["checkpoint"])) \
            and not cfg.get("make_checkpoint"):
        report.error("checkpoint", f"{cfg['checkpoint']} is neither a Hugging Face checkpoint (config.json) nor a "
                                   "Megatron-Bridge checkpoint (a tracker file); give a model directory or the "
                                   "checkpoint.save directory of a pretrain/sft job")
    if cfg.get("backend") == "vllm":
        _serving(cfg, kind, report)
    else:
        _in_process(cfg, kind, report)


def task_names() -> tuple[set[str], set[str]]:
    """(our shipped tasks, lm-eval's recorded task/group/tag names): read from files, lm-eval never imported."""
    import gzip

    from ..paths import RECIPES_DIR

    folder = RECIPES_DIR / "evaluation"
    ours = set()
    for path in (folder / "tasks").glob("*.yaml"):
        if found := re.search(r"^task:\s*(\S+)", path.read_text(encoding="utf-8"), re.M):
            ours.add(found.group(1))
    with gzip.open(folder / "task_names.txt.gz", "rt", encoding="utf-8") as f:
        theirs = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    return ours, theirs


def _tasks(cfg: dict, report) -> None:
    from ..schema import where_from, did_you_mean

    tasks = cfg.get("tasks") or []
    if not tasks:
        report.error("tasks", "no tasks; give a list such as tasks=[{name: mmlu, num_fewshot: 5}]")
        return
    ours, theirs = task_names()
    hub = []
    for i, task in enumerate(tasks):
        name = task.get("name")
        if not name:
            report.error(f"tasks[{i}].name", "not set; name an lm-eval task")
        elif name not in ours | theirs:
            close = did_you_mean(name, sorted(ours | theirs))
            report.error(f"tasks[{i}].name", f"{name!r} is not a task of lm-eval 0.4.13 nor of recipes/evaluation/"
                         f"tasks{where_from('tasks', report.origin)}; {close or 'see `lm-eval ls tasks`'}")
        elif name not in ours:
            hub.append(name)
    if hub and not cfg.get("hf_datasets_cache"):
        text = (f"{', '.join(hub)} read{'s its' if len(hub) == 1 else ' their'} data from the Hugging Face Hub: the "
                "compute nodes need hub access, or set hf_datasets_cache=DIR to a datasets cache prefilled where there "
                "is a network (the job then reads it offline)")
        if (cfg.get("job") or {}).get("runs_here"):
            report.note("tasks", text.replace("the compute nodes need", "this machine needs"))
        else:
            report.warn("tasks", text)


def _generation(cfg: dict, report) -> None:
    gen = cfg.get("generation") or {}
    temp, top_p = gen.get("temperature"), gen.get("top_p")
    if isinstance(temp, (int, float)) and temp < 0:
        report.error("generation.temperature", f"{temp!r} is below 0 (0: greedy)")
    if isinstance(top_p, (int, float)) and not 0 < top_p <= 1:
        report.error("generation.top_p", f"{top_p!r} is not in (0, 1]")


def checkpoint_kind(cfg: dict) -> str | None:
    """The checkpoint's artifact kind: from the store artifact or pipe step that fills it, else what the directory
    holds on this machine; None when neither tells."""
    entry = next((i for i in (cfg.get("job") or {}).get("inputs") or [] if i.get("key") == "checkpoint"), None)
    if entry and not cfg.get("make_checkpoint"):
        told = f"{entry.get('artifact') or ''} {entry.get('path') or ''}"
        for kind in KINDS:  # ultra3-<kind>-<config>:vN, or a pending pipe step's <step kind>
            if f"ultra3-{kind}-" in told or f" {kind}>" in told:
                return kind
    path = cfg.get("checkpoint")
    if not _local(path):
        return None
    from ..contract import CHECKPOINT_TRACKERS, quantization

    folder = os.path.expanduser(path)
    if any(os.path.isfile(os.path.join(folder, t)) for t in CHECKPOINT_TRACKERS):
        return "sft-checkpoint"  # a Megatron-Bridge checkpoint: exported to Hugging Face in the job
    if quantization(folder):
        return "quantized-checkpoint"
    return "hf-checkpoint" if os.path.isfile(os.path.join(folder, "config.json")) else None


def _local(path: object) -> bool:
    return isinstance(path, str) and path.startswith(("/", "~", "./", "../"))


def _in_process(cfg: dict, kind: str | None, report) -> None:
    """The hf backend: lm-eval's HF model in one process (a ModelOpt-quantized checkpoint emulated)."""
    run = cfg.get("run") or {}
    nodes, gpus = run.get("nodes") or 1, run.get("gpus_per_node") or 0
    if nodes != 1 or gpus > 1:
        report.error("backend", f"the hf backend evaluates in one process, but the job has {nodes} node(s) x {gpus} "
                                "GPU(s); set backend=vllm to serve the model over them, or run.nodes=1 "
                                "run.gpus_per_node=1 (or 0)", quoting=("run.nodes", "run.gpus_per_node"))
    if kind == "quantized-checkpoint":
        report.note("checkpoint", "a quantized checkpoint on the hf backend is emulated: its weights dequantized as "
                                  "stored, FP8 inputs and KV cache fake-quantized, NVFP4 expert activations in BF16 "
                                  "(weight-only FP4, as vLLM before Blackwell); backend=vllm serves it as deployed")


def _serving(cfg: dict, kind: str | None, report) -> None:
    """vLLM on one node: TP·PP GPUs of it, the weights and some KV cache within their memory."""
    from ..gpus import GPU_TYPES
    from ..model_math import pos_int

    run, serve = cfg.get("run") or {}, cfg.get("serve") or {}
    nodes, gpus = pos_int(run.get("nodes")) or 1, pos_int(run.get("gpus_per_node")) or 0
    tp, pp = pos_int(serve.get("tensor_parallel_size")) or 1, pos_int(serve.get("pipeline_parallel_size")) or 1
    if gpus == 0:
        report.error("backend", "the vllm backend serves the model on GPUs, and the job has none; use a GPU profile "
                                "(--batch PROFILE), or backend=hf on this machine", quoting=("run.gpus_per_node",))
        return
    if nodes != 1:
        report.error("run.nodes", f"vllm serve runs on one node here, the job asks for {nodes}; set run.nodes=1 "
                                  "(an NVFP4 checkpoint, or larger GPUs, fits the model on one)")
    if tp * pp != gpus:
        report.error("serve.tensor_parallel_size", f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = "
                     f"{tp * pp} GPUs, but the node has {gpus}; make their product run.gpus_per_node",
                     quoting=("serve.pipeline_parallel_size", "run.gpus_per_node"))
    precision = "nvfp4" if kind == "quantized-checkpoint" else "bf16"
    params = _params(cfg)
    rows = [("server", f"vllm serve, TP{tp} PP{pp} on {gpus} GPUs of 1 node"),
            ("checkpoint kind", kind or "unknown until the job (assumed BF16)")]
    gpu = GPU_TYPES.get(str((cfg.get("cluster") or {}).get("gpu")))
    if params:
        weights = params * BYTES_PER_PARAM[precision]
        per_gpu = weights / (tp * pp)
        rows += [("model weights", f"{params / 1e9:,.0f} B params, {weights / 1e9:,.0f} GB ({precision.upper()})"),
                 ("weights per GPU", f"{per_gpu / 1e9:,.1f} GB")]
        if gpu:
            room = HBM_SHARE * gpu.memory_gb - per_gpu / 1e9
            rows.append(("GPU memory", f"{gpu.memory_gb:g} GB ({gpu.name}); {HBM_SHARE:.0%} for vLLM leaves "
                                       f"{room:,.1f} GB per GPU for the KV cache"))
            if room <= 0:
                report.error("serve.tensor_parallel_size", f"the weights take {per_gpu / 1e9:,.0f} GB per GPU, over "
                             f"{HBM_SHARE:.0%} of a {gpu.name}'s {gpu.memory_gb:g} GB; evaluate the NVFP4 checkpoint, "
                             "or use a profile of larger GPUs")
    report.tables["serving layout"] = rows


def _params(cfg: dict) -> float | None:
    from ..model_math import pos_int
    from ..model_params import count, dims, layer_types

    layers = pos_int((cfg.get("model") or {}).get("num_layers"))
    d, _ = dims(cfg)
    if d is None or layers is None:
        return None
    return count(cfg, d, layer_types(cfg, layers)[0]).total


def _cost(config: dict, measured: list[dict]):
    """Task time depends on the tasks' sizes, which are not modelled: a completed run of this config gives it;
    else the bound is the allocation, run.time on every GPU."""
    from ..cost import Estimate, _from_measured, _gpus, _stage, _unknown, slurm_seconds

    stage, gpus = _stage(config), _gpus(config)
    if found := _from_measured(stage, measured, None, None, gpus):
        return found
    seconds = slurm_seconds(str((config.get("run") or {}).get("time") or ""))
    if seconds is None or gpus == 0:
        return _unknown(stage, "task time is not modelled; a completed run of this config gives it")
    hours = seconds / 3600
    return Estimate(stage, hours, hours * gpus, None, f"at most one allocation: run.time {config['run']['time']} on "
                                                      f"{gpus} GPUs (task time is not modelled)")
