"""The ranks of a torchrun stage under nvidia-resiliency-ext's ft_launcher (run.fault_tolerance.enabled): one per
node like torchrun, with c10d rendezvous, in-job restarts of every rank when one hangs or dies (--max-restarts),
and Megatron-Bridge's FT sections' timeouts (setup, step, checkpointing; out of section). Flags as its 0.6 launcher
takes them. Stdlib only."""

from __future__ import annotations

import os
import sys

from .contract import HEAD_NODE_VAR

RDZV_PORT = 29500


def ft_launcher_argv(cfg: dict, module: str, config: str) -> list[str]:
    run, job = cfg["run"], cfg["job"]
    ft = run["fault_tolerance"]
    nodes, per_node = int(run.get("nodes") or 1), int(run.get("gpus_per_node") or 1)
    argv = [os.path.join(os.path.dirname(sys.executable), "ft_launcher"), f"--nproc-per-node={per_node}",
            f"--max-restarts={ft['max_restarts']}",
            f"--ft-rank-section-timeouts=setup:{ft['setup_timeout_s']},step:{ft['step_timeout_s']},"
            f"checkpointing:{ft['checkpointing_timeout_s']}",
            f"--ft-rank-out-of-section-timeout={ft['out_of_section_timeout_s']}"]
    if nodes == 1:
        argv.append("--standalone")
    else:
        head = os.environ.get(HEAD_NODE_VAR) or os.environ.get("MASTER_ADDR", "localhost")
        argv += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={head}:{RDZV_PORT}",
                 f"--rdzv-id={job['id']}"]
    return [*argv, "--module", module, "--config", config]
