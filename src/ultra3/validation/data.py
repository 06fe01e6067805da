"""Training data: a job without any fails only after it has waited in the queue, so catch it here.
Paths visible from this machine are checked too: an error for a local run, a warning for a Slurm
submission (compute nodes may mount what this machine does not); the job's preflight checks again."""

from __future__ import annotations

import json
import os

from ultra3.findings import Report

from ._common import get


def check(cfg: dict, report: Report) -> None:
    if get(cfg, "dataset.mock"):
        return
    stage = get(cfg, "job.stage")
    blend = get(cfg, "dataset.blend_path")
    if stage == "pretrain" and not blend:
        report.error("dataset.blend_path", "no training data: set dataset.blend_path=<blend.json written by "
                                           "`ultra3 data prep pretrain`>, or dataset.mock=true for mock data")
    elif blend:
        _check_blend(cfg, blend, report)
    if stage == "sft":
        if not get(cfg, "dataset.packed_dir"):
            report.error("dataset.packed_dir", "no training data: set dataset.packed_dir=<output of "
                                               "`ultra3 data prep sft`>, or dataset.mock=true for mock data")
        if not get(cfg, "recipe.pretrained_checkpoint"):
            report.warn("recipe.pretrained_checkpoint", "unset, and no completed pretrain job on this machine saved "
                                                        "a checkpoint: the job's preflight will stop; set it to the "
                                                        "pretrain stage's checkpoint directory")


def _check_blend(cfg: dict, path: str, report: Report) -> None:
    def problem(what: str) -> None:
        if get(cfg, "job.executor") == "local":
            report.error("dataset.blend_path", f"{what}; run `ultra3 data prep pretrain` or fix the path")
        else:
            report.warn("dataset.blend_path", f"{what} on this machine; fine if the cluster mounts it")

    try:
        with open(os.path.expanduser(path)) as f:
            blend = json.load(f)
    except OSError:
        return problem(f"{path} is not readable")
    except ValueError as e:
        return problem(f"{path} is not JSON ({e})")
    prefixes = [p for split in blend.values() if isinstance(split, list) for p in split if isinstance(p, str)]
    missing = [p for p in prefixes if not (os.path.exists(p + ".bin") and os.path.exists(p + ".idx"))]
    if not prefixes or missing:
        problem(f"{path} names {len(missing)} of {len(prefixes)} shard(s) without .bin/.idx"
                f"{f', e.g. {missing[0]}' if missing else ''}")
