"""Training data: a job without any fails only after it has waited in the queue, so catch it here.
Whether the paths are readable is checked inside the job (recipes/preflight.py), on the cluster."""

from __future__ import annotations

from ultra3.findings import Report

from ._common import get


def check(cfg: dict, report: Report) -> None:
    if get(cfg, "dataset.mock"):
        return
    stage = get(cfg, "job.stage")
    if stage == "pretrain" and not get(cfg, "dataset.blend_path"):
        report.error("dataset.blend_path", "no training data: set dataset.blend_path=<blend.json written by "
                                           "`ultra3 data prep pretrain`>, or dataset.mock=true for mock data")
    if stage == "sft":
        if not get(cfg, "dataset.packed_dir"):
            report.error("dataset.packed_dir", "no training data: set dataset.packed_dir=<output of "
                                               "`ultra3 data prep sft`>, or dataset.mock=true for mock data")
        if not get(cfg, "recipe.pretrained_checkpoint"):
            report.warn("recipe.pretrained_checkpoint", "unset: SFT starts from randomly initialised weights; set "
                                                        "it to the pretrain stage's checkpoint directory")
