"""How a Slurm training run gets to its end across time-limited allocations: the time-limit signal, the allocations
needed, the checkpoints (count, size, storage), the work a failure loses at checkpoint.save_interval, and the
interval that minimises it (Young/Daly: sqrt(2 x save time x the allocation's MTBF), the allocation's MTBF being
cluster.node_mtbf_hours / nodes). Step and save times come from ultra3.cost (training_stop's model).
"""

from __future__ import annotations

import math

from ultra3.cost import _bytes, step_and_save, training, training_stop
from ultra3.dotted import get

from ..model_math import pos_int, slurm_seconds

MTBF = "cluster.node_mtbf_hours"
STARTUP_S = 300  # assumed: the job's start, NCCL's initialisation, the first step's kernel autotuning (87 s on one
# H200, benchmarks/gpu_smoke); the checkpoint's load is added, at the save's rate
KEEP_ALL_MAX = 20  # more checkpoints than this, all kept: a warning
REQUEUE_HOLD_S = 120  # Slurm holds a requeued job cred_expire seconds (AuthInfo, 120 by default)


def check(cfg: dict, report) -> None:
    if (cfg.get("job") or {}).get("executor") != "slurm":
        return  # no time limit
    limit = slurm_seconds(str(get(cfg, "run.time") or ""))
    stop_s, stop_basis = training_stop(cfg)
    grace = get(cfg, "run.grace_s")
    if limit and isinstance(grace, int) and grace >= limit:
        report.error("run.grace_s", f"{grace} s is not less than the time limit run.time={get(cfg, 'run.time')} "
                                    f"({limit} s): the stage would be told to stop before it starts; give fewer "
                                    f"seconds (it needs {stop_s}: {stop_basis})", ("run.time",))
        return
    if isinstance(grace, int) and 0 < grace < stop_s:
        report.warn("run.grace_s", f"{grace} s may be too short to save and stop: {stop_basis} = {stop_s} s; a stage "
                                   "still running then is requeued from its last periodic save")
    if grace == 0:
        report.warn("run.grace_s", "0: no time-limit signal, so each allocation ends TIMEOUT and the run stops "
                                   "there; set null to have it saved and continued")
    save_dir = get(cfg, "checkpoint.save")
    if not save_dir:
        report.warn("checkpoint.save", "unset: nothing is saved, so a run longer than one allocation cannot go on "
                                       "from where it stopped; set a directory shared by the attempts")
    iters, interval = pos_int(get(cfg, "train.train_iters")), pos_int(get(cfg, "checkpoint.save_interval"))
    kept_all = save_dir and iters and interval and not get(cfg, "checkpoint.most_recent_k")
    if kept_all and iters // interval > KEEP_ALL_MAX:
        report.warn("checkpoint.most_recent_k", f"unset: all {iters // interval:,} checkpoints are kept (see the long "
                                                "run table for their size); set it to keep the newest few")
    if limit:
        report.tables["long run"] = _plan(cfg, limit, grace if isinstance(grace, int) else stop_s, stop_basis,
                                          bool(save_dir))


def _plan(cfg: dict, limit: int, grace: int, stop_basis: str, saves: bool) -> list[tuple[str, str]]:
    rows = [("time-limit signal", f"SIGUSR1 {grace} s before run.time={get(cfg, 'run.time')}"
             + ("" if isinstance(get(cfg, "run.grace_s"), int) else f" ({stop_basis})"))]
    iters = pos_int(get(cfg, "train.train_iters"))
    estimate = training(cfg, [])
    if not (iters and estimate.wall_hours):
        return rows + [("allocations", f"unknown: {estimate.unknown or 'train.train_iters is unset'}")]
    nodes = pos_int(get(cfg, "run.nodes")) or 1
    gpus = nodes * (pos_int(get(cfg, "run.gpus_per_node")) or 1)
    step_s = estimate.wall_hours * 3600 / iters
    _, save_s, size, _ = step_and_save(cfg)
    save_s = save_s or 0.0
    startup = STARTUP_S + save_s
    useful = limit - startup - grace
    if useful <= 0:
        return rows + [("allocations", f"none useful: start-up ~{startup:.0f} s (assumed) + the signal's {grace} s "
                                       f"fill run.time; give more time")]
    wall_s = estimate.wall_hours * 3600
    allocations = math.ceil(wall_s / useful)
    if allocations == 1:
        return rows + [("allocations", f"1: {_days(wall_s)} of steps fit run.time={get(cfg, 'run.time')}")]
    rows.append(("allocations", f"{allocations:,} of {_hours(limit)} ({_days(wall_s)} of steps at {step_s:.1f} s/it; "
                                f"each allocation ~{startup:.0f} s start-up (assumed) and a requeue hold of "
                                f"{REQUEUE_HOLD_S} s (Slurm's cred_expire) between them)"))
    interval = pos_int(get(cfg, "checkpoint.save_interval"))
    if saves and interval:
        count = iters // interval
        kept = pos_int(get(cfg, "checkpoint.most_recent_k"))
        each = f"{_bytes(size)} each (BF16 weights + FP32 optimizer state)" if size else "size unknown"
        store = f", {_bytes(size * min(count, kept or count))} kept" if size else ""
        rows.append(("checkpoints", f"every {interval:,} iterations ({_hours(interval * step_s)}): {count:,} saves, "
                                    f"{each}; {f'the newest {kept}' if kept else 'all'} kept{store} "
                                    f"(checkpoint.most_recent_k)"))
        lost = interval / 2 * step_s + startup
        rows.append(("lost per failure", f"~{_hours(lost)}, {lost / 3600 * gpus:,.0f} GPU-hours: half an interval "
                                         f"({interval // 2:,} iterations) redone, and a start-up"))
        mtbf = get(cfg, MTBF)
        if isinstance(mtbf, (int, float)) and mtbf > 0 and save_s:
            allocation_mtbf = mtbf * 3600 / nodes
            best = math.sqrt(2 * save_s * allocation_mtbf)
            failures = wall_s / allocation_mtbf
            rows.append(("failures expected", f"~{failures:,.0f} over the run (MTBF {mtbf:,g} h per node "
                                              f"({MTBF}, assumed) / {nodes} nodes = {_hours(allocation_mtbf)})"))
            rows.append(("Young/Daly interval", f"~{best / step_s:,.0f} iterations ({_hours(best)}) = sqrt(2 x save "
                                                f"{save_s:.0f} s x MTBF {_hours(allocation_mtbf)}); "
                                                f"checkpoint.save_interval={interval:,}"))
    return rows


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.1f} h" if hours >= 1 else f"{seconds / 60:.0f} min"


def _days(seconds: float) -> str:
    return f"{seconds / 86400:,.1f} days" if seconds >= 86400 else _hours(seconds)
