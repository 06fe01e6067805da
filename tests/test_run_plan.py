"""The long-run plan of a Slurm job (ultra3.run_plan, the dry run's `long run` table) and the stop times that size
Slurm's time-limit signal (Parts.stop_time), each figure computed here again from its stated inputs; run.grace_s
against the time limit and the stop time; a measured save and step from an earlier run's manifest and the real
Megatron-Bridge log of the GPU smoke run (benchmarks/gpu_smoke/pretrain.log)."""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import pytest

from ultra3 import cost, cost_data_prep, records
from ultra3.compile import compile_job
from ultra3.contract import publish
from ultra3.job import Options
from ultra3.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
SMOKE_LOG = REPO / "benchmarks" / "gpu_smoke" / "pretrain.log"  # async saves: 203.44 and 106.39 ms (max across ranks)
STAGE = {s.name: s for s in STAGES}
BLEND = ("dataset.blend_path=/lustre/data/blend.json", "phase2.blend_path=/lustre/data/phase2/blend.json")

# The default pretrain config on the sample `blackwell` profile (96 nodes x 8 B200, run.time 04:00:00), NVFP4
ITERS, GBS, SEQ, NODES, GPUS = 794_728, 3_072, 8_192, 96, 768
LIMIT_S = 4 * 3600
RATE = 0.09 * 9_000e12  # MFU x the B200's dense NVFP4 peak, FLOP/s per GPU (docs/cost.md)
IO = 1e9  # checkpoint write, bytes/s per node (assumed)
STARTUP_S, MARGIN_S, FLOOR_S = 300, 30, 60  # start-up (assumed), the exit after the save, Slurm's timer granularity
MTBF_H = 6_300  # cluster.node_mtbf_hours in the stage YAML (Llama 3 405B's interruptions)


def job(stage: str, name: str, *overrides: str, profile: str | None = "blackwell"):
    return compile_job(STAGE[stage], Options(config=name, batch=profile, dry_run=True, overrides=list(overrides)))


def ultra() -> tuple[float, float, float]:
    """(seconds per step, seconds per save, checkpoint bytes) of the default pretrain config, from the formula."""
    cfg = job("pretrain", "default", *BLEND).config
    flops, _ = cost._training_flops(cfg, SEQ)
    assert flops == pytest.approx(1_281e12 / 3_552, rel=0.005)  # NVIDIA's 1,281 TFLOP/s at 3,552 tokens/s per GPU
    (params, _), _ = cost._quantize_params(cfg)
    assert 5.5e11 < params < 5.7e11  # 550B-A55B, MTP depths included
    size = params * (2 + 4 + 4 + 4)  # BF16 weights, FP32 main weights, Adam's two moments
    return GBS * SEQ * flops / (GPUS * RATE), size / (NODES * IO), size


def plan(out: str) -> dict[str, str]:
    """The dry run's `long run` table as {label: value}."""
    body = out.split("\n== long run ==\n", 1)[1].split("\n\n", 1)[0]
    return dict(re.split(r"  +", line, maxsplit=1) for line in body.splitlines())


# -- stop times ---------------------------------------------------------------------------------------------------


def test_the_stop_time_of_the_ultra_pretraining_is_one_step_one_save_and_the_exit(home):
    step, save, size = ultra()
    assert (round(step, 1), round(save, 1)) == (14.6, 81.7)
    stop, basis = STAGE["pretrain"].parts().stop_time(job("pretrain", "default", *BLEND).config)
    assert stop == math.ceil(step + save + MARGIN_S) == 127
    assert basis == "one step 15 s + one save 82 s (7.8 TB at 1 GB/s per node x 96, assumed) + 30 s to exit"
    assert STAGE["sft"].parts().stop_time is not None


def test_the_tiny_stop_time_is_the_floor(home):
    cfg = job("pretrain", "tiny").config
    (params, _), _ = cost._quantize_params(cfg)
    flops, _ = cost._training_flops(cfg, 512)
    step = 4 * 512 * flops / (0.35 * 2_250e12)  # global batch 4 x seq 512, BF16 on one B200
    need = step + params * 14 / IO + MARGIN_S
    assert need < FLOOR_S
    assert cost.training_stop(cfg) == (FLOOR_S, "one step <1 s + one save <1 s (121 MB at 1 GB/s per node x 1, "
                                                "assumed) + 30 s to exit, at least 60 s")


def test_data_prep_stops_in_a_minute(cli_here):
    # the running tasks are ended, not finished: no shard size enters it
    assert cost_data_prep.data_prep_stop({})[0] == cost_data_prep.STOP_S == 60
    for kind in ("pretrain", "rl"):
        shown = cli_here("data", "prep", kind, "-c", "tiny", "--dry-run", "--full", "--batch", "blackwell")
        assert shown.rc == 0, shown.err
        assert "#SBATCH --signal=USR1@60\n" in shown.out


# -- the plan -----------------------------------------------------------------------------------------------------


def test_the_plan_of_the_ultra_pretraining(cli_here):
    step, save, size = ultra()
    shown = cli_here("pretrain", "--dry-run", "--full", "--batch", "blackwell", *BLEND)
    assert shown.rc == 0, shown.err
    rows = plan(shown.out)
    assert "#SBATCH --signal=USR1@127" in shown.out
    assert rows["time-limit signal"].startswith("--signal=USR1@127: SIGUSR1 127 s before run.time=04:00:00 (the "
                                                "stop time: one step 15 s + one save 82 s")
    wall = ITERS * step
    startup = STARTUP_S + save  # the checkpoint's load at the save's rate
    allocations = math.ceil(wall / (LIMIT_S - startup - 127))
    assert allocations == 833  # the "~800"
    assert rows["allocations"].startswith(f"833 of 4.0 h: {wall / 86400:.1f} days of steps at 14.6 s/it (the cost "
                                          "model), each allocation less ~382 s start-up (assumed) and the signal's "
                                          "127 s")
    saves = ITERS // 1000 + allocations - 1  # save_interval 1,000, and one at each time-limit signal
    assert rows["checkpoints"].startswith(f"794 every 1,000 iterations (4.0 h) and {allocations - 1} at the time-limit "
                                          "signals, 7.8 TB each")
    assert saves > 40 and rows["checkpoints"].endswith(f"the newest 40 kept: {size * 40 / 1e12:,.0f} TB "
                                                       "(checkpoint.most_recent_k)")  # ~500B tokens for merging
    lost = 500 * step + startup
    assert rows["lost per failure"] == (f"~{lost / 3600:.1f} h, {lost / 3600 * GPUS / 1e3:.1f} k GPU-h: half an "
                                        "interval (500 iterations) redone, and a start-up")
    mtbf = MTBF_H * 3600 / NODES
    assert rows["failures expected"].startswith(f"~{wall / mtbf:.0f} over the run, ~{wall / mtbf * lost / 86400:.1f} "
                                                "days lost: MTBF 6,300 h per node (cluster.node_mtbf_hours, assumed) "
                                                "/ 96 nodes = 65.6 h")
    # Young/Daly with the asynchronous save of the Ultra recipe: training is held up ~1 s (the Ultra report: <1 s)
    best = math.sqrt(2 * 1.0 * mtbf)
    assert round(best / step) == 47
    assert rows["Young/Daly interval"] == (f"~47 iterations ({best / 60:.0f} min) = sqrt(2 x save 1 s x MTBF 65.6 h); "
                                           "save time: asynchronous, 1 s assumed (the Ultra report: under 1 s); "
                                           "checkpoint.save_interval=1,000")


def test_a_synchronous_save_a_stated_mtbf_and_the_newest_checkpoints_kept(cli_here):
    step, save, size = ultra()
    shown = cli_here("pretrain", "--dry-run", "--batch", "blackwell", *BLEND, "checkpoint.async_save=false",
                     "cluster.node_mtbf_hours=50000", "checkpoint.most_recent_k=3", "checkpoint.save_interval=2000")
    assert shown.rc == 0, shown.err
    rows = plan(shown.out)
    assert rows["checkpoints"].endswith(f"the newest 3 kept: {3 * size / 1e12:.0f} TB (checkpoint.most_recent_k)")
    mtbf = 50_000 * 3600 / NODES
    best = math.sqrt(2 * save * mtbf)  # a synchronous save holds training up for its whole write
    assert rows["Young/Daly interval"].startswith(f"~{best / step:,.0f} iterations ({best / 3600:.1f} h) = sqrt(2 x "
                                                  f"save 82 s x MTBF {mtbf / 3600:.0f} h); save time: synchronous")
    assert rows["lost per failure"].startswith(f"~{(1000 * step + STARTUP_S + save) / 3600:.1f} h")


def test_one_allocation_still_plans_the_checkpoints(cli_here):
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--batch", "blackwell")
    rows = plan(shown.out)
    assert rows["allocations"].startswith("1: <1 s of steps") and rows["allocations"].endswith("fit run.time=04:00:00")
    assert rows["checkpoints"].startswith("2 every 20 iterations") and "at the time-limit signals" not in shown.out
    assert rows["Young/Daly interval"].startswith("longer than the run: 1.9 h = sqrt(2 x save 1 s x MTBF 6,300 h)")


def test_a_data_prep_of_several_allocations_is_planned_from_its_measured_rate(home, cli_here):
    tiny = job("data prep pretrain", "tiny")
    assert "== long run ==" not in cli_here("data", "prep", "pretrain", "-c", "tiny", "--dry-run", "--batch",
                                            "blackwell").out  # seconds of work: no plan
    publish(tiny.store.root, {"format": 1, "name": "tiny-data", "type": "pretrain-data", "path": "/x",
                              "producer": "ultra3-data-prep-pretrain_20260101-000000-abcdef",
                              "stage": "data prep pretrain", "config": "tiny", "config_digest": tiny.digest,
                              "seconds": 36_000.0, "metadata": {}})
    shown = cli_here("data", "prep", "pretrain", "-c", "tiny", "--dry-run", "--batch", "blackwell")
    rows = plan(shown.out)
    allocations = math.ceil(36_000 / (LIMIT_S - cost_data_prep.STARTUP_S - cost_data_prep.STOP_S))
    assert allocations == 3
    assert rows["allocations"].startswith("3 of 4.0 h: 10.0 h of work (measured: 10 h by ultra3-data-prep-pretrain_")
    assert rows["time-limit signal"].startswith("--signal=USR1@60: SIGUSR1 60 s before run.time=04:00:00 (the stop "
                                                "time: the running tasks ended")
    assert "checkpoints" not in rows


def test_an_earlier_runs_log_and_manifest_give_the_save_and_the_step(home, cli_here):
    tiny = job("pretrain", "tiny", "train.train_iters=400")
    run_id = "ultra3-pretrain_20261126-063000-abc123"
    job_dir = home / "experiments" / run_id
    (job_dir / "pretrain").mkdir(parents=True)
    shutil.copy(SMOKE_LOG, job_dir / "pretrain" / "log-ultra3-pretrain_1_0.out")
    records.save(records.JobRecord(id=run_id, stage="pretrain", config="tiny", executor="slurm", mode="detached",
                                   submitted=time.time(), job_dir=str(job_dir), task="pretrain",
                                   log_glob="pretrain/log-*.out", profile="blackwell", handle={"slurm_id": "7"}))
    publish(tiny.store.root, {"format": 1, "name": "tiny-ckpt", "type": "pretrain-checkpoint", "path": "/x",
                              "producer": run_id, "stage": "pretrain", "config": "tiny", "config_digest": tiny.digest,
                              "seconds": 40 * 50.0, "metadata": {"iterations": 40}})  # 50 s an iteration
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--batch", "blackwell", "train.train_iters=400")
    rows = plan(shown.out)
    mtbf = MTBF_H * 3600  # one node
    best = math.sqrt(2 * 0.20344 * mtbf)  # the slower of the log's two saves
    assert rows["Young/Daly interval"] == (f"~{best / 50:.0f} iterations ({best / 60:.0f} min) = sqrt(2 x save <1 s x "
                                           f"MTBF 6,300 h); save time: measured, the longest of 2 in {run_id}'s log; "
                                           "checkpoint.save_interval=20")
    # the measured step outgrows the signal the model sized: ceil(50 + the model's 0.12 s save + 30)
    assert rows["time-limit signal"].endswith("; measured, the stop takes 81 s (one step 50 s (measured) + one save "
                                              "<1 s (121 MB at 1 GB/s per node x 1, assumed) + 30 s to exit): set "
                                              "run.grace_s=81")
    allocations = math.ceil(400 * 50 / (LIMIT_S - STARTUP_S - 0.12 - FLOOR_S))  # the signal at the model's 60 s
    assert allocations == 2
    assert rows["allocations"].startswith(f"2 of 4.0 h: 5.6 h of steps at 50.0 s/it (measured: 33 min for 40 "
                                          f"iterations by {run_id}, scaled to 400)")
    assert rows["checkpoints"].startswith("20 every 20 iterations (17 min) and 1 at the time-limit signals")


# -- run.grace_s --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("words, extra", [(("pretrain",), BLEND), (("data", "prep", "pretrain"), ("-c", "tiny"))])
def test_grace_at_the_time_limit_is_an_error(cli_here, words, extra):
    shown = cli_here(*words, *extra, "--dry-run", "--batch", "blackwell", "run.grace_s=14400")
    assert (shown.rc, shown.out) == (2, "")  # nothing shown or written: one line on stderr
    assert shown.err.startswith("error: run.grace_s: 14400 s is not less than the time limit run.time=04:00:00 "
                                "(14400 s): the stage would be told to stop before it starts; give fewer seconds")
    assert "[run.grace_s=14400 from command line; run.time=04:00:00 from profile 'blackwell'" in shown.err


def test_grace_below_the_stop_time_is_a_warning_with_the_seconds_needed(cli_here):
    shown = cli_here("pretrain", "--dry-run", "--full", "--batch", "blackwell", *BLEND, "run.grace_s=100")
    assert shown.rc == 0, shown.err
    assert "warning: run.grace_s: 100 s may be too short to save and stop: one step 15 s + one save 82 s" in shown.out
    assert "= 127 s; a stage still running then is requeued from its last save; give 127 or null" in shown.out
    assert "#SBATCH --signal=USR1@100" in shown.out
    assert plan(shown.out)["time-limit signal"] == ("--signal=USR1@100: SIGUSR1 100 s before run.time=04:00:00 "
                                                    "(run.grace_s=100)")
    none = cli_here("pretrain", "--dry-run", "--full", "--batch", "blackwell", *BLEND, "run.grace_s=0")
    assert "warning: run.grace_s: 0: no time-limit signal" in none.out and "--signal=" not in none.out
    assert plan(none.out)["time-limit signal"].startswith("none (run.grace_s=0)")
