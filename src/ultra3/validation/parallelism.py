"""Parallel layout: world size vs the TP·PP·CP and expert meshes, layers and experts per rank, heads per TP rank.

Rules (Megatron-Core asserts these at start-up, minutes into a queued job; here they run before submission):

* world % (TP·PP·CP) == 0 gives DP; MoE: world ≥ PP·max(TP·CP, EP·ETP) and (TP·CP·DP) % (EP·ETP) == 0 gives expert-DP
* num_layers % (PP·VPP) == 0 unless model.pipeline_model_parallel_layout (or '|' in the pattern) places layers
* hybrid_layer_pattern: valid symbols, len without '|' == num_layers, PP·VPP − 1 '|' splits when any
* num_moe_experts % EP == 0, top-k ≤ experts
* attention heads, query groups, Mamba heads and groups divisible by TP (and Mamba by TP·CP under CP)
"""

from __future__ import annotations

import math

from ultra3.dotted import get

from ..model_math import (
    CP,
    DP_KEYS,
    EP,
    ETP,
    EXPERTS,
    LAYOUT,
    MTP_SEPARATOR,
    NODES,
    NUM_LAYERS,
    PARALLEL_SIZE_KEYS,
    PATTERN_SYMBOLS,
    PIPE,
    PP,
    TP,
    VPP,
    WORLD_KEYS,
    Mesh,
    divisors,
    main_pattern,
    mesh,
    pattern,
    pos_int,
)

HEADS = "model.num_attention_heads"
GROUPS = "model.num_query_groups"


def check(cfg: dict, report) -> None:
    for key in PARALLEL_SIZE_KEYS + (VPP,):
        value = get(cfg, key)
        if value is not None and pos_int(value) is None:
            report.error(key, f"{key}={value!r} is not a positive integer; set it to 1 or more")
    m = mesh(cfg)
    if m is None:
        return
    _world(cfg, m, report)
    _layers(cfg, m, report)
    _pattern(cfg, m, report)
    _experts(cfg, m, report)
    _heads(cfg, m, report)
    report.tables["parallelism"] = [
        ("TP · PP · CP", f"{m.tp} · {m.pp} · {m.cp} = {m.model_parallel}"),
        ("virtual PP", str(m.vpp or 1)),
        ("EP · ETP", f"{m.ep} · {m.etp} = {m.expert_mesh}" + ("" if m.etp_was_set else " (ETP unset: 1)")),
        ("world size", str(m.world) if m.world else "unknown"),
        ("DP", str(m.dp) if m.dp else "unknown"),
        ("expert DP", str(m.edp) if m.edp else "unknown"),
    ]


def _world(cfg: dict, m: Mesh, report) -> None:
    world = m.world
    if world is None:
        return  # cluster.check warned once
    mp = m.model_parallel
    is_moe = pos_int(get(cfg, "model.num_moe_experts")) is not None or m.expert_mesh > 1
    minimum = m.pp * max(m.tp * m.cp, m.expert_mesh)
    if is_moe and world < minimum:  # (without MoE, the TP·PP·CP multiple below says it)
        report.error(
            EP if m.expert_mesh > m.tp * m.cp else NODES,
            f"PP·max(TP·CP, EP·ETP) = {m.pp}·max({m.tp * m.cp}, {m.expert_mesh}) = {minimum} GPUs at least, "
            f"but the run has {world}; add nodes or lower the parallel sizes",
            quoting=(PP, TP, CP, EP, ETP, *WORLD_KEYS),
        )
    if world % mp:
        step = mp // math.gcd(mp, m.gpus_per_node)
        below = (m.nodes // step) * step
        hint = ", ".join(str(n) for n in (below, below + step) if n > 0)
        report.error(
            NODES,
            f"world size {world} ({m.nodes} nodes x {m.gpus_per_node} GPUs) is not a multiple of TP·PP·CP = "
            f"{m.tp}·{m.pp}·{m.cp} = {mp}; use a multiple of {step} nodes (e.g. {hint}) or change TP/PP/CP",
            quoting=DP_KEYS,
        )
        return
    report.facts["data_parallel_size"] = m.dp
    if not is_moe:
        return
    stage = m.tp * m.cp * m.dp
    if world >= minimum and stage % m.expert_mesh:
        report.error(
            EP,
            f"TP·CP·DP = {m.tp}·{m.cp}·{m.dp} = {stage} GPUs per pipeline stage is not a multiple of "
            f"EP·ETP = {m.expert_mesh}; use an EP·ETP that divides {stage} ({divisors(stage)})",
            quoting=(*DP_KEYS, EP, ETP),
        )
    elif m.edp is not None:
        report.facts["expert_data_parallel_size"] = m.edp
    report.facts["expert_tensor_parallel_size"] = m.etp
    if not m.etp_was_set:
        report.note(
            ETP,
            "expert_tensor_parallel_size is unset: Megatron-Bridge now uses ETP=1 (older releases used ETP=TP, "
            f"MB#4007), so the expert mesh is EP·ETP = {m.ep}·1; set it explicitly to pin it",
        )


def _layers(cfg: dict, m: Mesh, report) -> None:
    raw = get(cfg, "model.num_layers")
    layers = pos_int(raw)
    if raw is not None and layers is None:
        report.error("model.num_layers", f"model.num_layers={raw!r} is not a positive integer")
    if m.vpp and m.pp == 1:
        report.error(VPP, f"virtual pipeline (VPP={m.vpp}) needs PP > 1; unset {VPP} or raise PP", quoting=(PP,))
    found = pattern(cfg)
    if layers is None or get(cfg, LAYOUT) is not None or (found and PIPE in main_pattern(found[1])):
        return  # the layout (or the pattern's '|' splits) places the layers
    if layers % m.pp:
        report.error(
            PP,
            f"{layers} layers do not split evenly over PP={m.pp}; use a PP that divides {layers} "
            f"({divisors(layers)}) or set {LAYOUT}",
            quoting=(NUM_LAYERS,),
        )
    elif m.vpp and layers % (m.pp * m.vpp):
        per_stage = layers // m.pp
        report.error(
            VPP,
            f"{layers} layers do not split evenly over PP·VPP = {m.pp}·{m.vpp} = {m.pp * m.vpp} model chunks; "
            f"use a VPP that divides the {per_stage} layers per stage ({divisors(per_stage)}) or set {LAYOUT}",
            quoting=(NUM_LAYERS, PP),
        )


def _pattern(cfg: dict, m: Mesh, report) -> None:
    found = pattern(cfg)
    layers = pos_int(get(cfg, "model.num_layers"))
    if found is None:
        source = get(cfg, "recipe.hf_model")
        where = f"{source}'s config.json" if isinstance(source, str) and source else "the model's HF config"
        report.note(
            "model.hybrid_layer_pattern",
            f"hybrid_layer_pattern is unset: the {layers or '?'}-layer pattern comes from {where} at run time "
            "and is checked there; set model.hybrid_layer_pattern to check it here",
        )
        return
    key, text = found
    valid = set(PATTERN_SYMBOLS) | {PIPE, MTP_SEPARATOR}
    bad = sorted(set(text) - valid)
    if bad:
        report.error(
            key,
            f"{key} {text!r} has invalid symbols {' '.join(repr(c) for c in bad)}; use M (Mamba-2), * (attention), "
            "E (MoE), - (MLP), G (GDN), D (DS-attention), + (MLA) and | (pipeline split)",
        )
    main = main_pattern(text)
    length = len(main.replace(PIPE, ""))
    if layers is not None and length != layers:
        report.error(
            key,
            f"{key} has {length} layers (without '|') but model.num_layers={layers}; make the pattern "
            f"{layers} symbols long or set model.num_layers={length}",
            quoting=(NUM_LAYERS,),
        )
    splits = main.count(PIPE)
    if splits:
        needed = m.pp * (m.vpp or 1) - 1
        if splits != needed:
            stages = f"PP={m.pp}" + (f" x VPP={m.vpp}" if m.vpp else "")
            report.error(
                key,
                f"{key} has {splits} '|' pipeline splits but {stages} needs exactly {needed}; "
                f"add or remove '|' or drop them all to split evenly",
                quoting=(PP, VPP),
            )
        elif any(not segment for segment in main.split(PIPE)):
            report.error(
                key, f"{key} has an empty pipeline stage ('||' or a leading/trailing '|'); give every stage a layer"
            )
    if "E" in text and pos_int(get(cfg, "model.num_moe_experts")) is None:
        report.error(EXPERTS, f"{key} has MoE layers (E) but model.num_moe_experts is unset; set it", quoting=(key,))


def _experts(cfg: dict, m: Mesh, report) -> None:
    experts = pos_int(get(cfg, "model.num_moe_experts"))
    if experts is None:
        if m.ep > 1:
            report.error(EP, f"EP={m.ep} needs MoE layers but model.num_moe_experts is unset; set EP=1 or the experts",
                         quoting=(EXPERTS,))
        return
    if experts % m.ep:
        report.error(
            EP,
            f"{experts} experts do not split evenly over EP={m.ep}; use an EP that divides {experts} "
            f"({divisors(experts, 10)})",
            quoting=(EXPERTS,),
        )
    topk = pos_int(get(cfg, "model.moe_router_topk"))
    if topk is not None and topk > experts:
        report.error("model.moe_router_topk", f"top-k {topk} exceeds the {experts} experts; use top-k ≤ {experts}",
                     quoting=(EXPERTS,))


def _heads(cfg: dict, m: Mesh, report) -> None:
    heads = pos_int(get(cfg, HEADS))
    groups = pos_int(get(cfg, GROUPS))
    if heads is not None and heads % m.tp:
        report.error(TP, f"num_attention_heads={heads} is not divisible by TP={m.tp}; "
                         f"use a TP that divides {heads} ({divisors(heads)})", quoting=(HEADS,))
    # Megatron-Core replicates KV heads when TP is a multiple of the query groups
    if groups is not None and groups % m.tp and m.tp % groups:
        report.error(TP, f"num_query_groups={groups} and TP={m.tp}: one must divide the other; "
                         f"use a TP that divides {groups} ({divisors(groups)}) or a multiple of it", quoting=(GROUPS,))
    if heads is not None and groups is not None and heads % groups:
        report.error(
            GROUPS,
            f"num_attention_heads={heads} is not a multiple of num_query_groups={groups}; use a divisor of {heads}",
            quoting=(HEADS,),
        )

    m_heads = pos_int(get(cfg, "model.mamba_num_heads"))
    m_groups = pos_int(get(cfg, "model.mamba_num_groups"))
    for name, n in (("mamba_num_heads", m_heads), ("mamba_num_groups", m_groups)):
        if n is not None and n % m.tp:
            report.error(TP, f"{name}={n} is not divisible by TP={m.tp}; use a TP that divides {n} ({divisors(n)})",
                         quoting=(f"model.{name}",))
    if m.cp > 1 and m_heads is not None and m_heads % m.tp == 0 and (m_heads // m.tp) % m.cp:
        report.error(
            "model.context_parallel_size",
            f"Mamba context parallelism splits heads: mamba_num_heads/TP = {m_heads}/{m.tp} = {m_heads // m.tp} "
            f"is not divisible by CP={m.cp}; use a CP that divides {m_heads // m.tp}",
            quoting=("model.mamba_num_heads", TP),
        )
    if m.cp > 1 and m_groups is not None and m_groups % m.tp == 0:
        local = m_groups // m.tp
        if local % m.cp and m.cp % local:
            report.error(
                "model.context_parallel_size",
                f"mamba_num_groups/TP = {local} and CP={m.cp} must divide one another (Mamba CP); "
                f"use a CP that divides or is a multiple of {local}",
                quoting=("model.mamba_num_groups", TP),
            )
