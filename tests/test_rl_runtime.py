"""The RL runtime (recipes.rl) run for real in a subprocess against a stand-in NeMo RL checkout: the recorded
entry script and converter paths (src/ultra3/nemo_rl_api/record.json) hold small scripts that save step_N
checkpoints as NeMo RL names them and write a Hugging Face config. Covered: finishing honestly at the time
limit, one job per experiment, the output re-exported when the step changes, uv's mcore Python for the
converter and the policy export, W&B's entity, NeMo Skills' sandbox port, and the topology resources
recipes.launch gives Ray for NeMo RL. No Ray: one node, NeMo RL (here its stand-in) on its own."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from recipes import ray_nodes, rl, rl_steps
from recipes.contract import CONTINUE_EXIT

REPO = Path(__file__).resolve().parents[1]
RECORD = json.loads((REPO / "src/ultra3/nemo_rl_api/record.json").read_text())
NEMO_RL = {k: RECORD[k] for k in ("commit", "directory", "entry", "converter")}

ENTRY = """\
import argparse, os, pathlib, time, yaml
p = argparse.ArgumentParser(); p.add_argument("--config"); cfg = yaml.safe_load(open(p.parse_args().config))
if os.environ.get("STAND_IN_HOLD"):  # stay running until the test lets go
    pathlib.Path(os.environ["STAND_IN_HOLD"] + ".started").touch()
    while not os.path.exists(os.environ["STAND_IN_HOLD"]):
        time.sleep(0.05)
step = int(os.environ["STAND_IN_STEP"])
if os.environ.get("STAND_IN_LOG"):  # NeMo RL's printout of its steps
    print(open(os.environ["STAND_IN_LOG"]).read(), end="")
ckpt = pathlib.Path(cfg["checkpointing"]["checkpoint_dir"], f"step_{step}")
(ckpt / "policy" / "weights" / f"iter_{step:07d}").mkdir(parents=True, exist_ok=True)
(ckpt / "config.yaml").write_text(yaml.safe_dump(cfg))
pathlib.Path(os.environ["STAND_IN_SEEN"]).write_text(yaml.safe_dump(
    {"model": cfg["policy"]["model_name"], "wandb_entity": os.environ.get("WANDB_ENTITY")}))
if step < cfg["grpo"]["max_num_steps"]:
    print("Timeout has been reached, stopping training early")
"""
CONVERTER = """\
import argparse, json, pathlib
p = argparse.ArgumentParser()
for flag in ("--config", "--megatron-ckpt-path", "--hf-ckpt-path"):
    p.add_argument(flag)
a = p.parse_args()
pathlib.Path(a.hf_ckpt_path).mkdir(parents=True)
pathlib.Path(a.hf_ckpt_path, "config.json").write_text(json.dumps({"converted_from": a.megatron_ckpt_path}))
"""
UV = """\
#!/bin/sh
echo "$@" >> "$UV_LOG"
while [ "$1" != python ]; do shift; done
shift
exec "$STAND_IN_PYTHON" "$@"
"""
TIME_LIMIT = ("rl: stopped at step 40 of 128 for the time limit (checkpointing.checkpoint_must_save_by); the next "
              "allocation resumes from step 40")


@pytest.fixture
def job(tmp_path) -> dict:
    """A job config as the launcher writes it, with a stand-in NeMo RL checkout at nemo_rl_dir."""
    checkout = tmp_path / "nemo-rl"
    for path, text in ((NEMO_RL["entry"], ENTRY), (NEMO_RL["converter"], CONVERTER),
                       (f"{NEMO_RL['directory']}/student_rlvr1.yaml",
                        "grpo: {max_num_steps: 1000000}\ncheckpointing: {checkpoint_dir: results}\n"
                        "logger: {wandb_enabled: false}\n")):
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    policy = tmp_path / "policy-hf"
    policy.mkdir()
    (tmp_path / "job").mkdir()
    experiment = tmp_path / "outputs" / "rlvr"
    return {"recipe": "student_rlvr1", "nemo_rl_dir": str(checkout), "experiment": "rlvr", "policy": str(policy),
            "output_dir": str(tmp_path / "hf-rlvr1"), "check_only": False, "max_steps": 128,
            "wandb": {"project": "nemotron-3-ultra", "entity": "ultra-team"},
            "sandbox": {"image": None, "command": "/start-with-nginx.sh", "port": 6000}, "run": {"gpus_per_node": 1},
            "nemo_rl": {"checkpointing": {"checkpoint_dir": str(experiment / "checkpoints")},
                        "grpo": {"max_num_steps": 128}},
            "job": {"dir": str(tmp_path / "job"), "stage": "rl rlvr", "node_groups": [["train", 1]],
                    "nemo_rl": NEMO_RL}}


def start(job: dict, step: int, path: str | None = None, **env: str) -> subprocess.Popen:
    """`python -m recipes.rl --config` as recipes.launch runs it on one node (no Ray, no uv on PATH)."""
    config = Path(job["job"]["dir"], "config.yaml")
    config.write_text(yaml.safe_dump(job))
    env = {"PATH": path or "/usr/bin:/bin", "STAND_IN_STEP": str(step),
           "STAND_IN_SEEN": str(Path(job["job"]["dir"], "seen.yaml")), "STAND_IN_PYTHON": sys.executable, **env}
    return subprocess.Popen([sys.executable, "-m", "recipes.rl", "--config", str(config)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(job: dict, step: int, path: str | None = None, **env: str) -> tuple[int, str, str]:
    out, err = (child := start(job, step, path, **env)).communicate(timeout=60)
    return child.returncode, out, err


def exported(job: dict) -> tuple[str, str]:
    out = Path(job["output_dir"])
    return json.loads((out / "config.json").read_text())["converted_from"], (out / rl.EXPORTED_STEP).read_text()


def test_stopping_at_the_time_limit_is_not_finishing(job):
    """NeMo RL exits 0 when checkpoint_must_save_by stops it: short of max_steps, nothing is exported and the
    job exits CONTINUE_EXIT, so the supervisor requeues it; the next attempt, once step 128 is saved, exports it."""
    code, out, err = run(job, 40)
    assert code == CONTINUE_EXIT, (out, err)
    assert TIME_LIMIT in out.splitlines() and not err
    assert "Timeout has been reached, stopping training early" in out
    assert not Path(job["output_dir"]).exists() and not Path(job["output_dir"] + ".partial").exists()
    code, out, err = run(job, 128)
    assert code == 0, (out, err)
    assert exported(job) == (f"{job['nemo_rl']['checkpointing']['checkpoint_dir']}/step_128/policy/weights/"
                             "iter_0000128", "128\n")
    seen = yaml.safe_load(Path(job["job"]["dir"], "seen.yaml").read_text())
    assert seen == {"model": job["policy"], "wandb_entity": "ultra-team"}  # W&B's entity reaches NeMo RL


STEP_LOG = REPO / "tests" / "data" / "nemo_rl" / "grpo_steps.log"  # NeMo RL's step blocks, as its grpo.py prints
STEP_LINES = ["rl: step 1/3 reward 0.2500 kl 0.0004 loss 0.0123 step_s 41.20 generation_s 12.31 training_s 9.87",
              "rl: step 2/3 reward 0.0000 kl 0.0003 loss -0.0104 step_s 18.44 generation_s 7.50 training_s 4.12",
              "rl: step 3/3 reward 0.5000 kl 0.0002 loss 0.0051 step_s 25.03 generation_s 7.01 training_s 4.40"]


def test_each_step_of_nemo_rl_gets_one_line(job):
    job["max_steps"] = job["nemo_rl"]["grpo"]["max_num_steps"] = 3
    code, out, err = run(job, 3, STAND_IN_LOG=str(STEP_LOG))
    assert code == 0, (out, err)
    assert [line for line in out.splitlines() if line.startswith("rl: step ")] == STEP_LINES
    assert "  • Avg Reward: 0.2500" in out.splitlines()  # NeMo RL's own output passes through
    assert [rl_steps.parse(line)["reward"] for line in STEP_LINES] == [0.25, 0.0, 0.5]


def test_epochs_ending_before_max_steps_is_finishing(job, tmp_path):
    """One epoch over 10 train rows at 4 prompts a step is 2 steps: NeMo RL stopping at step 2 of max_steps 128
    has finished (its epochs ran out), so the output is exported."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"row": i}) + "\n" for i in range(10)))
    job["nemo_rl"]["grpo"].update(max_num_epochs=1, num_prompts_per_step=4)
    job["nemo_rl"]["data"] = {"train": {"data_path": str(train)}}
    code, out, err = run(job, 2)
    assert code == 0, (out, err)
    assert exported(job)[1] == "2\n"


def test_without_max_steps_exit_0_is_finished(job):
    """max_steps null: the recipe's epochs decide when NeMo RL ends, so its exit 0 is the end."""
    job["max_steps"] = None
    code, out, err = run(job, 40)
    assert code == 0, (out, err)
    assert exported(job)[1] == "40\n"


def test_output_is_exported_again_when_the_step_changes(job):
    code, _, err = run(job, 128)
    assert code == 0, err
    job["max_steps"] = 178  # phase 2 of the same experiment
    job["nemo_rl"]["grpo"]["max_num_steps"] = 178
    code, out, err = run(job, 178)
    assert code == 0, err
    assert exported(job)[0].endswith("/step_178/policy/weights/iter_0000178") and exported(job)[1] == "178\n"
    assert not list(Path(job["output_dir"]).parent.glob("hf-rlvr1.*"))  # no .partial or .old left behind
    code, out, err = run(job, 178)  # nothing new: the export stays as it is
    assert code == 0, err
    assert f"rl: {job['output_dir']} already holds step 178" in out and "exporting" not in out


def test_output_dir_of_something_else_is_left_alone(job):
    Path(job["output_dir"]).mkdir()
    Path(job["output_dir"], "mine.txt").write_text("not an export")
    code, _, err = run(job, 128)
    assert code == 2
    assert err.splitlines() == [f"rl: error: output_dir {job['output_dir']} holds something else (no "
                                f"{rl.EXPORTED_STEP}); give another output_dir or remove it"]


def test_a_second_job_of_the_same_experiment_stops(job, tmp_path):
    hold = tmp_path / "release"
    first = start(job, 128, STAND_IN_HOLD=str(hold), SLURM_JOB_ID="4242")
    try:
        deadline = time.monotonic() + 20
        while not Path(f"{hold}.started").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code, _, err = run(job, 128, SLURM_JOB_ID="4243")
        lock = Path(job["nemo_rl"]["checkpointing"]["checkpoint_dir"]).parent / ".lock"
        assert code == 1
        assert err.splitlines() == [
            f"rl: error: experiment rlvr is in use by Slurm job 4242 on {socket.gethostname()} ({lock}); wait for "
            "that job to end or cancel it, or set experiment=NAME to start a separate one"]
    finally:
        hold.touch()
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, (out, err)
    code, _, err = run(job, 128, SLURM_JOB_ID="4244")  # the lock went with the first job
    assert code == 0, err
    assert lock.read_text() == f"Slurm job 4244 on {socket.gethostname()}\n"


def test_megatron_runs_under_uv_mcore(job, tmp_path):
    """With uv on PATH, the converter and the Megatron policy's export (this Python has no Megatron-Bridge)
    run as `uv run --project <nemo_rl_dir> --extra mcore python ...` (uv here: a stand-in running this Python)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "uv").write_text(UV)
    (tools / "uv").chmod(0o755)
    path, uv_log = f"{tools}:/usr/bin:/bin", tmp_path / "uv.log"
    code, out, err = run(job, 128, path, UV_LOG=str(uv_log))
    assert code == 0, err
    calls = uv_log.read_text().splitlines()
    assert calls == [f"run --project {job['nemo_rl_dir']} --extra mcore python {NEMO_RL['converter']} --config "
                     f"{job['nemo_rl']['checkpointing']['checkpoint_dir']}/step_128/config.yaml --megatron-ckpt-path "
                     f"{job['nemo_rl']['checkpointing']['checkpoint_dir']}/step_128/policy/weights/iter_0000128 "
                     f"--hf-ckpt-path {job['output_dir']}.partial"]
    megatron = tmp_path / "sft-checkpoint"
    megatron.mkdir()
    (megatron / "latest_checkpointed_iteration.txt").write_text("10")
    job["policy"] = str(megatron)
    code, out, err = run(job, 128, path, UV_LOG=str(uv_log))
    config = Path(job["job"]["dir"], "config.yaml")
    assert uv_log.read_text().splitlines()[1] == (f"run --project {job['nemo_rl_dir']} --extra mcore python -m "
                                                  f"recipes.rl --config {config} --export-policy")
    # the export itself ran in the child (it finds no SFT job config beside this checkpoint), which said why
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2, err
    assert lines[0].startswith(f"rl: error: policy: {megatron} is a Megatron checkpoint, but no job config")
    assert lines[1] == (f"rl: error: policy: exporting {megatron} to Hugging Face under NeMo RL's mcore Python "
                        "failed (exit 2, its error above)")


def test_sandbox_port_answers_or_not():
    with socket.create_server(("localhost", 0)) as server:
        port = server.getsockname()[1]
        assert rl.sandbox_answers(port, wait_s=0)
    assert not rl.sandbox_answers(port, wait_s=0)  # closed now
    assert rl.sandbox_port({"sandbox": {"image": None, "port": 6000}}) is None
    assert rl.sandbox_port({"sandbox": {"image": "/sqsh/nemo-skills.sqsh", "port": 6000}}) == 6000


@pytest.mark.parametrize("env, rank", [
    ({"SLURM_TOPOLOGY_ADDR": "block3.node017", "SLURM_TOPOLOGY_ADDR_PATTERN": "block.node", "SLURM_NODEID": "5"},
     3 * 10**10 + 17),
    ({"SLURM_TOPOLOGY_ADDR": "s1.s2.node08", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node", "SLURM_NODEID": "5"},
     6),
    ({"SLURM_NODEID": "0"}, 1),
    ({}, 1),
])
def test_topo_rank(monkeypatch, env, rank):
    for key in ("SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_NODEID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: the rank only
    assert ray_nodes.topology_resources() == {"topo_rank": rank}


@pytest.mark.parametrize("uuid_line, domain", [
    ("        ClusterUUID                       : 6e4a1b4c-7f1e-4d8a-9c33-2b1f0e9d8a77",
     "nvlink_domain_6e4a1b4c-7f1e-4d8a-9c33-2b1f0e9d8a77"),
    ("        ClusterUUID                       : ", None),  # no NVLink fabric
])
def test_nvlink_domain_from_nvidia_smi(monkeypatch, tmp_path, uuid_line, domain):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\nGPU 00000009:01:00.0\n    Fabric\n        State : Completed\n"
                   f"{uuid_line}\n        CliqueId                          : 32766\nEOF\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.delenv("SLURM_TOPOLOGY_ADDR_PATTERN", raising=False)
    expected = {"topo_rank": 3, **({domain: 1} if domain else {})}
    assert ray_nodes.topology_resources() == expected
