"""Stands in for Megatron-Bridge's pretrain() where no GPU is (recipes/launch.py runs it as the stage's recipe):
plans the start with the runtime's own plan (recipes.training.plan), then does what Megatron-Bridge does at the end
of training: saves a checkpoint at train.train_iters (an iter_NNNNNNN dir and the text tracker)."""

from __future__ import annotations

import argparse
import os

import yaml

from recipes.training.plan import make_plan

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True)
with open(parser.parse_args().config) as f:
    cfg = yaml.safe_load(f)
plan = make_plan(cfg)
iters = next(int(o.split("=")[1]) for o in plan.overrides if o.startswith("train.train_iters="))
decay = next(o for o in plan.overrides if o.startswith("scheduler.max_steps="))
print(f"trainer: {plan.phase.line()}; train.train_iters={iters} {decay}", flush=True)
save = cfg["checkpoint"]["save"]
os.makedirs(os.path.join(save, f"iter_{iters:07d}"), exist_ok=True)
with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
    f.write(str(iters))
