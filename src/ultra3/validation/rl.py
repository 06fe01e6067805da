"""The RL stages' rules, on the config NeMo RL will run (ours merged over the record of its YAML): the node
accounting (train + generation + gym + teachers = the allocation, in whole NVLink segments), each group's
parallel layout against its GPUs, the batch arithmetic, the sequence against context parallelism, the step
budget against the experiment's checkpoints, the optimizer's learning rates, and the judges, teachers and images
the recipe needs. The dry run also gets the Ray layout and the materialized NeMo RL config."""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from .. import nemo_rl_api
from ..contract import CHECKPOINT_TRACKERS, NAME, newest_step
from ..findings import Report
from ..leaks import masked
from ..nemo_rl_config import (TEACHER_CFG, declared_judges, describe, effective, is_mopd, layout_keys, materialize,
                               node_groups, teacher_pools)
from ..nemo_rl_api import TEACHER_ROLES
from .schedule import learning_rates

MEGATRON = "policy.megatron_cfg"
VLLM = "policy.generation.vllm_cfg"
GPUS, TRAIN_NODES, PER_TEACHER = "run.gpus_per_node", "layout.train_nodes", "layout.nodes_per_teacher"
URL = re.compile(r"^https?://[^\s/]+")


def validate_rl(cfg: dict[str, Any], report: Report) -> None:
    if cfg.get("recipe") not in nemo_rl_api.names() or any(f.key.startswith("nemo_rl.") for f in report.errors):
        return  # reported when the NeMo RL keys were checked: the arithmetic needs them right
    gpus = cfg["run"].get("gpus_per_node") or 0
    if gpus < 1:
        report.error("run.gpus_per_node", f"RL needs GPUs on every node, got {gpus}; set gpus_per_node in the profile "
                                          "(4 on GB200 NVL72)")
        return
    have = cfg.get("cluster", {}).get("gpus_per_node")
    if isinstance(have, int) and have and gpus > have:
        report.error("run.gpus_per_node", f"the job wants {gpus} GPUs per node but the nodes have {have} "
                                          f"(cluster.gpus_per_node); set run.gpus_per_node={have}",
                     quoting=("cluster.gpus_per_node",))
    nodes(cfg, report)
    training(cfg, gpus, report)
    generation(cfg, gpus, report)
    teachers(cfg, gpus, report)
    batch_and_sequence(cfg, report)
    steps(cfg, report)
    judges(cfg, gpus, report)
    services(cfg, report)
    notes(cfg, gpus, report)
    report.tables["ray layout (node groups)"] = layout_rows(cfg, gpus)
    report.blocks[f"NeMo RL config ({nemo_rl_api.yaml_path(cfg['recipe'])} at {nemo_rl_api.commit()[:12]} "
                  "with nemo_rl.* merged)"] = yaml.safe_dump(masked(materialize(cfg)), sort_keys=False, width=120)


def nodes(cfg: dict[str, Any], report: Report) -> None:
    lay = cfg["layout"]
    for key in ("train_nodes", "generation_nodes", "gym_nodes", "nodes_per_teacher", "segment_nodes"):
        if (lay.get(key) or 0) < 0:
            report.error(f"layout.{key}", f"must be 0 or more, got {lay[key]}")
    if (lay.get("train_nodes") or 0) < 1:
        report.error("layout.train_nodes", f"must be 1 or more, got {lay.get('train_nodes')}")
    if lay.get("colocated") and lay.get("generation_nodes"):
        report.error("layout.generation_nodes",
                     f"is {lay['generation_nodes']}, but layout.colocated generates on the training GPUs; "
                     "set layout.generation_nodes=0 or layout.colocated=false",
                     quoting=("layout.colocated",))
    elif not lay.get("colocated") and (lay.get("generation_nodes") or 0) < 1:
        report.error("layout.generation_nodes", "must be 1 or more (vLLM runs on its own nodes); or set "
                                                "layout.colocated=true to generate on the training GPUs",
                     quoting=("layout.colocated",))
    mopd = is_mopd(cfg["recipe"])
    if mopd and (lay.get("nodes_per_teacher") or 0) < 1:
        report.error("layout.nodes_per_teacher", "MOPD serves each teacher on its own nodes: set it to 1 or more "
                                                 "(4 at TP8 CP2 on GB200)", quoting=("recipe",))
    elif not mopd and lay.get("nodes_per_teacher"):
        report.error("layout.nodes_per_teacher", f"is {lay['nodes_per_teacher']}, but {cfg['recipe']} has no teacher "
                                                 "panel (only MOPD does); set it to 0", quoting=("recipe",))
    sizes = node_groups(cfg)
    total = sum(n for _, n in sizes)
    segment = lay.get("segment_nodes") or 0
    train = lay.get("train_nodes") or 0
    if segment < 1:
        report.error("layout.segment_nodes", f"must be 1 or more, got {segment}")
    elif train % segment:  # NeMo RL places training in whole segments of one NVLink domain
        report.error("layout.train_nodes", f"{train} is not a multiple of the {segment}-node NVLink segment "
                                           "(layout.segment_nodes), which NeMo RL places training in",
                     quoting=("layout.segment_nodes",))
    elif total % segment:
        up = -(-total // segment) * segment
        free = "layout.gym_nodes" if lay.get("colocated") else "layout.generation_nodes"  # not held to segments
        report.error("layout", f"{describe(sizes)} = {total} nodes, not a multiple of the {segment}-node NVLink "
                               f"segment (layout.segment_nodes); make it {up} (e.g. {free}="
                               f"{(lay.get(free.split('.')[1]) or 0) + up - total}) or {total - total % segment}",
                     quoting=(*layout_keys(cfg), "layout.segment_nodes"))


def _keys(prefix: str, *keys: str) -> tuple[str, ...]:
    """The dotted keys of NeMo RL values as they sit in our config (under nemo_rl)."""
    return tuple(f"nemo_rl.{prefix}.{key}" for key in keys)


def _product(cfg: dict[str, Any], prefix: str, *keys: str) -> int:
    out = 1
    for key in keys:
        out *= int(effective(cfg, f"{prefix}.{key}") or 1)
    return out


TP_CP_PP = ("tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size")
EP_ETP_PP = ("expert_model_parallel_size", "expert_tensor_parallel_size", "pipeline_model_parallel_size")
# what the training data-parallel size (rl.train_dp) derives from
DP_KEYS = (TRAIN_NODES, GPUS, *_keys(MEGATRON, *TP_CP_PP))


def training(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    world = (cfg["layout"].get("train_nodes") or 0) * gpus
    tp_cp_pp = _product(cfg, MEGATRON, *TP_CP_PP)
    ep = _product(cfg, MEGATRON, *EP_ETP_PP)
    if world and world % tp_cp_pp:
        report.error(f"nemo_rl.{MEGATRON}", f"TP·CP·PP = {tp_cp_pp} does not divide the {world} training GPUs "
                                           f"(layout.train_nodes x run.gpus_per_node); change the layout or the nodes",
                     quoting=(TRAIN_NODES, GPUS, *_keys(MEGATRON, *TP_CP_PP)))
    if world and world % ep:
        report.error(f"nemo_rl.{MEGATRON}.expert_model_parallel_size",
                     f"EP·ETP·PP = {ep} does not divide the {world} training GPUs; change EP or layout.train_nodes",
                     quoting=(TRAIN_NODES, GPUS, *_keys(MEGATRON, *EP_ETP_PP)))
    dp = world // tp_cp_pp if world and not world % tp_cp_pp else 0
    report.facts["rl.train_dp"] = dp
    optimizer = f"{MEGATRON}.optimizer"
    learning_rates(report, f"nemo_rl.{optimizer}", effective(cfg, f"{optimizer}.lr"),
                   effective(cfg, f"{optimizer}.min_lr"))


def generation(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    """NeMo RL's vLLM rules: EP > 1 is a multiple of TP (vLLM's EP = DP x TP), and EP other than TP needs the
    synchronous engine (NVIDIA-NeMo/RL#1101); an engine then spans max(TP, EP) x PP GPUs."""
    lay = cfg["layout"]
    gen_gpus = ((lay.get("train_nodes") if lay.get("colocated") else lay.get("generation_nodes")) or 0) * gpus
    tp, pp, ep = (int(effective(cfg, f"{VLLM}.{k}") or 1)
                  for k in ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size"))
    engine = max(tp, ep) * pp
    gen_nodes = ("layout.colocated", TRAIN_NODES) if lay.get("colocated") else ("layout.generation_nodes",)
    if gen_gpus and gen_gpus % engine:
        report.error(f"nemo_rl.{VLLM}.tensor_parallel_size",
                     f"a vLLM engine takes max(TP, EP)·PP = {engine} GPUs, which does not divide the {gen_gpus} "
                     "generation GPUs; change it or layout.generation_nodes",
                     quoting=(*_keys(VLLM, "expert_parallel_size", "pipeline_parallel_size"), *gen_nodes, GPUS))
    if ep > 1 and ep % tp:
        report.error(f"nemo_rl.{VLLM}.expert_parallel_size",
                     f"{ep} is not a multiple of vLLM's TP {tp} (vLLM's EP = DP x TP); use {tp} or a multiple",
                     quoting=_keys(VLLM, "tensor_parallel_size"))
    elif ep > 1 and ep != tp and effective(cfg, f"{VLLM}.async_engine"):
        report.error(f"nemo_rl.{VLLM}.expert_parallel_size",
                     f"{ep} with TP {tp} runs vLLM data-parallel, which NeMo RL's async engine does not support "
                     f"(NVIDIA-NeMo/RL#1101); set it to {tp} or nemo_rl.{VLLM}.async_engine=false",
                     quoting=_keys(VLLM, "tensor_parallel_size", "async_engine"))


def teachers(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    given = {role: path for role, path in (cfg.get("teachers") or {}).items() if path}
    if not is_mopd(cfg["recipe"]):
        for role in given:
            report.error(f"teachers.{role}", f"{cfg['recipe']} has no teacher panel (MOPD has); remove it",
                         quoting=("recipe",))
        return
    per = (cfg["layout"].get("nodes_per_teacher") or 0) * gpus
    size = _product(cfg, TEACHER_CFG, *TP_CP_PP)
    if per and per % size:
        report.error(f"nemo_rl.{TEACHER_CFG}", f"a teacher's TP·CP·PP = {size} does not divide its {per} GPUs "
                                          "(layout.nodes_per_teacher x run.gpus_per_node)",
                     quoting=(*_keys(TEACHER_CFG, *TP_CP_PP), PER_TEACHER, GPUS))
    if per and per % _product(cfg, TEACHER_CFG, "expert_model_parallel_size", "pipeline_model_parallel_size"):
        report.error(f"nemo_rl.{TEACHER_CFG}.expert_model_parallel_size",
                     f"does not divide a teacher's {per} GPUs (layout.nodes_per_teacher x run.gpus_per_node)",
                     quoting=(*_keys(TEACHER_CFG, "pipeline_model_parallel_size"), PER_TEACHER, GPUS))
    shared = [role for role in TEACHER_ROLES[1:] if not given.get(role)]
    if shared and given.get("general"):
        report.note("teachers", f"{', '.join(shared)} fall back to the general teacher and share its nodes "
                                f"({len(teacher_pools(cfg))} distinct teacher checkpoint(s) served)")


SEQ = "nemo_rl.policy.max_total_sequence_length"


def batch_and_sequence(cfg: dict[str, Any], report: Report) -> None:
    prompts = int(effective(cfg, "grpo.num_prompts_per_step") or 0)
    per_prompt = int(effective(cfg, "grpo.num_generations_per_prompt") or 0)
    gbs = int(effective(cfg, "policy.train_global_batch_size") or 0)
    if effective(cfg, "loss_fn.force_on_policy_ratio") and prompts * per_prompt != gbs:  # NeMo RL asserts it then
        report.error("nemo_rl.policy.train_global_batch_size",
                     f"{gbs}, but {prompts} prompts x {per_prompt} generations = {prompts * per_prompt} samples per "
                     "step (grpo.num_prompts_per_step x grpo.num_generations_per_prompt), which "
                     "loss_fn.force_on_policy_ratio needs equal; make them agree",
                     quoting=_keys("grpo", "num_prompts_per_step", "num_generations_per_prompt")
                     + _keys("loss_fn", "force_on_policy_ratio"))
    dp = report.facts.get("rl.train_dp") or 0
    if dp and gbs % dp:
        report.error("nemo_rl.policy.train_global_batch_size", f"{gbs} is not a multiple of the training data-parallel "
                                                               f"size {dp}", quoting=DP_KEYS)
    seq = int(effective(cfg, "policy.max_total_sequence_length") or 0)
    tp, cp = (int(effective(cfg, f"{MEGATRON}.{k}") or 1) for k in ("tensor_model_parallel_size",
                                                                      "context_parallel_size"))
    multiple = 2 * cp * tp  # the Ultra YAMLs' make_sequence_length_divisible_by
    if seq % multiple:
        report.warn("nemo_rl.policy.max_total_sequence_length",
                    f"{seq} is not a multiple of 2·CP·TP = {multiple}: NeMo RL pads each sequence to that multiple, "
                    f"so the longest outgrow it; use {seq // multiple * multiple or multiple}",
                    quoting=_keys(MEGATRON, "context_parallel_size", "tensor_model_parallel_size"))
    new_tokens, model_len = effective(cfg, "policy.generation.max_new_tokens"), effective(cfg, f"{VLLM}.max_model_len")
    if isinstance(new_tokens, int) and new_tokens > seq:
        report.error("nemo_rl.policy.generation.max_new_tokens", f"{new_tokens} exceeds "
                                                                 f"policy.max_total_sequence_length {seq}",
                     quoting=(SEQ,))
    if isinstance(model_len, int) and model_len < seq:
        report.error(f"nemo_rl.{VLLM}.max_model_len", f"{model_len} is shorter than policy.max_total_sequence_length "
                                                      f"{seq}: vLLM would cut the rollouts; make them equal",
                     quoting=(SEQ,))


def steps(cfg: dict[str, Any], report: Report) -> None:
    """The step budget against what the experiment has done (when its checkpoints are readable here)."""
    budget = cfg.get("max_steps")
    if budget is not None and budget < 1:
        report.error("max_steps", f"must be 1 or more (or null: NeMo RL's epochs decide), got {budget}")
        return
    where = report.facts.get("rl.checkpoints")
    done = (newest_step(where) or (0, ""))[0] if isinstance(where, str) else 0
    if done and budget is not None and done >= budget:
        report.error("max_steps", f"{budget}, but experiment '{cfg.get('experiment')}' is already at step {done}: "
                                  f"nothing to train; raise max_steps or name a new experiment",
                     quoting=("experiment",))
    elif done:
        report.note("experiment", f"'{cfg.get('experiment')}' resumes from step {done}")


SANDBOXED = ("ns_tools", "math_formal_lean")  # NeMo Gym servers that run code in NeMo Skills' sandbox


def judges(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    """Each judge the recipe scores with: a model served on the Gym nodes (which must hold them all), or an
    endpoint already serving, with the name of the model it serves (Gym sends it with every request)."""
    given = cfg.get("judges") or {}
    gym_gpus = (cfg["layout"].get("gym_nodes") or 0) * gpus
    unserved, served, serve_keys = [], {}, ()
    for name, (prefix, model_key, url_key) in declared_judges(cfg["recipe"]).items():
        url = given.get(url_key) if url_key else None
        if url and not URL.match(str(url)):
            report.error(f"judges.{url_key}", f"{url!r} is not an http(s):// URL")
        if not url and not gym_gpus:
            unserved.append(name)
        elif not given.get(model_key):
            what = f"the name of the model judges.{url_key} serves" if url else "a model (HF id or path)" + (
                f", or judges.{url_key}=URL" if url_key else "")
            report.error(f"judges.{model_key}", f"{cfg['recipe']} scores with the {name} judge: set {what}",
                         quoting=("recipe", *([f"judges.{url_key}"] if url else [])))
        elif not url:
            kwargs = f"{prefix}.vllm_serve_kwargs"
            served[name] = (int(effective(cfg, f"{kwargs}.tensor_parallel_size") or 1)
                            * int(effective(cfg, f"{kwargs}.data_parallel_size") or 1))
            serve_keys += _keys(kwargs, "tensor_parallel_size", "data_parallel_size")
    if sum(served.values()) > gym_gpus > 0:
        report.error("layout.gym_nodes", f"{cfg['layout']['gym_nodes']} nodes = {gym_gpus} GPUs, but the judges served "
                                         f"there need {sum(served.values())} (" + ", ".join(
                                             f"{n} TP x DP = {g}" for n, g in served.items()) + "); add Gym nodes "
                                         "or serve a judge elsewhere (judges.<name>_url)",
                     quoting=(GPUS, *serve_keys))
    sandboxed = [p for p in effective(cfg, "env.nemo_gym.config_paths") or [] if any(s in p for s in SANDBOXED)]
    if sandboxed and not (cfg.get("sandbox") or {}).get("image"):
        if gym_gpus:
            report.error("sandbox.image", f"{cfg['recipe']}'s Gym runs code in NeMo Skills' sandbox "
                                          f"({', '.join(sorted({s for p in sandboxed for s in SANDBOXED if s in p}))}):"
                                          " set sandbox.image to its container image",
                         quoting=("recipe", "nemo_rl.env.nemo_gym.config_paths"))
        else:
            unserved.append("sandbox")
    if unserved:
        report.warn("layout.gym_nodes", f"0: the {', '.join(unserved)} of {cfg['recipe']} have no Gym node to run on; "
                                        "only the environments that need none score rollouts",
                    quoting=("recipe",))


def services(cfg: dict[str, Any], report: Report) -> None:
    if "sif_dir" not in nemo_rl_api.keys(cfg["recipe"]):
        if cfg.get("sif_dir"):
            report.error("sif_dir", f"{cfg['recipe']} runs no SWE instances; remove it (the swe teacher uses it)",
                         quoting=("recipe",))
    else:
        sif = cfg.get("sif_dir")
        if not sif:
            report.error("sif_dir", f"{cfg['recipe']} runs each SWE instance in its apptainer image: set sif_dir to "
                                    "the directory of .sif files", quoting=("recipe",))
        elif not str(sif).startswith("/"):
            report.error("sif_dir", f"{sif!r} must be an absolute path the nodes mount")
    mtp = cfg.get("mtp") or {}
    if mtp.get("enabled"):
        for key in ("num_speculative", "max_num_batched"):
            if (mtp.get(key) or 0) < 1:
                report.error(f"mtp.{key}", f"must be 1 or more with mtp.enabled, got {mtp.get(key)}",
                             quoting=("mtp.enabled",))
    blend = (cfg.get("data") or {}).get("blend")
    if not blend or not NAME.match(str(blend)):
        report.error("data.blend", f"names a blend of `ultra3 data prep rl`'s output (rlvr1, ifbench, ...), "
                                   f"got {blend!r}")


GYM_SERVERS = "env.nemo_gym.config_paths"


def notes(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    """What a smoke-test layout leaves out, and how the job turns the policy input into what NeMo RL loads."""
    if cfg["layout"].get("colocated"):
        kept, recorded = effective(cfg, GYM_SERVERS) or [], nemo_rl_api.keys(cfg["recipe"]).get(GYM_SERVERS) or []
        off = f"; NeMo Gym runs {len(kept)} of the recipe's {len(recorded)} server configs ({GYM_SERVERS})" \
            if len(kept) < len(recorded) else ""
        report.note("layout.colocated", f"colocated on {cfg['layout'].get('train_nodes', 0) * gpus} GPU(s): "
                                        f"{effective(cfg, 'policy.generation.backend')} generation and Megatron "
                                        f"training take turns on the same GPU(s), no generation nodes{off}")
    policy = str(cfg.get("policy") or "")
    if policy and os.path.isdir(os.path.expanduser(policy)):
        if any(os.path.isfile(os.path.join(os.path.expanduser(policy), t)) for t in CHECKPOINT_TRACKERS):
            how = ("a Megatron checkpoint: the job exports it to Hugging Face once (quantize's export, into "
                   "<experiment>/policy-hf) and NeMo RL starts from that")
        else:
            how = "read by NeMo RL as a Hugging Face checkpoint, as it is"
        report.note("policy", how)


def layout_rows(cfg: dict[str, Any], gpus: int) -> list[tuple[str, str]]:
    rows, start = [], 0
    for group, count in node_groups(cfg):
        span = f"nodes {start}-{start + count - 1}" if count > 1 else f"node {start}"
        if group == "train":
            what = (f"train: Megatron TP{effective(cfg, f'{MEGATRON}.tensor_model_parallel_size')} "
                    f"EP{effective(cfg, f'{MEGATRON}.expert_model_parallel_size')} "
                    f"CP{effective(cfg, f'{MEGATRON}.context_parallel_size')} "
                    f"PP{effective(cfg, f'{MEGATRON}.pipeline_model_parallel_size')}, {count * gpus} GPUs")
            if cfg["layout"].get("colocated"):
                what += f", {effective(cfg, 'policy.generation.backend')} generation on the same GPUs"
        elif group == "generation":
            tp = int(effective(cfg, f"{VLLM}.tensor_parallel_size") or 1)
            what = f"generation: vLLM TP{tp} EP{effective(cfg, f'{VLLM}.expert_parallel_size')}, " \
                   f"{count * gpus // tp} engines"
        elif group == "gym":
            what = f"gym: NeMo Gym servers and judges ({', '.join(declared_judges(cfg['recipe'])) or 'none'})"
        else:
            per = cfg["layout"]["nodes_per_teacher"]
            for i, (path, roles) in enumerate(teacher_pools(cfg)):
                first = start + i * per
                where = f"nodes {first}-{first + per - 1}" if per > 1 else f"node {first}"
                rows.append((where, f"teacher {'/'.join(roles)}: {path}"))
            start += count
            continue
        rows.append((span, what))
        start += count
    return rows
