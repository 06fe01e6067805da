"""run.fault_tolerance: the ft_launcher command line (goldens, and checked against the options of nvidia-resiliency-ext
0.6.0's launcher and Megatron-Bridge 0.6.2's FT sections as recorded from their source in
tests/data/nvrx_ft_launcher.json by scripts/nvrx_launcher_record.py), the exits the ranks keep through in-job
restarts (under torch's own elastic agent, which ft_launcher extends), the Megatron-Bridge keys the runtime sets
(against src/ultra3/megatron_api/record.json), and the dry run's refusals, one line each."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from recipes import contract, launch, preflight
from recipes.ft_launcher import EXIT_FILE_VAR, decided, rank_exit
from recipes.training import plan, resilience
from test_training_plan import TRAINING, check_key, job_config
from ultra3 import megatron_api

NVRX_HERE = importlib.util.find_spec("nvidia_resiliency_ext") is not None
RECORD = json.loads((REPO / "tests" / "data" / "nvrx_ft_launcher.json").read_text())
FT = {"enabled": True, "max_restarts": 3, "setup_timeout_s": 1800, "step_timeout_s": 600,
      "checkpointing_timeout_s": 1200, "out_of_section_timeout_s": 600}
HEAD = [contract.FT_LAUNCHER, "--nproc-per-node=8", "--max-restarts=3",
        "--ft-rank-section-timeouts=setup:1800,step:600,checkpointing:1200", "--ft-rank-out-of-section-timeout=600"]
TAIL = ["--module", "recipes.pretrain", "--config", "config.yaml"]
GOLDEN = {  # nodes, GPUs a node -> what follows `python -m`
    (1, 1): [*HEAD[:1], "--nproc-per-node=1", *HEAD[2:], "--standalone", *TAIL],
    (1, 8): [*HEAD, "--standalone", *TAIL],
    (4, 8): [*HEAD, "--nnodes=4", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500",
             "--rdzv-id=ultra3-pretrain_x", *TAIL],
}


def ft_argv(nodes: int, gpus: int) -> list[str]:
    run = {"nodes": nodes, "gpus_per_node": gpus, "fault_tolerance": FT}
    return contract.ft_launcher_argv(run, "python", "10.0.0.1", "ultra3-pretrain_x", "recipes.pretrain", "config.yaml")


def launcher_options(argv: list[str]) -> dict[str, str | None]:
    """The launcher's options in `argv` (after `python -m MODULE`) as its parser takes them, by the recorded
    options: each known, a value where it takes one, of its type; up to the training module."""
    options, rest = {}, argv[3:]
    while rest and rest[0].startswith("-"):
        flag, eq, value = rest.pop(0).partition("=")
        assert flag in RECORD["options"], f"{flag}: not an option of ft_launcher {RECORD['nvidia-resiliency-ext']}"
        kind = RECORD["options"][flag]["value"]
        if kind == "none":
            assert not eq, f"{flag} takes no value"
            options[flag] = None
            continue
        options[flag] = value if eq else rest.pop(0)
        if kind in ("int", "float"):
            {"int": int, "float": float}[kind](options[flag])
    assert rest[:1] == ["recipes.pretrain"], rest  # the training module, then its own arguments
    return options


@pytest.mark.parametrize("shape", list(GOLDEN), ids=[f"{n}x{g}" for n, g in GOLDEN])
def test_the_ft_launcher_line_matches_its_golden_and_the_recorded_launcher(shape):
    argv = ft_argv(*shape)
    assert argv == ["python", "-m", *GOLDEN[shape]]
    assert RECORD["ft_launcher"] == {"module": contract.FT_LAUNCHER, "function": "main", "runs_as_main": True}
    options = launcher_options(argv)
    fields = set(RECORD["fault_tolerance_config"])
    for flag in (f for f in options if f.startswith("--ft-")):  # each sets a field of its FaultToleranceConfig
        assert RECORD["options"][flag]["dest"].removeprefix("ft_") in fields, flag
    sections = dict(item.split(":") for item in options["--ft-rank-section-timeouts"].split(","))
    assert sorted(sections) == RECORD["megatron_bridge_ft"]["sections"]  # the sections Megatron-Bridge opens
    assert all(float(s) > 0 for s in sections.values())
    # Megatron-Bridge sends no heartbeats: a heartbeat timeout would end healthy ranks
    assert RECORD["megatron_bridge_ft"]["sends_heartbeats"] is False
    assert not any("heartbeat" in RECORD["options"][f]["dest"] for f in options)


def test_the_node_launcher_runs_the_ranks_under_ft_launcher_one_rank_too(monkeypatch):
    for nodes, gpus in ((1, 1), (4, 8)):  # one rank: no shortcut past the launcher
        cfg = {"run": {"nodes": nodes, "gpus_per_node": gpus, "fault_tolerance": FT}, "job": {"id": "x"}}
        assert launch.torchrun_argv(cfg, "recipes.pretrain", "config.yaml") == [
            sys.executable, "-m", "recipes.ft_launcher", "--module", "recipes.pretrain", "--config", "config.yaml"]
    cfg["run"]["fault_tolerance"] = {**FT, "enabled": False}
    assert launch.torchrun_argv(cfg, "recipes.pretrain", "config.yaml")[1:3] == ["-m", "torch.distributed.run"]


@pytest.mark.skipif(NVRX_HERE, reason="nvidia-resiliency-ext is installed here")
def test_the_ft_wrapper_runs_the_launcher_and_passes_its_failure_on(tmp_path):
    """Without nvidia-resiliency-ext here, its launcher fails to start: the wrapper ends with that failure, not with
    the stale exit code an earlier attempt's rank left, which it removed first."""
    cfg = {"run": {"nodes": 1, "gpus_per_node": 2, "fault_tolerance": FT},
           "job": {"id": "ultra3-pretrain_x", "dir": str(tmp_path)}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    stale = tmp_path / "ft-exit-job-0"
    stale.write_text(str(contract.CONTINUE_EXIT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run([sys.executable, "-m", "recipes.ft_launcher", "--module", "recipes.pretrain", "--config",
                           str(tmp_path / "config.yaml")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"+ {sys.executable} -m {contract.FT_LAUNCHER} --nproc-per-node=2 --max-restarts=3" in done.stdout
    assert f"No module named '{contract.FT_LAUNCHER.split('.')[0]}'" in done.stderr
    assert not stale.exists()


@pytest.mark.skipif(NVRX_HERE, reason="nvidia-resiliency-ext is installed here")
def test_the_preflight_asks_for_the_launcher_the_ranks_run_under():
    """nvidia-resiliency-ext is not installed here: the preflight names its launcher module, only with FT on."""
    missing = preflight.training_packages({"run": {"fault_tolerance": FT}})
    assert f"{contract.FT_LAUNCHER} (ModuleNotFoundError" in missing
    assert contract.FT_LAUNCHER not in preflight.training_packages({"run": {}})


RANK = """import os, sys
from recipes.ft_launcher import rank_exit
with open(sys.argv[2], "a") as f:
    f.write(os.environ["RANK"] + "\\n")
with rank_exit():
    raise SystemExit(int(sys.argv[1]))
"""


@pytest.mark.heavy
def test_a_decided_exit_is_not_restarted_and_reaches_the_launcher(tmp_path):
    """Under torch's elastic agent (ft_launcher's base, with its restart rule: any non-zero exit restarts every
    rank): with the exit file set, the ranks' CONTINUE_EXIT ends the agent 0 at once and is read back; without it,
    the rank is restarted --max-restarts times and the agent ends 1, the code lost."""
    script, runs, exit_file = tmp_path / "rank.py", tmp_path / "runs", tmp_path / "ft-exit"
    script.write_text(RANK)

    def agent(ranks: int, env: dict) -> int:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                "--max-restarts=1", "--monitor-interval=0.1", str(script), str(contract.CONTINUE_EXIT), str(runs)]
        done = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True,
                              text=True, timeout=120)
        return done.returncode

    assert agent(2, {EXIT_FILE_VAR: str(exit_file)}) == 0
    assert sorted(runs.read_text().split()) == ["0", "1"]  # each rank once: no restart
    assert decided(str(exit_file)) == contract.CONTINUE_EXIT
    runs.unlink()
    assert agent(1, {}) == 1
    assert runs.read_text().split() == ["0", "0"]  # restarted once


@pytest.mark.parametrize("code, meant", [(contract.CONTINUE_EXIT, contract.CONTINUE_EXIT),
                                         (contract.INPUT_ERROR_EXIT, contract.INPUT_ERROR_EXIT),
                                         (contract.VALIDATION_EXIT, contract.VALIDATION_EXIT), (1, None), (0, None)])
def test_a_rank_keeps_a_decided_exit_for_the_launcher(tmp_path, monkeypatch, code, meant):
    """Under ft_launcher (the exit file set) a decided exit becomes 0 with the code written down; any other exit
    stays what it was and writes nothing, so a failure is restarted and a finished run reads as finished."""
    exit_file = tmp_path / "ft-exit"
    exit_file.write_text("75")  # an earlier in-job restart's: rank 0 clears it
    monkeypatch.setenv(EXIT_FILE_VAR, str(exit_file))
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as ended, rank_exit():
        raise SystemExit(code)
    assert ended.value.code == (0 if meant else code)
    assert decided(str(exit_file)) == (meant or 0)
    monkeypatch.delenv(EXIT_FILE_VAR)  # under torchrun: nothing changes
    with pytest.raises(SystemExit) as ended, rank_exit():
        raise SystemExit(code)
    assert ended.value.code == code


@pytest.mark.parametrize("stage", TRAINING, ids=[s.name for s in TRAINING])
def test_the_runtime_turns_on_recorded_ft_keys(home, stage):
    cfg = job_config(home, stage, "tiny", "run.fault_tolerance.enabled=true", "ft.simulate_fault=true",
                     "ft.simulated_fault_type=rank_killed", "ft.simulated_fault_base_delay=120")
    values = plan.override_values(cfg)
    assert {k: v for k, v in values.items() if k.startswith("ft.")} == {
        "ft.enable_ft_package": True, "ft.calc_ft_timeouts": True, "ft.simulate_fault": True,
        "ft.simulated_fault_type": "rank_killed", "ft.simulated_fault_base_delay": 120}
    for key, value in values.items():
        check_key(cfg, key, value)
    assert "ft.enable_ft_package=true" in plan.make_plan(cfg).overrides
    kept = plan.override_values(job_config(home, stage, "tiny", "run.fault_tolerance.enabled=true",
                                           "ft.calc_ft_timeouts=false"))
    assert kept["ft.calc_ft_timeouts"] is False
    assert not any(k.startswith("ft.") for k in plan.override_values(job_config(home, stage, "tiny")))


def test_the_resiliency_sections_are_made_from_their_recorded_classes():
    """The Ultra recipes leave them None; the runtime makes those the overrides name, of the class each is."""
    for section, target in resilience.SECTIONS.items():
        assert target.rpartition(".")[2] == megatron_api.section_class(section), section
    assert resilience.sections_to_make(["ft.enable_ft_package=true", "train.train_iters=2",
                                        "nvrx_straggler.enabled=true"]) == {
        "ft": resilience.SECTIONS["ft"], "nvrx_straggler": resilience.SECTIONS["nvrx_straggler"]}


@pytest.mark.parametrize("args, key, said", [
    (["ft.simulate_fault=true", "ft.simulated_fault_type=rank_killed"], "ft.simulate_fault",
     "true without run.fault_tolerance.enabled: ranks under torchrun run without the FT package"),
    (["run.fault_tolerance.enabled=true", "inprocess_restart.enabled=true"], "inprocess_restart.enabled",
     "in-process restart does not work under the FT launcher"),
    (["run.fault_tolerance.enabled=true", "checkpoint.save=null"], "run.fault_tolerance.enabled",
     "needs checkpoint.save"),
    (["checkpoint.async_save=true", "checkpoint.ckpt_format=torch"], "checkpoint.ckpt_format",
     "torch: an asynchronous save needs torch_dist (or fsdp_dtensor)"),
    (["checkpoint.ckpt_format=zarr"], "checkpoint.ckpt_format",
     "zarr: an asynchronous save (the Ultra recipe's checkpoint.async_save: true) needs torch_dist"),
    (["checkpoint.async_save=true", "checkpoint.save=null"], "checkpoint.async_save",
     "true without checkpoint.save"),
    (["checkpoint.use_persistent_ckpt_worker=false"], "checkpoint.use_persistent_ckpt_worker",
     "false: an asynchronous save (the Ultra recipe's checkpoint.async_save: true) needs its persistent worker"),
    (["nvrx_straggler.enabled=true", "straggler.log_straggler=true"], "nvrx_straggler.enabled",
     "and the older straggler detector (straggler.log_straggler) both on"),
    (["run.fault_tolerance.enabled=true", "ft.simulate_fault=true", "ft.simulated_fault_type=gpu_on_fire",
      "ft.simulated_fault_base_delay=60"], "ft.simulated_fault_type",
     "'gpu_on_fire': Megatron-Bridge knows rank_hung, rank_killed, random"),
    (["run.fault_tolerance.enabled=true", "ft.simulate_fault=true", "ft.simulated_fault_rank=1",
      "ft.simulated_fault_base_delay=60"], "ft.simulated_fault_rank",
     "1 is not a rank of this job (0 to 0), so no fault would happen"),
])
def test_a_combination_that_cannot_work_is_refused(cli_here, args, key, said):
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", *args)
    assert bad.rc == 2 and len(bad.err_lines) == 1, bad.err
    assert bad.err_lines[0].startswith(f"error: {key}: {said}"), bad.err
    assert "from command line" in bad.err_lines[0]  # where the value came from


@pytest.mark.parametrize("command", [("data", "prep", "pretrain"), ("convert", "hf-to-megatron")])
def test_fault_tolerance_on_a_stage_that_is_not_training_is_refused(cli_here, command):
    bad = cli_here(*command, "-c", "tiny", "--dry-run", "run.fault_tolerance.enabled=true")
    assert bad.rc == 2 and len(bad.err_lines) == 1, bad.err
    assert bad.err_lines[0] == (f"error: run.fault_tolerance.enabled: {' '.join(command)} is not Megatron-Bridge "
                                "training (pretrain, sft), whose ranks ft_launcher watches; remove it "
                                "[run.fault_tolerance.enabled=true from command line]")


def test_the_dry_run_shows_the_ft_launcher_line_and_warns_of_what_would_misfire(cli_here):
    ok = cli_here("sft", "-c", "tiny", "--dry-run", "run.fault_tolerance.enabled=true", "ft.simulate_fault=true",
                  "ft.simulated_fault_type=rank_hung")
    assert ok.rc == 0, ok.err
    argv = ft_argv(1, 1)
    argv[-3] = "recipes.sft"
    assert f"each node runs   {' '.join(argv)}\n" in ok.out
    assert "warning: ft.simulated_fault_base_delay: 0: the fault comes at once, at every start" in ok.out
    short = cli_here("pretrain", "--dry-run", "--batch", "blackwell", "dataset.blend_path=/lustre/blend.json",
                     "phase2.blend_path=/lustre/phase2/blend.json", "run.fault_tolerance.enabled=true",
                     "run.fault_tolerance.step_timeout_s=5")
    assert short.rc == 0, short.err
    assert "warning: run.fault_tolerance.step_timeout_s: 5 s is shorter than a step, by the throughput model: ~" \
        in short.out
    assert "--nnodes=96 --rdzv-backend=c10d --rdzv-endpoint=$ULTRA3_HEAD_NODE:29500 --rdzv-id=<job id>" in short.out
    off = cli_here("pretrain", "-c", "tiny", "--dry-run")
    assert off.rc == 0 and "== fault tolerance ==" not in off.out
