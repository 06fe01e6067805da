"""A pretraining run in two phases (phase2.start_tokens) and a blend mixed in (dataset.mix): the switch must fall
inside the run and be counted in iterations; the dry run's `phases` table gives each phase's iterations, tokens,
blend and learning rate at its two ends (one schedule across both: recipes/training/phases.py)."""

from __future__ import annotations

from ultra3.contract import phase2_start
from ultra3.dotted import get
from ultra3.lr_schedule import lr_at

from ..model_math import GBS, SEQ, fmt_count, pos_int

START = "phase2.start_tokens"
ITERS = "train.train_iters"
DECAY = "scheduler.lr_decay_iters"
MAX_STEPS = "scheduler.max_steps"


def check(cfg: dict, report) -> None:
    _mix(cfg, report)
    tokens = get(cfg, START)
    if tokens is None:
        return
    if not isinstance(tokens, (int, float)) or tokens <= 0:
        report.error(START, f"{START}={tokens!r} must be a positive token count (or null for one blend)")
        return
    iters, per_iter = pos_int(get(cfg, ITERS)), (pos_int(get(cfg, SEQ)) or 0) * (pos_int(get(cfg, GBS)) or 0)
    if iters is None:  # a bad train_iters is the schedule rules' to report
        if get(cfg, ITERS) is None:
            report.error(START, f"a run in phases counts iterations: set {ITERS} (not train.train_samples)",
                         quoting=("train.train_samples",))
        return
    start = phase2_start(cfg)
    if start is None or not per_iter:
        return
    if start >= iters:
        report.error(START, f"{fmt_count(tokens)} tokens is iteration {start:,}, at or past the run's end ({ITERS}="
                            f"{iters:,}, {fmt_count(iters * per_iter)} tokens); use fewer than "
                            f"{iters * per_iter:,}, or {START}=null for one blend", quoting=(ITERS, SEQ, GBS))
        return
    if not get(cfg, "checkpoint.save"):
        report.error(START, "phase 2 starts from the checkpoint phase 1 saves at the switch: set checkpoint.save "
                            "(or phase2.start_tokens=null for one blend)", quoting=("checkpoint.save",))
    for key in (DECAY, MAX_STEPS):  # Megatron-Bridge's max_steps carries the run's schedule and sets lr_decay_iters
        if get(cfg, key) not in (None, iters):
            report.error(key, f"{get(cfg, key):,}: a run in phases decays over the whole run ({ITERS}={iters:,}: "
                              f"Megatron-Bridge's {MAX_STEPS} in both phases, which sets {DECAY}); set {key}=null",
                         quoting=(START, ITERS))
    if get(cfg, "dataset.mock"):
        report.note(START, "dataset.mock: both phases train on mock data; the switch at iteration "
                           f"{start:,} still runs (phase 2 from phase 1's checkpoint)")
    report.tables["phases"] = _rows(cfg, start, iters, per_iter)
    report.facts.update(phase2_start_iteration=start, phase1_tokens=start * per_iter,
                        phase2_tokens=(iters - start) * per_iter)


def _rows(cfg: dict, start: int, iters: int, per_iter: int) -> list[tuple[str, str]]:
    rows = []
    for name, first, last, blend in (("phase 1", 0, start, "dataset"), ("phase 2", start, iters, "phase2")):
        lr = (lr_at(cfg, first), lr_at(cfg, last))
        lrs = f", LR {lr[0]:.3g} -> {lr[1]:.3g}" if None not in lr else ""
        data = "mock data" if get(cfg, "dataset.mock") else \
            f"{get(cfg, f'{blend}.blend_path')} ({blend}.data_config={get(cfg, f'{blend}.data_config')})"
        rows.append((name, f"iterations {first:,}-{last:,}: {fmt_count((last - first) * per_iter)} tokens{lrs}"))
        rows.append(("  blend", data))
    return rows


def _mix(cfg: dict, report) -> None:
    share = get(cfg, "dataset.mix.share")
    if share is not None and not 0 < share < 1:
        report.error("dataset.mix.share", f"{share!r} must be a fraction between 0 and 1 (exclusive): the mixed-in "
                                          "blend's share of every split, e.g. 0.54")
