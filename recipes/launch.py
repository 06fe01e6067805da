"""In-job entry point, one per node: preflight, then the stage's recipe the way its launch kind says
(torchrun over this node's GPUs, or one process). Stdlib (plus PyYAML) only."""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import preflight  # noqa: E402

PREFLIGHT_EXIT = 3


def load(path: str) -> dict:
    try:
        import yaml
    except ImportError:
        print(f"{preflight.MARK}: PyYAML is not installed in the job's Python ({sys.executable})", flush=True)
        raise SystemExit(PREFLIGHT_EXIT) from None
    with open(path) as f:
        return yaml.safe_load(f)


def torchrun_argv(cfg: dict, script: str, config: str) -> list[str]:
    run, job = cfg["run"], cfg["job"]
    nodes = int(run.get("nodes") or 1)
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={run.get('gpus_per_node') or 1}"]
    if nodes == 1:
        argv.append("--standalone")
    else:
        head = os.environ.get("ULTRA3_HEAD_NODE") or os.environ.get("MASTER_ADDR", "localhost")
        argv += [f"--nnodes={nodes}", f"--node-rank={os.environ.get('SLURM_NODEID', '0')}",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={head}:29500", f"--rdzv-id={job['id']}"]
    return [*argv, script, "--config", config]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    cfg = load(args.config)
    if not preflight.report(cfg):
        raise SystemExit(PREFLIGHT_EXIT)
    script = os.path.join(HERE, cfg["job"]["recipe"])
    if cfg["job"]["launch"] == "torchrun":
        argv = torchrun_argv(cfg, script, args.config)
    else:
        argv = [sys.executable, script, "--config", args.config]
    print("+ " + " ".join(argv), flush=True)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
