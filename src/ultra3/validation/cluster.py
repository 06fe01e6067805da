"""What the run knows about its cluster: nodes, GPUs per node, GPU type, NVLink domain.

Unknowns are not errors (a dry run on a laptop sees no GPU): each kind of unknown gets ONE warning here, and the
other rule modules skip the checks that need it without saying anything more.
"""

from __future__ import annotations

from ultra3.dotted import get
from ultra3.gpus import GPU_TYPES

from ..model_math import mesh, nvlink_domain, pos_int


def check(cfg: dict, report) -> None:
    nodes, gpn = get(cfg, "run.nodes"), get(cfg, "run.gpus_per_node")
    if nodes is not None and pos_int(nodes) is None:
        report.error("run.nodes", f"run.nodes={nodes!r} is not a positive integer; set the number of nodes (e.g. 96)")
    if gpn is not None and not (gpn == 0 and not isinstance(gpn, bool)) and pos_int(gpn) is None:
        report.error(
            "run.gpus_per_node",
            f"run.gpus_per_node={gpn!r} is not a positive integer; set it to the GPUs per node (e.g. 8)",
        )
    gpn_unknown = gpn is None or (gpn == 0 and not isinstance(gpn, bool))  # 0 = nothing visible here
    unknown = [key for key, missing in (("run.gpus_per_node", gpn_unknown), ("run.nodes", nodes is None)) if missing]
    if unknown:
        why = "no GPU count is known (none visible on this machine, none in the profile)" if gpn_unknown else "unset"
        names = " and ".join(unknown)
        report.warn(
            unknown[0],
            f"{names} unknown ({why}); skipped the world-size dependent checks (DP and expert-DP sizes, batch "
            f"split, microbatches, memory estimate); set {names} in the profile to run them",
            quoting=tuple(unknown[1:]),
        )

    name = get(cfg, "cluster.gpu")
    if name is None:
        report.warn(
            "cluster.gpu",
            "cluster.gpu is unknown; skipped the GPU-type checks (NVFP4/MXFP8 support, NVLink domain, HBM fit); "
            f"set cluster.gpu to one of {', '.join(GPU_TYPES)}",
        )
    elif not isinstance(name, str) or name.strip().lower() not in GPU_TYPES:
        report.error("cluster.gpu", f"unknown GPU type {name!r}; use one of {', '.join(GPU_TYPES)}")

    domain = get(cfg, "cluster.nvlink_domain_size")
    if domain is not None and pos_int(domain) is None:
        report.error(
            "cluster.nvlink_domain_size",
            f"cluster.nvlink_domain_size={domain!r} is not a positive integer; set the GPUs per NVLink domain "
            "(8 for HGX/DGX nodes, 72 for GB200/GB300 NVL72) or leave it unset to use the GPU type's",
        )

    m = mesh(cfg)
    if m is not None and m.world is not None:
        report.facts["world_size"] = m.world
    if pos_int(gpn) is not None:
        report.facts["gpus_per_node"] = gpn
    domain_size = nvlink_domain(cfg)
    if domain_size is not None:
        report.facts["nvlink_domain_size"] = domain_size
