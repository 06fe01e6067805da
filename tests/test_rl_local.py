"""The RL stages without a profile hold to the rules of every local job: one node (the local executor refuses
the layout's two), and the in-job GPU check, which under check_only stays wherever no Ray cluster over several
nodes checks the GPUs; on a machine without GPUs a one-node run stops in its preflight with one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ultra3.compile import compile_job
from ultra3.gpus import visible_gpu_count
from ultra3.job import Options
from ultra3.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
RLVR = next(s for s in STAGES if s.name == "rl rlvr")
ONE_NODE = ("layout.colocated=true", "layout.generation_nodes=0")  # generate on the training GPU (as -c tiny does)


@pytest.fixture
def rl_inputs(tmp_path) -> list[str]:
    (tmp_path / "policy").mkdir()
    (tmp_path / "data").mkdir()
    return [f"policy={tmp_path / 'policy'}", f"data.dir={tmp_path / 'data'}"]


def test_two_nodes_of_rl_tiny_ray_are_refused_on_this_machine(cli, home, rl_inputs):
    r = cli("rl", "rlvr", "-c", "tiny_ray", "check_only=true", *rl_inputs)
    assert r.rc == 2, (r.out, r.err)
    assert r.err_lines == ["error: run.nodes: 2 nodes, but the local executor runs on this machine only; submit "
                           "with --run/--batch PROFILE, or bring it to 1 where it is set "
                           "[run.nodes=2 from layout: 1 train + 1 generation]"]
    assert not (home / "nemorun" / "experiments").exists() and not r.out  # nothing written or submitted


@pytest.mark.parametrize("batch, nodes, checks_gpus", [(None, 1, True), ("ci", 2, False)])
def test_check_only_keeps_the_gpu_check_where_no_ray_cluster_checks_them(home, rl_inputs, batch, nodes, checks_gpus):
    layout = ONE_NODE if nodes == 1 else ()
    job = compile_job(RLVR, Options(config="tiny_ray", batch=batch, dry_run=True,
                                    overrides=["check_only=true", *layout, *rl_inputs]))
    assert job.config["run"]["nodes"] == nodes
    assert ("gpus" in job.config["job"]["checks"]) is checks_gpus
    assert "nemo_rl" not in job.config["job"]["checks"]


@pytest.mark.skipif(visible_gpu_count() > 0, reason="a GPU is visible: the preflight's GPU check passes here")
def test_a_one_node_check_only_run_without_gpus_stops_in_its_preflight(cli, rl_inputs):
    r = cli("rl", "rlvr", "-c", "tiny", "check_only=true", *rl_inputs, timeout=120)
    assert r.rc == 1, (r.out, r.err)
    reason = re.search(r"FAILED \(exit code 3\): (PREFLIGHT FAILED on \S+: .*)$", r.err, re.M)
    assert reason and ": no NVIDIA GPU visible (need 1 per node; " in reason.group(1), r.err


def test_tiny_fits_one_gpu_and_its_dry_run_says_so(cli, home, tmp_path):
    sft = tmp_path / "sft-checkpoint"  # an SFT job's checkpoint.save: Megatron-Bridge's tracker file in it
    sft.mkdir()
    (sft / "latest_checkpointed_iteration.txt").write_text("40\n")
    (tmp_path / "data").mkdir()
    args = ("rl", "rlvr", "-c", "tiny", "--run", "gpu-box", "--env-file", str(REPO / "env.toml.example"),
            f"policy={sft}", f"data.dir={tmp_path / 'data'}")
    r = cli(*args, "--dry-run")
    assert r.rc == 0, (r.out, r.err)
    lines = r.out.splitlines()
    assert ("note: layout.colocated: colocated on 1 GPU(s): megatron generation and Megatron training take turns "
            "on the same GPU(s), no generation nodes; NeMo Gym runs 4 of the recipe's 33 server configs "
            "(env.nemo_gym.config_paths)") in lines
    assert ("note: policy: a Megatron checkpoint: the job exports it to Hugging Face once (quantize's export, into "
            "<experiment>/policy-hf) and NeMo RL starts from that") in lines
    assert any(line.startswith("warning: layout.gym_nodes: 0: the genrm, nl2bash, safety of student_rlvr1 have no "
                               "Gym node") for line in lines)
    assert "node 0  train: Megatron TP1 EP1 CP1 PP1, 1 GPUs, vLLM generation on the same GPUs" not in r.out
    assert "node 0  train: Megatron TP1 EP1 CP1 PP1, 1 GPUs, megatron generation on the same GPUs" in r.out
    job = compile_job(RLVR, Options(config="tiny", dry_run=True, overrides=["check_only=true", f"policy={sft}",
                                                                            f"data.dir={tmp_path / 'data'}"]))
    assert job.config["run"]["nodes"] == 1 and "gpus" in job.config["job"]["checks"]  # one node: the GPU check stays
    assert not (home / "nemorun" / "experiments").exists()
