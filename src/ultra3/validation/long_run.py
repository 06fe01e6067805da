"""On Slurm, a run longer than one allocation: the time-limit signal's seconds (run.grace_s) against the time limit
and the stage's stop time (check_grace, for every stage that can stop early), and for training what a run of many
allocations needs: a checkpoint directory, and not every checkpoint kept. The plan itself (allocations, checkpoints,
lost work, the Young/Daly interval) is the dry run's `long run` table, ultra3.run_plan.
"""

from __future__ import annotations

from ultra3.cost import training_stop
from ultra3.dotted import get

from ..model_math import pos_int, slurm_seconds

STARTUP_S = 300  # assumed: the job's start, NCCL's initialisation, the first step's kernel autotuning (87 s on one
# H200, benchmarks/gpu_smoke); a training run's checkpoint load is added, at the save's rate
KEEP_ALL_MAX = 20  # more checkpoints than this, all kept: a warning


def check(cfg: dict, report) -> None:
    if (cfg.get("job") or {}).get("executor") != "slurm":
        return  # no time limit
    check_grace(cfg, report, *training_stop(cfg))
    save_dir = get(cfg, "checkpoint.save")
    if not save_dir:
        report.warn("checkpoint.save", "unset: nothing is saved, so a run longer than one allocation cannot go on "
                                       "from where it stopped; set a directory shared by the attempts")
    iters, interval = pos_int(get(cfg, "train.train_iters")), pos_int(get(cfg, "checkpoint.save_interval"))
    kept_all = save_dir and iters and interval and not get(cfg, "checkpoint.most_recent_k")
    if kept_all and iters // interval > KEEP_ALL_MAX:
        report.warn("checkpoint.most_recent_k", f"unset: every checkpoint is kept, {iters // interval:,} at "
                                                "checkpoint.save_interval alone (see the long run table for all and "
                                                "their size); set it to keep the newest few")


def check_grace(cfg: dict, report, stop_s: int, basis: str) -> None:
    """A Slurm job's run.grace_s: at or past the time limit an error, below the stage's stop time a warning, 0 (no
    signal) a warning."""
    if (cfg.get("job") or {}).get("executor") != "slurm":
        return
    limit = slurm_seconds(str(get(cfg, "run.time") or ""))
    grace = get(cfg, "run.grace_s")
    if not isinstance(grace, int) or isinstance(grace, bool):
        return
    if limit and grace >= limit:
        report.error("run.grace_s", f"{grace} s is not less than the time limit run.time={get(cfg, 'run.time')} "
                                    f"({limit} s): the stage would be told to stop before it starts; give fewer "
                                    f"seconds (it needs {stop_s}: {basis})", ("run.time",))
    elif 0 < grace < stop_s:
        report.warn("run.grace_s", f"{grace} s may be too short to save and stop: {basis} = {stop_s} s; a stage "
                                   f"still running then is requeued from its last save; give {stop_s} or null")
    elif grace == 0:
        report.warn("run.grace_s", "0: no time-limit signal, so each allocation ends TIMEOUT and the run stops "
                                   "there; set null to have it saved and continued")
