"""A pretraining run in phases (phase2.start_tokens): phase 1 trains on dataset.blend_path up to the switch iteration
and saves there; phase 2 goes on from that checkpoint on phase2.blend_path to train.train_iters. The optimizer, the
LR schedule (the whole run's in both phases: Megatron-Bridge's scheduler.max_steps, never a phase's end) and the
consumed samples are carried on as in any resume, so the run is one schedule over two blends. Which phase a start
runs is read from the checkpoint it resumes (recipes/launch.py starts phase 2 once phase 1 has saved). Pure Python."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..contract import checkpoint_iteration, phase2_start


@dataclass(frozen=True)
class Phase:
    number: int  # 1 or 2; 1 of 1 without a phase 2
    of: int
    first: int  # the iteration it starts at
    last: int  # the iteration it trains up to (its train.train_iters)
    blend_path: str | None

    def line(self) -> str:
        return f"phase {self.number} of {self.of}: iterations {self.first:,}-{self.last:,} on " \
               f"{self.blend_path or 'mock data'}"


def current(cfg: dict, values: dict[str, Any]) -> Phase:
    """The phase this start trains: by the iteration its checkpoint resumes from (a fork's step, else the newest
    in checkpoint.load)."""
    dataset, total = cfg.get("dataset") or {}, int((cfg.get("train") or {}).get("train_iters") or 0)
    blend = None if dataset.get("mock") else dataset.get("blend_path")
    start = phase2_start(cfg)
    if start is None:
        return Phase(1, 1, 0, total, blend)
    at = values.get("checkpoint.ckpt_step")
    if at is None:
        load = values.get("checkpoint.load")
        at = checkpoint_iteration(os.path.expanduser(load)) if isinstance(load, str) else None
    if at is not None and at >= start:
        phase2 = None if dataset.get("mock") else (cfg.get("phase2") or {}).get("blend_path")
        return Phase(2, 2, start, total, phase2)
    return Phase(1, 2, 0, start, blend)


def schedule_overrides(cfg: dict, phase: Phase) -> dict[str, Any]:
    """The phase's end as train.train_iters, and the whole run's as Megatron-Bridge's scheduler.max_steps: the LR
    and weight-decay schedules (and the scheduler state phase 2 loads, which Megatron-Core checks against its own)
    are the whole run's in both phases."""
    if phase.of == 1:
        return {}
    return {"train.train_iters": phase.last, "scheduler.max_steps": int((cfg.get("train") or {})["train_iters"])}
