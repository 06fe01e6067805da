"""In-job entry point, one per node (`python -m recipes.launch --config config.yaml` in the code dir):
preflight, then the stage's recipe module (job.recipe) the way its launch kind says: torchrun over this
node's GPUs; a Ray stage on a Ray cluster spanning the job's nodes (on one node the recipe runs its own
workers, or joins $RAY_ADDRESS under a Ray job). The recipe runs as a child process; once it has
succeeded, the first node publishes the job's declared outputs (job.produces) in the artifact store.
Stdlib (plus PyYAML) only until the preflight has passed."""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import attempts, compile_cache, contract, preflight, quiet
from .contract import CONTINUE_EXIT, HEAD_NODE_VAR, PREFLIGHT_EXIT, PREFLIGHT_MARK, RDZV_PORT
from .nodes import free_port, preflight_everywhere, run_child
from .publish import record_outputs
from .ray_nodes import ray_across_nodes


def load(path: str) -> dict:
    try:
        import yaml
    except ImportError:
        print(f"{PREFLIGHT_MARK}: PyYAML is not installed in the job's Python ({sys.executable})", flush=True)
        raise SystemExit(PREFLIGHT_EXIT) from None
    with open(path) as f:
        return yaml.safe_load(f)


def torchrun_argv(cfg: dict, module: str, config: str, round_: str = "") -> list[str]:
    """The command of this node's ranks; `round_` tells a later start in the same allocation (its own rendezvous)."""
    run, job = cfg["run"], cfg["job"]
    if (run.get("fault_tolerance") or {}).get("enabled"):  # ft_launcher, one rank too (recipes/ft_launcher.py)
        return [sys.executable, "-m", "recipes.ft_launcher", "--module", module, "--config", config,
                *(["--round", round_] if round_ else [])]
    nodes, per_node = int(run.get("nodes") or 1), int(run.get("gpus_per_node") or 1)
    if nodes == per_node == 1:  # one rank: run it directly, so its own exit code and last line are the job's
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1"))})
        return [sys.executable, "-m", module, "--config", config]
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={per_node}"]
    if nodes == 1:
        argv.append("--standalone")
    else:
        head = os.environ.get(HEAD_NODE_VAR) or os.environ.get("MASTER_ADDR", "localhost")
        argv += [f"--nnodes={nodes}", f"--node-rank={os.environ.get('SLURM_NODEID', '0')}",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={head}:{RDZV_PORT}",
                 f"--rdzv-id={'-'.join(filter(None, (job['id'], round_)))}"]
    return [*argv, "--module", module, "--config", config]


def main() -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    quiet.install()  # before anything starts: its settings reach the recipe, its ranks and Ray's nodes
    # one write per line (not two, as unbuffered print does): the nodes' launchers share the job log
    sys.stdout.reconfigure(line_buffering=True, write_through=False)
    cfg = load(args.config)
    first = os.environ.get("SLURM_NODEID", "0") == "0"
    attempt = attempts.begin(cfg) if first else None
    if isinstance(attempt, int) or (not first and attempts.finished(cfg)):  # finished, or out of retries
        return attempt or 0
    watch = attempts.Watch(cfg, attempt if first else None)
    code = run_stage(cfg, args.config, watch)
    if code == 0 and first:
        code = publish(cfg, time.monotonic() - started)
    if first:
        return attempts.end(cfg, attempt, code, watch)
    # the first node decides what follows; a node ending non-zero would end it first (srun --kill-on-bad-exit)
    return 0 if code == CONTINUE_EXIT else code


def run_stage(cfg: dict, config: str, watch: attempts.Watch) -> int:
    """The preflight, then the stage on this node."""
    job = cfg["job"]
    nodes = int(os.environ.get("SLURM_NNODES", "1"))
    if nodes > 1:
        print(f"node {os.environ.get('SLURM_NODEID')} of {nodes}: {os.environ.get('SLURMD_NODENAME')}")
    if os.environ.get("SLURM_NODEID", "0") == "0":
        for inp in job.get("inputs") or []:  # where every input came from, as the dry run said it
            if inp.get("path"):
                print(f"input {inp['name']}: {inp['key']} = {inp['path']}  ({inp.get('how') or 'set in the config'})")
    if not (preflight_everywhere(cfg, nodes) if nodes > 1 else preflight.report(cfg)):
        return PREFLIGHT_EXIT
    said = compile_cache.settle(cfg)  # before the recipe starts: its processes inherit the caches' variables
    if said and os.environ.get("SLURM_NODEID", "0") == "0":
        print(said, flush=True)
    if job["launch"] == "torchrun":
        argv = torchrun_argv(cfg, job["recipe"], config)
    else:
        argv = [sys.executable, "-m", job["recipe"], "--config", config]
    if job["launch"] == "ray" and nodes > 1:
        return ray_across_nodes(cfg, argv, watch.armed)
    code = run_child(argv, started=watch.armed)
    if code == 0 and contract.next_phase(cfg):  # phase 1 saved at the switch: phase 2 follows in fresh processes
        if watch.signalled:  # the time limit is near: the next allocation starts it
            return CONTINUE_EXIT
        print(f"ultra3: phase 1 ended at iteration {contract.phase2_start(cfg):,}; phase 2 starts in this allocation",
              flush=True)
        code = run_child(torchrun_argv(cfg, job["recipe"], config, "phase2"), started=watch.armed)
    return code


def publish(cfg: dict, seconds: float) -> int:
    """The job's declared outputs (job.produces) into the artifact store, one line each; exit 1 (publishing
    nothing) when one is missing. A config that declares none, or names no store, publishes nothing."""
    job = cfg["job"]
    if not job.get("produces") or not job.get("artifacts_root"):
        return 0
    missing = next((out for out in job["produces"] if not os.path.exists(out["path"])), None)
    if missing:
        print(f"{job.get('stage')}: error: the job ended without its {missing['kind']} output at {missing['path']}",
              file=sys.stderr, flush=True)
        return 1
    try:
        published = record_outputs(cfg, seconds)
    except (OSError, ValueError) as e:  # an unwritable store: the outputs stay, the job says why it failed
        print(f"{job.get('stage')}: error: cannot publish to the artifact store {job['artifacts_root']}: {e}",
              file=sys.stderr, flush=True)
        return 1
    for manifest in published:
        print(f"published {manifest['name']}:v{manifest['version']} -> {manifest['path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
