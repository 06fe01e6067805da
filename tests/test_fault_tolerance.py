"""run.fault_tolerance: the ft_launcher command line the in-job launcher builds (checked against the flags of
nvidia-resiliency-ext 0.6.0's launcher, tests/data/nvrx_ft_launcher.json), the Megatron-Bridge keys the training
runtime sets (against the recorded API), and the dry run's refusals, one line each."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import REPO
from recipes import launch
from ultra3 import megatron_api

FLAGS = set(json.loads((REPO / "tests" / "data" / "nvrx_ft_launcher.json").read_text())["flags"])
FT = {"enabled": True, "max_restarts": 3, "setup_timeout_s": 1800, "step_timeout_s": 600,
      "checkpointing_timeout_s": 1200, "out_of_section_timeout_s": 600}


def argv(nodes: int, gpus: int, monkeypatch) -> list[str]:
    monkeypatch.setenv("ULTRA3_HEAD_NODE", "10.0.0.1")
    cfg = {"run": {"nodes": nodes, "gpus_per_node": gpus, "fault_tolerance": FT}, "job": {"id": "ultra3-pretrain_x"}}
    return launch.torchrun_argv(cfg, "recipes.pretrain", "config.yaml")


@pytest.mark.parametrize("nodes, gpus, where", [
    (1, 1, ["--standalone"]),  # one rank too: FT needs its launcher, so no shortcut to the script
    (1, 8, ["--standalone"]),
    (4, 8, ["--nnodes=4", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-id=ultra3-pretrain_x"]),
])
def test_the_ranks_run_under_ft_launcher(nodes, gpus, where, monkeypatch):
    got = argv(nodes, gpus, monkeypatch)
    assert got == [str(Path(sys.executable).parent / "ft_launcher"), f"--nproc-per-node={gpus}", "--max-restarts=3",
                   "--ft-rank-section-timeouts=setup:1800,step:600,checkpointing:1200",
                   "--ft-rank-out-of-section-timeout=600", *where, "--module", "recipes.pretrain", "--config",
                   "config.yaml"]
    flags = {a.split("=", 1)[0] for a in got[1:] if a.startswith("--")} - {"--config"}  # --config: the script's
    assert flags <= FLAGS, f"not flags of nvidia-resiliency-ext's ft_launcher: {flags - FLAGS}"


def test_without_fault_tolerance_torchrun_as_before(monkeypatch):
    cfg = {"run": {"nodes": 2, "gpus_per_node": 8, "fault_tolerance": {**FT, "enabled": False}},
           "job": {"id": "ultra3-pretrain_x"}}
    assert launch.torchrun_argv(cfg, "recipes.pretrain", "config.yaml")[1:3] == ["-m", "torch.distributed.run"]


def test_the_runtime_sets_recorded_megatron_bridge_keys():
    """What recipes/training/runtime.py sets on the ConfigContainer, by attribute, exists in Megatron-Bridge 0.6.2."""
    source = (REPO / "recipes" / "training" / "runtime.py").read_text()
    set_here = set(re.findall(r"container\.(\w+)\.(\w+) = ", source))
    assert {("ft", "enable_ft_package"), ("ft", "calc_ft_timeouts"), ("train", "exit_signal_handler"),
            ("train", "exit_signal")} <= set_here
    for section, key in set_here:
        assert key in megatron_api.class_fields(megatron_api.section_class(section)), f"{section}.{key}"


@pytest.mark.parametrize("args, key, said", [
    (["ft.simulate_fault=true", "ft.simulated_fault_type=rank_killed"], "ft.simulate_fault",
     "true without run.fault_tolerance.enabled: ranks under torchrun run without the FT package"),
    (["run.fault_tolerance.enabled=true", "inprocess_restart.enabled=true"], "inprocess_restart.enabled",
     "in-process restart does not work under the FT launcher"),
    (["run.fault_tolerance.enabled=true", "checkpoint.save=null"], "run.fault_tolerance.enabled",
     "needs checkpoint.save"),
    (["checkpoint.async_save=true", "checkpoint.ckpt_format=torch"], "checkpoint.async_save",
     "needs checkpoint.ckpt_format: torch_dist, not torch"),
    (["nvrx_straggler.enabled=true", "straggler.log_straggler=true"], "nvrx_straggler.enabled",
     "and the older straggler detector (straggler.*) both on"),
    (["run.fault_tolerance.enabled=true", "ft.simulate_fault=true", "ft.simulated_fault_type=gpu_on_fire"],
     "ft.simulated_fault_type", "'gpu_on_fire': Megatron-Bridge knows rank_hung, rank_killed and random"),
])
def test_a_combination_that_cannot_work_is_refused(cli_here, args, key, said):
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", *args)
    assert bad.rc == 2 and len(bad.err_lines) == 1 and bad.err_lines[0].startswith(f"error: {key}: {said}"), bad.err


def test_simulated_faults_and_timeouts_pass_with_fault_tolerance(cli_here):
    ok = cli_here("pretrain", "-c", "tiny", "--dry-run", "run.fault_tolerance.enabled=true", "ft.simulate_fault=true",
                  "ft.simulated_fault_type=rank_hung", "ft.simulated_fault_base_delay=60")
    assert ok.rc == 0, ok.err
    short = cli_here("pretrain", "--dry-run", "--batch", "blackwell", "dataset.blend_path=/lustre/blend.json",
                     "run.fault_tolerance.enabled=true", "run.fault_tolerance.step_timeout_s=5")
    assert short.rc == 0, short.err
    assert "warning: run.fault_tolerance.step_timeout_s: 5 s is shorter than a step, by the throughput model: ~" \
        in short.out
