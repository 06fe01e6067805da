"""Runtime of the RL stages (`ultra3 rl rlvr|teacher|mopd`): NeMo RL's own entry point on the Ray cluster that
recipes.launch brought up over the allocation (one node: NeMo RL starts its own Ray).

    python -m recipes.rl --config config.yaml

1. Cluster preflight: every group of the layout (`job.node_groups`) has its nodes in the Ray cluster, each
   with run.gpus_per_node GPUs, and a Ray task on every node writes into the job dir, which the driver reads
   back (the shared directory). `check_only: true` stops here, exit 0.
2. The policy: a Megatron checkpoint (an SFT job's) is exported to Hugging Face once, into the experiment's
   directory, with the export quantize uses.
3. The config: NeMo RL's YAML for `recipe` in its checkout (nemo_rl_dir) with `nemo_rl` merged in, W&B on when
   WANDB_API_KEY reached the job, written to <job dir>/nemo_rl.yaml: exactly what runs.
4. NeMo RL: `python examples/nemo_gym/run_grpo_nemo_gym.py --config <job dir>/nemo_rl.yaml` in nemo_rl_dir;
   a later job of the same experiment resumes from its checkpoints.
5. The output: the experiment's newest checkpoint converted to Hugging Face into output_dir, with NeMo RL's
   converter.

Exit codes: 0 done; 2 an input problem (one line on stderr); 3 the cluster preflight failed (one line
starting with PREFLIGHT FAILED); else NeMo RL's own.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys

import yaml

from .contract import GROUP_RESOURCE, PREFLIGHT_EXIT, PREFLIGHT_MARK, newest_step
from .dataprep.errors import DataPrepError
from .dataprep.settings import cli
from .quantization import megatron_export

PROG = "rl"
RECIPES = "examples/nemo_gym/nemotron-3-ultra"
ENTRY = "examples/nemo_gym/run_grpo_nemo_gym.py"
CONVERTER = "examples/converters/convert_megatron_to_hf.py"
RAY_WAIT_S = 120


def log(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def cluster_preflight(cfg: dict) -> str | None:
    """What is wrong with the Ray cluster for this layout, or None; prints each group's nodes."""
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        log("one node: NeMo RL starts its own Ray here")
        return None
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, logging_level="ERROR")
    try:
        alive = [n for n in ray.nodes() if n["Alive"]]
        gpus = int(cfg["run"].get("gpus_per_node") or 0)
        problems = []
        for group, count in cfg["job"].get("node_groups") or []:
            members = [n for n in alive if n["Resources"].get(GROUP_RESOURCE + group)]
            have = sorted(int(n["Resources"].get("GPU", 0)) for n in members)
            log(f"group {group}: {len(members)} of {count} node(s) in Ray "
                f"({', '.join(n['NodeManagerAddress'] for n in members) or 'none'}), GPUs per node {have}")
            if len(members) != count:
                problems.append(f"group {group} has {len(members)} of its {count} node(s) in the Ray cluster")
            if any(g < gpus for g in have):
                problems.append(f"group {group}: a node has {min(have)} GPU(s), the layout needs {gpus} "
                                "(run.gpus_per_node)")
        probe = ray.remote(num_cpus=0)(_write_probe)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(cfg["job"]["dir"], n["NodeID"]) for n in alive]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=RAY_WAIT_S)
        written = [ray.get(r) for r in ready]
        for node_id, path, error in written:
            if error:
                problems.append(f"the job dir is not writable from Ray node {node_id[:8]} ({error})")
            elif _read(path) != node_id:
                problems.append(f"the job dir is not shared: {path}, written on node {node_id[:8]}, is not here")
            if path:
                _remove(path)
        if len(written) < len(alive):
            problems.append(f"{len(alive) - len(written)} Ray node(s) ran no task in {RAY_WAIT_S}s")
        if not problems:
            log(f"shared job dir {cfg['job']['dir']} written from {len(written)} node(s) and read back here")
        return "; ".join(problems) or None
    finally:
        ray.shutdown()


def _write_probe(folder: str, node_id: str) -> tuple[str, str, str]:
    path = os.path.join(folder, f".ray-probe-{node_id[:16]}")
    try:
        with open(path, "w") as f:
            f.write(node_id)
    except OSError as e:
        return node_id, "", f"{socket.gethostname()}: {e.strerror}"
    return node_id, path, ""


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def policy(cfg: dict) -> str:
    """The starting policy as NeMo RL loads it: a Hugging Face checkpoint or hub id as given, a Megatron one
    exported first."""
    path = str(cfg.get("policy") or "")
    if not path:
        raise DataPrepError("policy: not set; give the starting Hugging Face checkpoint (or an SFT job's)")
    if not megatron_export.is_megatron(path):
        return path
    dest = os.path.join(os.path.dirname(cfg["nemo_rl"]["checkpointing"]["checkpoint_dir"]), "policy-hf")
    return megatron_export.export_once(path, dest, "policy", log)


def merge(base: dict, ours: dict) -> dict:
    """`ours` over `base`, table by table."""
    out = dict(base)
    for key, value in ours.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_config(cfg: dict, model: str) -> str:
    folder = str(cfg["nemo_rl_dir"])
    source = os.path.join(folder, RECIPES, f"{cfg['recipe']}.yaml")
    try:
        with open(source) as f:
            base = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise DataPrepError(f"nemo_rl_dir: cannot read NeMo RL's {source} ({e})") from None
    ours = merge(cfg.get("nemo_rl") or {}, {"policy": {"model_name": model}})
    if os.environ.get("WANDB_API_KEY"):
        ours = merge(ours, {"logger": {"wandb_enabled": True}})
    path = os.path.join(cfg["job"]["dir"], "nemo_rl.yaml")
    with open(path + ".tmp", "w") as f:
        f.write(f"# NeMo RL's {RECIPES}/{cfg['recipe']}.yaml with the job's values (ultra3 {cfg['job']['stage']})\n")
        yaml.safe_dump(merge(base, ours), f, sort_keys=False, width=120)
    os.replace(path + ".tmp", path)
    return path


def export_output(cfg: dict) -> int:
    """The experiment's newest checkpoint into output_dir as Hugging Face (NeMo RL's converter), once."""
    out = cfg.get("output_dir")
    if not out or os.path.isdir(out):
        return 0
    newest = newest_step(cfg["nemo_rl"]["checkpointing"]["checkpoint_dir"])
    if newest is None:
        raise DataPrepError(f"NeMo RL ended without a checkpoint in {cfg['nemo_rl']['checkpointing']['checkpoint_dir']}")
    step = newest[1]
    weights = sorted(glob.glob(os.path.join(step, "policy", "weights", "iter_*"))) or \
        [os.path.join(step, "policy", "weights")]
    partial = f"{out}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    argv = [sys.executable, CONVERTER, "--config", os.path.join(step, "config.yaml"),
            "--megatron-ckpt-path", weights[-1], "--hf-ckpt-path", partial]
    log(f"exporting {step} to Hugging Face: {' '.join(argv)}")
    code = subprocess.run(argv, cwd=cfg["nemo_rl_dir"], check=False).returncode
    if code == 0:
        os.replace(partial, out)
    return code


def run(path: str) -> int:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    problem = cluster_preflight(cfg)
    if problem:
        print(f"{PREFLIGHT_MARK}: {problem}", flush=True)
        return PREFLIGHT_EXIT
    if cfg.get("check_only"):
        log("cluster preflight passed; check_only: stopping before NeMo RL")
        return 0
    config = write_config(cfg, policy(cfg))
    log(f"NeMo RL config: {config}")
    argv = [sys.executable, ENTRY, "--config", config]
    log("+ " + " ".join(argv))
    code = subprocess.run(argv, cwd=cfg["nemo_rl_dir"], check=False).returncode
    return code or export_output(cfg)


def main(argv: list[str] | None = None) -> int:
    return cli(PROG, __doc__.split("\n\n")[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
