"""The RL stages without a profile hold to the rules of every local job: one node (the local executor refuses
the layout's two), and the in-job GPU check, which under check_only stays wherever no Ray cluster over several
nodes checks the GPUs; on a machine without GPUs a one-node run stops in its preflight with one line."""

from __future__ import annotations

import re

import pytest

from ultra3.compile import compile_job
from ultra3.gpus import visible_gpu_count
from ultra3.job import Options
from ultra3.stages import STAGES

RLVR = next(s for s in STAGES if s.name == "rl rlvr")
ONE_NODE = ("layout.colocated=true", "layout.generation_nodes=0")  # generate on the training GPU


@pytest.fixture
def rl_inputs(tmp_path) -> list[str]:
    (tmp_path / "policy").mkdir()
    (tmp_path / "data").mkdir()
    return [f"policy={tmp_path / 'policy'}", f"data.dir={tmp_path / 'data'}"]


def test_two_nodes_of_rl_tiny_are_refused_on_this_machine(cli, home, rl_inputs):
    r = cli("rl", "rlvr", "-c", "tiny", "check_only=true", *rl_inputs)
    assert r.rc == 2, (r.out, r.err)
    assert r.err_lines == ["error: run.nodes: 2 nodes, but the local executor runs on this machine only; submit "
                           "with --run/--batch PROFILE, or bring it to 1 where it is set "
                           "[run.nodes=2 from layout: 1 train + 1 generation]"]
    assert not (home / "nemorun" / "experiments").exists() and not r.out  # nothing written or submitted


@pytest.mark.parametrize("batch, nodes, checks_gpus", [(None, 1, True), ("ci", 2, False)])
def test_check_only_keeps_the_gpu_check_where_no_ray_cluster_checks_them(home, rl_inputs, batch, nodes, checks_gpus):
    layout = ONE_NODE if nodes == 1 else ()
    job = compile_job(RLVR, Options(config="tiny", batch=batch, dry_run=True,
                                    overrides=["check_only=true", *layout, *rl_inputs]))
    assert job.config["run"]["nodes"] == nodes
    assert ("gpus" in job.config["job"]["checks"]) is checks_gpus
    assert "nemo_rl" not in job.config["job"]["checks"]


@pytest.mark.skipif(visible_gpu_count() > 0, reason="a GPU is visible: the preflight's GPU check passes here")
def test_a_one_node_check_only_run_without_gpus_stops_in_its_preflight(cli, rl_inputs):
    r = cli("rl", "rlvr", "-c", "tiny", "check_only=true", *ONE_NODE, *rl_inputs, timeout=120)
    assert r.rc == 1, (r.out, r.err)
    reason = re.search(r"FAILED \(exit code 3\): (PREFLIGHT FAILED on \S+: .*)$", r.err, re.M)
    assert reason and ": no NVIDIA GPU visible (need 1 per node; " in reason.group(1), r.err
