"""`ultra3 rl` on the local Slurm cluster's two nodes (partition `multi`, one fake GPU each from Slurm's gres):
a real Ray cluster over the allocation with the layout's node groups, the cluster preflight (groups joined,
GPUs per group as Slurm granted them, the job dir written from every node and read back, NeMo Skills' sandbox
port answering on every node), check_only ending there with exit 0, and without NeMo RL on the machine a full
run stopping in its preflight with one line. State, logs and cancel through `nemotron jobs`. The RL data comes
from a real `ultra3 data prep rl -c tiny`."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import wait_for
from test_data_prep_slurm import finish, submit

pytestmark = [pytest.mark.slurm, pytest.mark.heavy]

PROFILE = """
[two-gpu-nodes]
extends = "ci"
partition = "multi"
"""


@pytest.fixture
def rl_inputs(slurm, home, cli, tmp_path) -> list[str]:
    nodes = subprocess.run(["sinfo", "-h", "-p", "multi", "-o", "%D"], capture_output=True, text=True).stdout
    assert nodes.strip() == "2", "no 2-node partition 'multi': re-run scripts/slurm-local/start.sh (as root)"
    with open("env.toml", "a") as f:
        f.write(PROFILE)
    data = tmp_path / "rl-data"
    prep = cli("data", "prep", "rl", "-c", "tiny", f"output_dir={data}")
    assert prep.rc == 0, prep.err
    policy = tmp_path / "policy-hf"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"architectures": ["NemotronHForCausalLM"]}))
    return [f"policy={policy}", f"data.dir={data}"]


def test_check_only_brings_up_the_layout_on_two_nodes(cli, rl_inputs):
    job_id, job_dir = submit(cli, "rl", "rlvr", "-c", "tiny_ray", "--batch", "two-gpu-nodes", *rl_inputs,
                             "check_only=true")
    _, log = finish(cli, job_id)
    assert "#SBATCH --gpus-per-node=1" in Path(job_dir, "rl-rlvr_sbatch.sh").read_text()
    for line in ["node 0 of 2: localhost", "node 1 of 2: localhost2",
                 "ray cluster up: 2 nodes (127.0.0.1 with 1 CPU(s), 127.0.0.2 with 1 CPU(s))",
                 "rl: group train: 1 of 1 node(s) in Ray (127.0.0.1), GPUs per node [1]",
                 "rl: group generation: 1 of 1 node(s) in Ray (127.0.0.2), GPUs per node [1]",
                 f"rl: shared job dir {job_dir} written from 2 node(s) and read back here",
                 "rl: cluster preflight passed; check_only: stopping before NeMo RL"]:
        assert line in log, log[-4000:]
    assert log.count("preflight ok on ") == 2, log[-4000:]
    # each node's group, and its place for NeMo RL's placement (no block topology here: its rank in the job + 1)
    assert '--resources={"ultra3_group_train": 1, "topo_rank": 1}' in log, log[-4000:]
    assert '--resources={"ultra3_group_generation": 1, "topo_rank": 2}' in log, log[-4000:]
    assert "--num-gpus=1" in log
    assert not list(Path(job_dir).glob(".ray-probe-*")), "the probes were not cleaned up"
    assert not (Path(job_dir) / "nemo_rl.yaml").exists()  # check_only: NeMo RL's config is not written


def test_check_only_waits_for_the_sandbox_on_every_node(cli, rl_inputs):
    """With sandbox.image set, the probe task on each node waits for NeMo Skills' sandbox port (here a socket of
    this test, which both nodes of the local cluster reach as localhost; the sidecar srun itself cannot start
    a container on this cluster and fails beside the job)."""
    with socket.create_server(("", 0)) as sandbox:
        port = sandbox.getsockname()[1]
        job_id, job_dir = submit(cli, "rl", "rlvr", "-c", "tiny_ray", "--batch", "two-gpu-nodes", *rl_inputs,
                                 "check_only=true", "sandbox.image=/sqsh/nemo-skills.sqsh", f"sandbox.port={port}")
        _, log = finish(cli, job_id)
    assert "--container-image=/sqsh/nemo-skills.sqsh" in Path(job_dir, "rl-rlvr_sbatch.sh").read_text()
    assert f"rl: NeMo Skills' sandbox answers on port {port} on 2 node(s)" in log, log[-4000:]
    assert "rl: cluster preflight passed; check_only: stopping before NeMo RL" in log


def test_without_nemo_rl_the_job_stops_in_its_preflight(cli, rl_inputs):
    r = cli("rl", "rlvr", "-c", "tiny_ray", "--run", "two-gpu-nodes", *rl_inputs, timeout=600)
    assert r.rc == 1, (r.out, r.err)  # an attached job that did not complete (the job's own code: below)
    reason = re.search(r"FAILED \(exit code 3\): (PREFLIGHT FAILED on \S+: .*)$", r.err, re.M)
    assert reason, r.err
    assert "NeMo RL is not importable (ModuleNotFoundError: No module named 'nemo_rl')" in reason.group(1)
    assert "\n" not in reason.group(1)
    job_id = re.search(r"(ultra3-rl-rlvr_\S+)", r.out + r.err).group(1)
    status = cli("jobs", "status", job_id, prog="nemotron")
    assert "FAILED (exit code 3)" in status.out, status.out


def test_cancel_through_nemotron_jobs(cli, rl_inputs):
    job_id, _ = submit(cli, "rl", "rlvr", "-c", "tiny_ray", "--batch", "two-gpu-nodes", *rl_inputs, "check_only=true")
    r = cli("jobs", "cancel", job_id, prog="nemotron")
    assert r.rc == 0, r.err
    ended = wait_for(lambda: "CANCELLED" in cli("jobs", "status", job_id, prog="nemotron").out, timeout=120, interval=2)
    assert ended, cli("jobs", "status", job_id, prog="nemotron").out
