"""The RL stages' rules, on the config NeMo RL will run (ours merged over the record of its YAML): the node
accounting (train + generation + gym + teachers = the allocation, in whole NVLink segments), each group's
parallel layout against its GPUs, the batch arithmetic, the sequence against context parallelism, the step
budget against the experiment's checkpoints, and the judges, teachers and images the recipe needs. The dry
run also gets the Ray layout and the materialized NeMo RL config."""

from __future__ import annotations

import re
from typing import Any

import yaml

from .. import nemo_rl_api
from ..contract import NAME, newest_step
from ..findings import Report
from ..nemo_rl_config import declared_judges, describe, effective, is_mopd, materialize, node_groups, teacher_pools

MEGATRON = "policy.megatron_cfg"
VLLM = "policy.generation.vllm_cfg"
TEACHER = "on_policy_distillation.non_colocated_teachers.default_teacher_cfg"
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
                                          f"(cluster.gpus_per_node); set run.gpus_per_node={have}")
    nodes(cfg, report)
    training(cfg, gpus, report)
    generation(cfg, gpus, report)
    teachers(cfg, gpus, report)
    batch_and_sequence(cfg, report)
    steps(cfg, report)
    services(cfg, report)
    report.tables["ray layout (node groups)"] = layout_rows(cfg, gpus)
    report.blocks[f"NeMo RL config ({nemo_rl_api.yaml_path(cfg['recipe'])} at {nemo_rl_api.commit()[:12]} "
                  "with nemo_rl.* merged)"] = yaml.safe_dump(materialize(cfg), sort_keys=False, width=120)


def nodes(cfg: dict[str, Any], report: Report) -> None:
    lay = cfg["layout"]
    for key in ("train_nodes", "generation_nodes", "gym_nodes", "nodes_per_teacher", "segment_nodes"):
        if (lay.get(key) or 0) < 0:
            report.error(f"layout.{key}", f"must be 0 or more, got {lay[key]}")
    if (lay.get("train_nodes") or 0) < 1:
        report.error("layout.train_nodes", f"must be 1 or more, got {lay.get('train_nodes')}")
    if lay.get("colocated") and lay.get("generation_nodes"):
        report.error("layout.generation_nodes", f"is {lay['generation_nodes']}, but layout.colocated generates on the "
                                                "training GPUs; set layout.generation_nodes=0 or layout.colocated=false")
    elif not lay.get("colocated") and (lay.get("generation_nodes") or 0) < 1:
        report.error("layout.generation_nodes", "must be 1 or more (vLLM runs on its own nodes); or set "
                                                "layout.colocated=true to generate on the training GPUs")
    mopd = is_mopd(cfg["recipe"])
    if mopd and (lay.get("nodes_per_teacher") or 0) < 1:
        report.error("layout.nodes_per_teacher", "MOPD serves each teacher on its own nodes: set it to 1 or more "
                                                 "(4 at TP8 CP2 on GB200)")
    elif not mopd and lay.get("nodes_per_teacher"):
        report.error("layout.nodes_per_teacher", f"is {lay['nodes_per_teacher']}, but {cfg['recipe']} has no teacher "
                                                 "panel (only MOPD does); set it to 0")
    sizes = node_groups(cfg)
    total = sum(n for _, n in sizes)
    segment = lay.get("segment_nodes") or 0
    if segment < 1:
        report.error("layout.segment_nodes", f"must be 1 or more, got {segment}")
    elif total % segment:
        up = -(-total // segment) * segment
        report.error("layout", f"{describe(sizes)} = {total} nodes, not a multiple of the {segment}-node NVLink "
                               f"segment (layout.segment_nodes); make it {up} (e.g. layout.train_nodes="
                               f"{(lay.get('train_nodes') or 0) + up - total}) or {total - total % segment}")


def _product(cfg: dict[str, Any], prefix: str, *keys: str) -> int:
    out = 1
    for key in keys:
        out *= int(effective(cfg, f"{prefix}.{key}") or 1)
    return out


def training(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    world = (cfg["layout"].get("train_nodes") or 0) * gpus
    tp_cp_pp = _product(cfg, MEGATRON, "tensor_model_parallel_size", "context_parallel_size",
                        "pipeline_model_parallel_size")
    ep = _product(cfg, MEGATRON, "expert_model_parallel_size", "expert_tensor_parallel_size",
                  "pipeline_model_parallel_size")
    if world and world % tp_cp_pp:
        report.error(f"nemo_rl.{MEGATRON}", f"TP·CP·PP = {tp_cp_pp} does not divide the {world} training GPUs "
                                           f"(layout.train_nodes x run.gpus_per_node); change the layout or the nodes")
    if world and world % ep:
        report.error(f"nemo_rl.{MEGATRON}.expert_model_parallel_size",
                     f"EP·ETP·PP = {ep} does not divide the {world} training GPUs; change EP or layout.train_nodes")
    dp = world // tp_cp_pp if world and not world % tp_cp_pp else 0
    report.facts["rl.train_dp"] = dp


def generation(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    lay = cfg["layout"]
    gen_gpus = (lay.get("train_nodes") if lay.get("colocated") else lay.get("generation_nodes") or 0) * gpus
    tp = int(effective(cfg, f"{VLLM}.tensor_parallel_size") or 1)
    pp = int(effective(cfg, f"{VLLM}.pipeline_parallel_size") or 1)
    ep = int(effective(cfg, f"{VLLM}.expert_parallel_size") or 1)
    if gen_gpus and gen_gpus % (tp * pp):
        report.error(f"nemo_rl.{VLLM}.tensor_parallel_size",
                     f"a vLLM engine takes TP·PP = {tp * pp} GPUs, which does not divide the {gen_gpus} generation "
                     "GPUs; change it or layout.generation_nodes")
    if ep > tp or tp % ep:
        report.error(f"nemo_rl.{VLLM}.expert_parallel_size",
                     f"{ep} with vLLM TP {tp}: NeMo RL's async engine needs EP to divide TP (EP > TP is "
                     "NVIDIA-NeMo/RL#1101); set it to the TP")


def teachers(cfg: dict[str, Any], gpus: int, report: Report) -> None:
    given = {role: path for role, path in (cfg.get("teachers") or {}).items() if path}
    if not is_mopd(cfg["recipe"]):
        for role in given:
            report.error(f"teachers.{role}", f"{cfg['recipe']} has no teacher panel (MOPD has); remove it")
        return
    per = (cfg["layout"].get("nodes_per_teacher") or 0) * gpus
    size = _product(cfg, TEACHER, "tensor_model_parallel_size", "context_parallel_size",
                    "pipeline_model_parallel_size")
    if per and per % size:
        report.error(f"nemo_rl.{TEACHER}", f"a teacher's TP·CP·PP = {size} does not divide its {per} GPUs "
                                          "(layout.nodes_per_teacher x run.gpus_per_node)")
    if per and per % _product(cfg, TEACHER, "expert_model_parallel_size", "pipeline_model_parallel_size"):
        report.error(f"nemo_rl.{TEACHER}.expert_model_parallel_size",
                     f"does not divide a teacher's {per} GPUs (layout.nodes_per_teacher x run.gpus_per_node)")
    pools, room = teacher_pools(cfg), cfg["layout"].get("teacher_pools") or 0
    if len(pools) > room:
        report.error("layout.teacher_pools", f"{room}, but the teachers are {len(pools)} distinct checkpoints, each "
                                             f"served on its own nodes; set layout.teacher_pools={len(pools)}")
    elif len(pools) < room and per:
        report.note("layout.teacher_pools", f"{room} pools for {len(pools)} distinct teacher checkpoint(s): "
                                            f"{(room - len(pools)) * cfg['layout']['nodes_per_teacher']} teacher "
                                            f"nodes stay idle (roles without their own fall back to general)")


def batch_and_sequence(cfg: dict[str, Any], report: Report) -> None:
    prompts = int(effective(cfg, "grpo.num_prompts_per_step") or 0)
    per_prompt = int(effective(cfg, "grpo.num_generations_per_prompt") or 0)
    gbs = int(effective(cfg, "policy.train_global_batch_size") or 0)
    if prompts * per_prompt != gbs:
        report.error("nemo_rl.policy.train_global_batch_size",
                     f"{gbs}, but {prompts} prompts x {per_prompt} generations = {prompts * per_prompt} samples per "
                     "step (grpo.num_prompts_per_step x grpo.num_generations_per_prompt); make them agree")
    dp = report.facts.get("rl.train_dp") or 0
    if dp and gbs % dp:
        report.error("nemo_rl.policy.train_global_batch_size", f"{gbs} is not a multiple of the training data-parallel "
                                                               f"size {dp}")
    seq = int(effective(cfg, "policy.max_total_sequence_length") or 0)
    tp, cp = (int(effective(cfg, f"{MEGATRON}.{k}") or 1) for k in ("tensor_model_parallel_size",
                                                                      "context_parallel_size"))
    multiple = 2 * cp * tp  # NeMo RL's make_sequence_length_divisible_by for these configs
    if seq % multiple:
        report.error("nemo_rl.policy.max_total_sequence_length",
                     f"{seq} is not a multiple of 2·CP·TP = {multiple} (each of the {cp} context-parallel ranks takes "
                     f"two chunks, split over TP {tp}); use {seq // multiple * multiple or multiple}")
    for key in ("policy.generation.max_new_tokens", f"{VLLM}.max_model_len"):
        value = effective(cfg, key)
        if isinstance(value, int) and key.endswith("max_new_tokens") and value > seq:
            report.error(f"nemo_rl.{key}", f"{value} exceeds policy.max_total_sequence_length {seq}")
        if isinstance(value, int) and key.endswith("max_model_len") and value < seq:
            report.error(f"nemo_rl.{key}", f"{value} is shorter than policy.max_total_sequence_length {seq}: vLLM "
                                           "would cut the rollouts; make them equal")


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
                                  f"nothing to train; raise max_steps or name a new experiment")
    elif done:
        report.note("experiment", f"'{cfg.get('experiment')}' resumes from step {done}")


def services(cfg: dict[str, Any], report: Report) -> None:
    judges = cfg.get("judges") or {}
    served = (cfg["layout"].get("gym_nodes") or 0) > 0  # judges without a URL are served on the Gym nodes
    unserved = []
    for name, (_, model_key, url_key) in declared_judges(cfg["recipe"]).items():
        if url_key and judges.get(url_key) and not URL.match(str(judges[url_key])):
            report.error(f"judges.{url_key}", f"{judges[url_key]!r} is not an http(s):// URL")
        if not served and not (url_key and judges.get(url_key)):
            unserved.append(name)
        elif not judges.get(model_key) and not (url_key and judges.get(url_key)):
            either = f"judges.{model_key}=HF_ID_OR_PATH" + (f" or judges.{url_key}=URL" if url_key else "")
            report.error(f"judges.{model_key}", f"{cfg['recipe']} scores with the {name} judge: set {either}")
    if unserved:
        report.warn("layout.gym_nodes", f"0: the {', '.join(unserved)} judge(s) of {cfg['recipe']} have no Gym node to "
                                        "run on; only the environments that need no judge score rollouts")
    if "sif_dir" not in nemo_rl_api.keys(cfg["recipe"]):
        if cfg.get("sif_dir"):
            report.error("sif_dir", f"{cfg['recipe']} runs no SWE instances; remove it (the swe teacher uses it)")
    else:
        sif = cfg.get("sif_dir")
        if not sif:
            report.error("sif_dir", f"{cfg['recipe']} runs each SWE instance in its apptainer image: set sif_dir to "
                                    "the directory of .sif files")
        elif not str(sif).startswith("/"):
            report.error("sif_dir", f"{sif!r} must be an absolute path the nodes mount")
    mtp = cfg.get("mtp") or {}
    if mtp.get("enabled"):
        for key in ("num_speculative", "max_num_batched"):
            if (mtp.get(key) or 0) < 1:
                report.error(f"mtp.{key}", f"must be 1 or more with mtp.enabled, got {mtp.get(key)}")
    blend = (cfg.get("data") or {}).get("blend")
    if not blend or not NAME.match(str(blend)):
        report.error("data.blend", f"names a blend of `ultra3 data prep rl`'s output (rlvr1, ifbench, ...), "
                                   f"got {blend!r}")


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
                what += ", vLLM generation on the same GPUs"
        elif group == "generation":
            tp = int(effective(cfg, f"{VLLM}.tensor_parallel_size") or 1)
            what = f"generation: vLLM TP{tp} EP{effective(cfg, f'{VLLM}.expert_parallel_size')}, " \
                   f"{count * gpus // tp} engines"
        elif group == "gym":
            what = f"gym: NeMo Gym servers and judges ({', '.join(declared_judges(cfg['recipe'])) or 'none'})"
        else:
            per = cfg["layout"]["nodes_per_teacher"]
            pools = teacher_pools(cfg)
            for i in range(cfg["layout"].get("teacher_pools") or 0):
                first = start + i * per
                where = f"nodes {first}-{first + per - 1}" if per > 1 else f"node {first}"
                path, roles = pools[i] if i < len(pools) else ("", [])
                rows.append((where, f"teacher {'/'.join(roles)}: {path}" if roles else "teacher pool: spare"))
            start += count
            continue
        rows.append((span, what))
        start += count
    return rows
