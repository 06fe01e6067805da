"""How a Slurm job of a stage that can stop early (Parts.stop_time) gets to its end across time-limited allocations:
the dry run's `long run` table. Every stage's: the time-limit signal and the allocations its estimated work needs
(ultra3.cost, measured when an earlier run of the config completed). A training run's too: its checkpoints (count,
size, storage), the work a failure loses at checkpoint.save_interval, the failures expected over the run and the
Young/Daly interval, sqrt(2 x the time a save holds training up x the allocation's MTBF), the allocation's MTBF
being cluster.node_mtbf_hours / run.nodes. A save's time is measured where the log of an earlier run of the config
is on this machine (Megatron's `save-checkpoint` timer), else the model's.
"""

from __future__ import annotations

import glob
import math
import re

from . import cost, cost_data_prep, records
from .cost import _amount, _bytes, _secs
from .contract import CONTINUE_SIGNAL, NAME
from .dotted import get
from .executors import for_record
from .model_math import pos_int, slurm_seconds
from .validation.long_run import STARTUP_S

MTBF = "cluster.node_mtbf_hours"
REQUEUE_HOLD_S = 120  # Slurm holds a requeued job cred_expire seconds (AuthInfo, 120 by default)
SAVE_TIMER = re.compile(r"save-checkpoint \.*: \(([\d.]+), ([\d.]+)\)")  # Megatron's (min, max) across ranks, ms
LOG_TAIL_BYTES = 4 << 20  # read of each log of an earlier run: a training log's last few thousand iterations


def rows(job) -> list[tuple[str, str]]:
    """The plan of a Slurm job whose stage can stop early: a training run's always, another's when its estimated
    work takes more than one allocation; [] for the others."""
    stop_time = job.stage.parts().stop_time
    limit = slurm_seconds(str(job.config["run"].get("time") or ""))
    if job.executor != "slurm" or not stop_time or not limit:
        return []
    cfg = job.config
    training = isinstance(cfg.get("checkpoint"), dict)
    grace = cfg["job"].get("grace_s") or 0
    estimate = cost.estimate(job)
    wall_s = estimate.wall_hours * 3600 if estimate.wall_hours else None
    iters = pos_int(get(cfg, "train.train_iters"))
    step_s = wall_s / iters if wall_s and iters and training else None
    measured = estimate.basis.startswith("measured")  # an earlier run's rate (cost._from_measured)
    measured_step = step_s if measured else None
    save = _measured_save(job) if training else None
    _, write_s, size, _ = cost.step_and_save(cfg) if training else (None, None, None, None)
    if save and not cost.async_save(cfg):
        write_s = save[0]  # a synchronous save blocks for its whole write
    # a training run loads its checkpoint at the save's rate; a data prep goes on from its receipts
    startup = STARTUP_S + (write_s or 0) if training else cost_data_prep.STARTUP_S
    useful = limit - startup - grace
    allocations = math.ceil(wall_s / useful) if wall_s and useful > 0 else None
    if not training and not (allocations and allocations > 1):
        return []

    out = [("time-limit signal", _signal(cfg, grace, stop_time, measured_step, save))]
    if not wall_s:
        out.append(("allocations", f"unknown: {estimate.unknown or 'train.train_iters is unset'}"))
    elif useful <= 0:
        out.append(("allocations", f"none useful: start-up ~{startup:,.0f} s (assumed) + the signal's {grace} s fill "
                                   f"run.time={get(cfg, 'run.time')}; give more time"))
    else:
        what = "work" if not step_s else f"steps at {step_s:.1f} s/it" if step_s >= 1 else f"steps at {step_s:.2g} s/it"
        work = f"{_days(wall_s)} of {what} ({estimate.basis if measured else 'the cost model'})"
        signal = f" and the signal's {grace} s" if grace else ""
        out.append(("allocations", f"1: {work} fit run.time={get(cfg, 'run.time')}" if allocations == 1 else
                    f"{allocations:,} of {_hours(limit)}: {work}, each allocation less ~{startup:,.0f} s start-up "
                    f"(assumed){signal}; a requeue hold of {REQUEUE_HOLD_S} s (Slurm's cred_expire) between them"))
    if training and step_s:
        out += _checkpoints(cfg, step_s, startup, size, write_s, save, (allocations or 1) - 1 if grace else 0, wall_s)
    return out


def _signal(cfg: dict, grace: int, stop_time, measured_step: float | None,
            save: tuple[float, str] | None) -> str:
    if not grace:
        return "none (run.grace_s=0): each allocation ends TIMEOUT and the run stops there"
    set_by = get(cfg, "run.grace_s")
    _, basis = stop_time(cfg)
    said = f"run.grace_s={set_by}" if isinstance(set_by, int) else f"the stop time: {basis}"
    line = f"--signal={CONTINUE_SIGNAL.removeprefix('SIG')}@{grace}: {CONTINUE_SIGNAL} {grace} s before " \
           f"run.time={get(cfg, 'run.time')} ({said})"
    measured_save = save[0] if save and not cost.async_save(cfg) else None
    if measured_step or measured_save:
        need, basis = cost.training_stop(cfg, measured_step, measured_save)
        if need > grace:
            line += f"; measured, the stop takes {need} s ({basis}): set run.grace_s={need}"
    return line


def _checkpoints(cfg: dict, step_s: float, startup: float, size: float | None, write_s: float | None,
                 save: tuple[float, str] | None, signal_saves: int, wall_s: float) -> list[tuple[str, str]]:
    interval = pos_int(get(cfg, "checkpoint.save_interval"))
    if not get(cfg, "checkpoint.save"):
        return [("checkpoints", "none: checkpoint.save is unset, so nothing is saved")]
    if not interval:
        return [("checkpoints", "only at the time-limit signals and the end: checkpoint.save_interval is unset")]
    iters = pos_int(get(cfg, "train.train_iters")) or 0
    nodes = pos_int(get(cfg, "run.nodes")) or 1
    gpus = nodes * (pos_int(get(cfg, "run.gpus_per_node")) or 1)
    count = iters // interval + signal_saves
    kept = pos_int(get(cfg, "checkpoint.most_recent_k"))
    each = f"{_bytes(size)} each (BF16 weights + FP32 main weights and two Adam moments: " \
           f"{cost.SAVE_BYTES_PER_PARAM} bytes/param)" if size else "their size unknown"
    store = f": {_bytes(size * min(count, kept or count))}" if size else ""
    signals = f" and {signal_saves:,} at the time-limit signals" if signal_saves else ""
    out = [("checkpoints", f"{iters // interval:,} every {interval:,} iterations ({_hours(interval * step_s)}){signals}"
                           f", {each}; {f'the newest {kept}' if kept else 'all'} kept{store} "
                           "(checkpoint.most_recent_k)")]
    lost = interval / 2 * step_s + startup
    out.append(("lost per failure", f"{_about(lost)}, {_amount(lost / 3600 * gpus, 'GPU')}: half an interval "
                                    f"({interval // 2:,} iterations) redone, and a start-up"))
    mtbf = get(cfg, MTBF)
    if not (isinstance(mtbf, (int, float)) and mtbf > 0):
        return out
    allocation_mtbf = mtbf * 3600 / nodes
    failures = wall_s / allocation_mtbf
    expected = f"~{failures:,.{0 if failures >= 10 else 1}f}" if failures >= 0.1 else "<0.1"
    out.append(("failures expected", f"{expected} over the run, {_about(failures * lost)} lost: MTBF {mtbf:,g} h per "
                                     f"node ({MTBF}, assumed) / {nodes:,} node{'s' if nodes > 1 else ''} = "
                                     f"{_hours(allocation_mtbf)}"))
    block_s, block = save if save else cost.blocking_save(cfg)
    if not block_s:
        return out
    best = math.sqrt(2 * block_s * allocation_mtbf)
    floor = ""
    if cost.async_save(cfg) and write_s and best < write_s:  # the next save waits for the last one's write
        best, floor = write_s, f", raised to the write's {_secs(write_s)}: asynchronous saves do not overlap"
    length = f"longer than the run: {_hours(best)}" if best >= wall_s else \
        f"~{max(1, round(best / step_s)):,} iterations ({_hours(best)})"
    formula = f"sqrt(2 x save {_secs(block_s)} x MTBF {_hours(allocation_mtbf)}){floor}"
    out.append(("Young/Daly interval", f"{length} = {formula}; save time: {block}; "
                                       f"checkpoint.save_interval={interval:,}"))
    return out


def _measured_save(job) -> tuple[float, str] | None:
    """(seconds, how had) of the longest save in the log of the newest earlier run of this config whose log is on
    this machine: Megatron's `save-checkpoint` timer, the slowest rank's."""
    for m in job.store.manifests():
        producer = str(m.get("producer") or "")
        if m.get("stage") != job.stage.name or m.get("config_digest") != job.digest or not NAME.match(producer):
            continue
        record = records.load(producer)
        if record is None or for_record(record).remote(record):
            continue
        times = [float(high) / 1000 for path in sorted(glob.glob(for_record(record).log_at(record)))
                 for _, high in SAVE_TIMER.findall(_tail(path))]
        if times:
            return max(times), f"measured, the longest of {len(times)} in {record.id}'s log"
    return None


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    if hours >= 1:
        return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else _secs(seconds)


def _about(seconds: float) -> str:
    text = _days(seconds)
    return text if text.startswith("<") else f"~{text}"


def _days(seconds: float) -> str:
    return f"{seconds / 86400:,.1f} days" if seconds >= 86400 else _hours(seconds)
