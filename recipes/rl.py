"""Runtime of the RL stages (`ultra3 rl rlvr|teacher|mopd`): NeMo RL's own entry point on the Ray cluster that
recipes.launch brought up over the allocation (one node: NeMo RL starts its own Ray).

    python -m recipes.rl --config config.yaml

1. Cluster preflight: every group of the layout (`job.node_groups`) has its nodes in the Ray cluster, each
   with run.gpus_per_node GPUs, and a Ray task on every node writes into the job dir, which the driver reads
   back (the shared directory); with sandbox.image set, that task also waits for NeMo Skills' sandbox to answer
   on its node. `check_only: true` stops here, exit 0.
2. The experiment: one job at a time, through a lock on `<experiment dir>/.lock` held to the end.
3. The policy: a Megatron checkpoint (an SFT job's) is exported to Hugging Face once, into the experiment's
   directory, with the export quantize uses (under NeMo RL's Megatron Python when this one lacks Megatron).
4. The config: NeMo RL's YAML for `recipe` in its checkout (nemo_rl_dir) with `nemo_rl` merged in, W&B on when
   WANDB_API_KEY reached the job, written to <job dir>/nemo_rl.yaml: exactly what runs.
5. NeMo RL: its entry script (`job.nemo_rl.entry`) with `--config <job dir>/nemo_rl.yaml` in nemo_rl_dir; a
   later job of the same experiment resumes from its checkpoints.
6. The output: unless NeMo RL stopped short of max_steps at its time limit, the experiment's newest checkpoint
   converted to Hugging Face into output_dir with NeMo RL's converter (again when a newer step exists).

Exit codes: 0 done; 1 stopped early (the time limit before max_steps, or the experiment in use by another job:
one line on stderr); 2 an input problem (one line on stderr); 3 the cluster preflight failed (one line
starting with PREFLIGHT FAILED); else NeMo RL's own.
"""

from __future__ import annotations

import fcntl
import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time

import yaml

from . import quiet, rl_steps
from .contract import CONTINUE_EXIT, GROUP_RESOURCE, PREFLIGHT_EXIT, PREFLIGHT_MARK, newest_step
from .dataprep.errors import DataPrepError
from .dataprep.settings import cli
from .quantization import megatron_export

PROG = "rl"
MCORE_CONTAINER = "NeMo RL's container, whose uv environment has the mcore extra"
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `python -m recipes.rl` runs
RAY_WAIT_S = 120
SANDBOX_WAIT_S, SANDBOX_POLL_S = 600, 2  # NeMo RL's ray.sub gives the sandbox 10 minutes too
LOCK = ".lock"  # in the experiment dir: who runs it now
EXPORTED_STEP = "ultra3_step.txt"  # in output_dir: the checkpoint step it was converted from


class RLError(DataPrepError):
    """A problem with the RL job's config, inputs or experiment: one line on stderr, exit 2."""


def log(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def stop(message: str) -> int:
    """An early end that is not an input problem: one line on stderr, exit 1."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 1


def cluster_preflight(cfg: dict) -> str | None:
    """What is wrong with the Ray cluster for this layout, or None; prints each group's nodes."""
    port = sandbox_port(cfg)
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        log("one node: NeMo RL starts its own Ray here")
        if port and not sandbox_answers(port):
            return (f"NeMo Skills' sandbox did not answer on port {port} within {SANDBOX_WAIT_S}s on "
                    f"{socket.gethostname()}")
        return None
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, logging_level=quiet.RAY_LEVEL)
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
        probe = ray.remote(num_cpus=0)(_node_probe)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(cfg["job"]["dir"], n["NodeID"], port) for n in alive]
        wait_s = RAY_WAIT_S + (SANDBOX_WAIT_S if port else 0)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        written = [ray.get(r) for r in ready]
        for node_id, path, error, _ in written:
            if error:
                problems.append(f"the job dir is not writable from Ray node {node_id[:8]} ({error})")
            elif _read(path) != node_id:
                problems.append(f"the job dir is not shared: {path}, written on node {node_id[:8]}, is not here")
            if path:
                _remove(path)
        if len(written) < len(alive):
            problems.append(f"{len(alive) - len(written)} Ray node(s) ran no task in {wait_s}s")
        if silent := [host for _, _, _, host in written if host]:
            problems.append(f"NeMo Skills' sandbox did not answer on port {port} within {SANDBOX_WAIT_S}s on "
                            f"{', '.join(sorted(silent))}")
        if not problems:
            log(f"shared job dir {cfg['job']['dir']} written from {len(written)} node(s) and read back here")
            if port:
                log(f"NeMo Skills' sandbox answers on port {port} on {len(written)} node(s)")
        return "; ".join(problems) or None
    finally:
        ray.shutdown()


def sandbox_port(cfg: dict) -> int | None:
    """The port NeMo Skills' sandbox listens on every node, when the job starts one (sandbox.image set)."""
    sandbox = cfg.get("sandbox") or {}
    return int(sandbox["port"]) if sandbox.get("image") else None


def sandbox_answers(port: int, wait_s: float = SANDBOX_WAIT_S) -> bool:
    """Whether localhost:`port` accepts a TCP connection within `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=SANDBOX_POLL_S).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(SANDBOX_POLL_S)


def _node_probe(folder: str, node_id: str, port: int | None) -> tuple[str, str, str, str]:
    """On one Ray node: (node id, the file written into the job dir or "", why not, this host where the
    sandbox at `port` did not answer or "")."""
    silent = "" if port is None or sandbox_answers(port) else socket.gethostname()
    path = os.path.join(folder, f".ray-probe-{node_id[:16]}")
    try:
        with open(path, "w") as f:
            f.write(node_id)
    except OSError as e:
        return node_id, "", f"{socket.gethostname()}: {e.strerror}", silent
    return node_id, path, "", silent


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


def experiment_dir(cfg: dict) -> str:
    return os.path.dirname(cfg["nemo_rl"]["checkpointing"]["checkpoint_dir"])


def lock_experiment(path: str) -> int | None:
    """An exclusive lock on `path` (its open descriptor, held until closed), or None when another job holds
    it; the holder writes its Slurm job and host into the file, for the message of the next one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as e:
        os.close(fd)
        raise RLError(f"cannot lock {path} ({e.strerror}): the experiment's directory needs a filesystem with "
                      "file locks (Lustre: mount with -o flock)") from None
    job = os.environ.get("SLURM_JOB_ID")
    holder = f"Slurm job {job}" if job else f"process {os.getpid()}"
    os.ftruncate(fd, 0)
    os.write(fd, f"{holder} on {socket.gethostname()}\n".encode())
    return fd


def mcore_python(cfg: dict) -> list[str]:
    """A Python with Megatron: NeMo RL's `mcore` extra through uv where uv is (NeMo RL's container keeps its
    default environment without it, and its converter says to run so), else this one."""
    uv = shutil.which("uv")
    return [uv, "run", "--project", str(cfg["nemo_rl_dir"]), "--extra", "mcore", "python"] if uv else [sys.executable]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def policy(cfg: dict, config: str) -> str:
    """The starting policy as NeMo RL loads it: a Hugging Face checkpoint or hub id as given, a Megatron one
    exported first (here, or, when this Python lacks Megatron-Bridge, by `--export-policy` under NeMo RL's)."""
    path = str(cfg.get("policy") or "")
    if not path:
        raise RLError("policy: not set; give the starting Hugging Face checkpoint (or an SFT job's)")
    if not megatron_export.is_megatron(path):
        return path
    dest = os.path.join(experiment_dir(cfg), "policy-hf")
    if os.path.isdir(dest) or _importable("megatron.bridge") or not shutil.which("uv"):
        return megatron_export.export_once(path, dest, "policy", log, MCORE_CONTAINER)
    argv = [*mcore_python(cfg), "-m", "recipes.rl", "--config", os.path.abspath(config), "--export-policy"]
    log("+ " + " ".join(argv))
    code = subprocess.run(argv, cwd=CODE_ROOT, check=False).returncode
    if code:
        raise RLError(f"policy: exporting {path} to Hugging Face under NeMo RL's mcore Python failed "
                      f"(exit {code}, its error above)")
    return dest


def export_policy(config: str) -> int:
    """`--export-policy`: only the Megatron policy's export (policy() runs it under a Python with Megatron)."""
    with open(config) as f:
        cfg = yaml.safe_load(f)
    megatron_export.export_once(str(cfg["policy"]), os.path.join(experiment_dir(cfg), "policy-hf"), "policy", log,
                                MCORE_CONTAINER)
    return 0


def merge(base: dict, ours: dict) -> dict:
    """`ours` over `base`, table by table."""
    out = dict(base)
    for key, value in ours.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_config(cfg: dict, model: str) -> str:
    folder, recipes = str(cfg["nemo_rl_dir"]), cfg["job"]["nemo_rl"]["directory"]
    source = os.path.join(folder, recipes, f"{cfg['recipe']}.yaml")
    try:
        with open(source) as f:
            base = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise RLError(f"nemo_rl_dir: cannot read NeMo RL's {source} ({e})") from None
    ours = merge(cfg.get("nemo_rl") or {}, {"policy": {"model_name": model}})
    if os.environ.get("WANDB_API_KEY"):
        ours = merge(ours, {"logger": {"wandb_enabled": True}})
    path = os.path.join(cfg["job"]["dir"], "nemo_rl.yaml")
    with open(path + ".tmp", "w") as f:
        f.write(f"# NeMo RL's {recipes}/{cfg['recipe']}.yaml with the job's values (ultra3 {cfg['job']['stage']})\n")
        yaml.safe_dump(merge(base, ours), f, sort_keys=False, width=120)
    os.replace(path + ".tmp", path)
    return path


def export_output(cfg: dict, newest: tuple[int, str] | None) -> int:
    """The experiment's newest checkpoint into output_dir as Hugging Face (NeMo RL's converter), unless
    output_dir already holds that step (EXPORTED_STEP); written beside it, then swapped in."""
    out = cfg.get("output_dir")
    if not out:
        return 0
    if newest is None:
        raise RLError(f"NeMo RL ended without a checkpoint in {cfg['nemo_rl']['checkpointing']['checkpoint_dir']}")
    number, step = newest
    exported = _read(os.path.join(out, EXPORTED_STEP)).strip()
    if exported == str(number):
        log(f"{out} already holds step {number}")
        return 0
    if not exported and os.path.isdir(out) and os.listdir(out):
        raise RLError(f"output_dir {out} holds something else (no {EXPORTED_STEP}); give another output_dir or "
                      "remove it")
    weights = sorted(glob.glob(os.path.join(step, "policy", "weights", "iter_*"))) or \
        [os.path.join(step, "policy", "weights")]
    partial = f"{out}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    argv = [*mcore_python(cfg), cfg["job"]["nemo_rl"]["converter"], "--config", os.path.join(step, "config.yaml"),
            "--megatron-ckpt-path", weights[-1], "--hf-ckpt-path", partial]
    log(f"exporting {step} to Hugging Face: {' '.join(argv)}")
    code = subprocess.run(argv, cwd=cfg["nemo_rl_dir"], check=False).returncode
    if code:
        return code
    if not os.path.isdir(partial):
        raise RLError(f"NeMo RL's converter exited 0 without writing {partial}")
    with open(os.path.join(partial, EXPORTED_STEP), "w") as f:
        f.write(f"{number}\n")
    old = f"{out}.old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(out):
        os.replace(out, old)
    os.replace(partial, out)
    shutil.rmtree(old, ignore_errors=True)
    log(f"exported step {number} to {out}")
    return 0


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
    lock = os.path.join(experiment_dir(cfg), LOCK)
    fd = lock_experiment(lock)
    if fd is None:
        holder = _read(lock).strip() or "another job"
        return stop(f"experiment {cfg['experiment']} is in use by {holder} ({lock}); wait for that job to end or "
                    "cancel it, or set experiment=NAME to start a separate one")
    try:
        return train(cfg, path)
    finally:
        os.close(fd)


def train(cfg: dict, path: str) -> int:
    """NeMo RL on the experiment, then its output, once NeMo RL has trained what was asked."""
    config = write_config(cfg, policy(cfg, path))
    log(f"NeMo RL config: {config}")
    argv = [sys.executable, cfg["job"]["nemo_rl"]["entry"], "--config", config]
    log("+ " + " ".join(argv))
    env = dict(os.environ)
    if entity := (cfg.get("wandb") or {}).get("entity"):
        env["WANDB_ENTITY"] = str(entity)
    code = run_nemo_rl(argv, cfg["nemo_rl_dir"], env)
    if code:
        return code
    # NeMo RL also exits 0 when it saves and stops at checkpointing.checkpoint_must_save_by
    newest = newest_step(cfg["nemo_rl"]["checkpointing"]["checkpoint_dir"])
    with open(config) as f:
        done, target = newest[0] if newest else 0, step_budget(cfg, yaml.safe_load(f))
    if target is not None and done < target:
        log(f"stopped at step {done} of {target} for the time limit (checkpointing.checkpoint_must_save_by); the "
            f"next allocation resumes from step {done}")
        return CONTINUE_EXIT
    return export_output(cfg, newest)


def run_nemo_rl(argv: list[str], cwd: str, env: dict[str, str]) -> int:
    """NeMo RL with its output passed through, and after each step's block one `rl: step N/M ...` line
    (rl_steps) for the figures (benchmarks/gpu_smoke.py)."""
    steps = rl_steps.StepLog()
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True,
                          errors="replace", bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            if summary := steps.feed(line):
                log(summary.removeprefix(f"{PROG}: "))
    if summary := steps.close():
        log(summary.removeprefix(f"{PROG}: "))
    sys.stdout.flush()
    return proc.returncode


def step_budget(cfg: dict, ran: dict) -> int | None:
    """The steps NeMo RL trains before it stops by itself, by the config it ran (`ran`): max_steps, or fewer when
    its epochs over the train file (grpo.max_num_epochs x rows // grpo.num_prompts_per_step) end first; None
    when max_steps is null."""
    target = cfg.get("max_steps")
    grpo = ran.get("grpo") or {}
    epochs, prompts = grpo.get("max_num_epochs"), grpo.get("num_prompts_per_step")
    path = ((ran.get("data") or {}).get("train") or {}).get("data_path")
    if target is None or not (epochs and prompts and path and os.path.isfile(path)):
        return target
    with open(path, "rb") as f:
        rows = sum(1 for line in f if line.strip())
    return min(target, int(epochs) * (rows // int(prompts)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--export-policy" in argv:
        return cli(PROG, export_policy.__doc__, export_policy, [a for a in argv if a != "--export-policy"])
    return cli(PROG, __doc__.split("\n\n")[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
