"""In-job entry point, one per node: preflight, then the stage's recipe the way its launch kind says:
torchrun over this node's GPUs; a Ray stage on a Ray cluster spanning the job's nodes (on one node the
recipe starts its own embedded Ray, or joins $RAY_ADDRESS under a Ray job); or one process.
Stdlib (plus PyYAML) only until the preflight has passed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

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
    if cfg["job"]["launch"] == "ray" and int(os.environ.get("SLURM_NNODES", "1")) > 1:
        raise SystemExit(ray_across_nodes(cfg, argv))
    print("+ " + " ".join(argv), flush=True)
    os.execv(argv[0], argv)


RAY_PORT = 6379


def ray_across_nodes(cfg: dict, driver: list[str]) -> int:
    """A Ray cluster over the Slurm allocation: the head and the driver on the first node, a worker on
    every other; the head's exit marker (in the shared job dir) releases the workers with exit 0."""
    head = os.environ.get("ULTRA3_HEAD_NODE") or "127.0.0.1"
    done = os.path.join(cfg["job"]["dir"], "ray-cluster.done")
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    # The cluster lives and dies with this allocation: no token (a token file would be a secret in the
    # shared job dir), and the same setting for the head, the workers, the driver and the wait below.
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env = dict(os.environ)
    if os.environ.get("SLURM_NODEID", "0") != "0":
        worker = subprocess.Popen([ray, "start", "--block", f"--address={head}:{RAY_PORT}"], env=env)
        while not os.path.exists(done):
            if worker.poll() is not None:
                return worker.returncode or 1
            time.sleep(2)
        worker.terminate()
        return 0
    head_proc = subprocess.Popen([ray, "start", "--head", "--block", f"--node-ip-address={head}",
                                  f"--port={RAY_PORT}", "--disable-usage-stats"], env=env)
    try:
        _wait_for_nodes(f"{head}:{RAY_PORT}", int(os.environ["SLURM_NNODES"]))
        print("+ " + " ".join(driver), flush=True)
        return subprocess.call(driver, env={**env, "RAY_ADDRESS": f"{head}:{RAY_PORT}"})
    finally:
        with open(done, "w") as f:
            f.write("done\n")
        head_proc.terminate()
        head_proc.wait(timeout=60)


def _wait_for_nodes(address: str, nodes: int, timeout: float = 600) -> None:
    import ray

    deadline = time.time() + timeout
    while True:
        try:
            ray.init(address=address, logging_level="ERROR")
            alive = sum(1 for n in ray.nodes() if n["Alive"])
            ray.shutdown()
            if alive >= nodes:
                print(f"ray cluster up: {alive} nodes", flush=True)
                return
        except ConnectionError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{preflight.MARK}: the Ray cluster did not reach {nodes} nodes in {timeout:.0f}s")
        time.sleep(3)


if __name__ == "__main__":
    main()
