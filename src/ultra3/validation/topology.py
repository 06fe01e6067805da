"""Placement on the hardware: TP inside a node, the MoE expert group inside the NVLink domain.

* TP > GPUs per node: warning (every layer's TP collectives cross the network) unless the NVLink domain spans the
  nodes (GB200/GB300 NVL72: a note); TP not dividing GPUs per node: warning (TP groups straddle nodes).
* With the flex dispatcher and the HybridEP backend (the Ultra recipes' default when the keys are unset), the
  expert group EP·ETP should fit in one NVLink domain (8 GPUs on h100/h200/b200 nodes, 72 on GB200/GB300 NVL72).
  MB PR#6043 hit HybridEP topology errors with EP=64 on B200 and cut EP to 8, yet the Nemotron Ultra pretraining
  config runs EP=32 on B200 nodes with the recipe's HybridEP settings (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8,
  NVLINK_DOMAIN_SIZE=8, USE_MNNVL=0): a group larger than the domain can run, with its dispatch crossing nodes.
  So: a note up to the recipe's own group of 32 (4 domains of 8), a warning with the numbers beyond it, never an
  error. The all-to-all dispatcher gets a note.
"""

from __future__ import annotations

from ultra3.dotted import get

from ..model_math import EP, ETP, GPUS, TP, mesh, nvlink_domain, nvlink_domain_key, pos_int

DISPATCHER = "model.moe_token_dispatcher_type"
BACKEND = "model.moe_flex_dispatcher_backend"
ULTRA_DISPATCHER = ("flex", "hybridep")  # what MB's Ultra recipes set (megatron-bridge.md §1.2)
RECIPE_GROUP = 32  # the expert group the Ultra pretraining recipe runs HybridEP with on 8-GPU B200 nodes


def check(cfg: dict, report) -> None:
    m = mesh(cfg)
    if m is None:
        return
    domain = nvlink_domain(cfg)
    gpn = m.gpus_per_node
    if gpn is not None and m.tp > gpn:
        # Only NVL72-class systems (a domain larger than one 8-GPU node) put several nodes on one NVLink fabric.
        if domain is not None and domain > max(gpn, 8) and m.tp <= domain:
            report.note(
                TP,
                f"TP={m.tp} spans {-(-m.tp // gpn)} nodes of {gpn} GPUs but stays inside the {domain}-GPU NVLink "
                "domain (multi-node NVLink)",
            )
        else:
            report.warn(
                TP,
                f"TP={m.tp} > {gpn} GPUs per node: every layer's tensor-parallel collectives cross the inter-node "
                f"network; keep TP ≤ {gpn} (inside the node's NVLink) and scale with PP/EP/DP instead",
                quoting=(GPUS,),
            )
    elif gpn is not None and gpn % m.tp:
        report.warn(
            TP,
            f"TP={m.tp} does not divide the {gpn} GPUs per node, so some TP groups straddle two nodes; "
            f"use a TP that divides {gpn}",
            quoting=(GPUS,),
        )

    experts = pos_int(get(cfg, "model.num_moe_experts"))
    if experts is None or m.expert_mesh == 1 or domain is None:
        return
    dispatcher = get(cfg, DISPATCHER) or ULTRA_DISPATCHER[0]
    backend = get(cfg, BACKEND) or ULTRA_DISPATCHER[1]
    assumed = "" if get(cfg, DISPATCHER) and get(cfg, BACKEND) else " (the Ultra recipe's default dispatcher)"
    report.facts["moe_dispatcher"] = f"{dispatcher}/{backend}" if dispatcher == "flex" else str(dispatcher)
    if m.expert_mesh <= domain:
        return
    domains = -(-m.expert_mesh // domain)
    if dispatcher == "flex" and str(backend).lower() == "hybridep" and m.expert_mesh <= RECIPE_GROUP:
        report.note(EP, f"EP·ETP = {m.expert_mesh} spans {domains} NVLink domains of {domain} GPUs: HybridEP"
                        f"{assumed} dispatches across nodes, as the Ultra recipe's own EP=32 B200 run does")
    elif dispatcher == "flex" and str(backend).lower() == "hybridep":
        report.warn(
            EP,
            f"EP·ETP = {m.ep}·{m.etp} = {m.expert_mesh} spans {domains} NVLink domains of {domain} GPUs, so HybridEP"
            f"{assumed} dispatches across nodes (MB PR#6043 hit HybridEP topology errors with EP=64 on B200 and cut "
            f"EP to 8); keep EP·ETP ≤ {domain}, use an NVL72 profile (gb200, gb300), or keep the recipe's "
            f"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN={domain}/NVLINK_DOMAIN_SIZE={domain} env",
            quoting=(ETP, nvlink_domain_key(cfg), DISPATCHER, BACKEND),
        )
    else:
        report.note(
            "model.expert_model_parallel_size",
            f"EP·ETP = {m.expert_mesh} spans {domains} NVLink domains of {domain} GPUs: the {dispatcher} token "
            "all-to-all crosses the inter-node network",
        )
