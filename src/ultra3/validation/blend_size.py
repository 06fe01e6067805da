"""A pretraining blend against the schedule: the tokens a data prep recorded for each split (the manifest.json beside
its blend.json) against the tokens the run trains on, and an empty valid or test split against validation.

Each blend feeds its share of the run: phase 1's up to the phase-2 switch (the whole run without one), phase 2's
after it, a mixed-in blend its `dataset.mix.share` of every split. A train split smaller than that share is read
more than once (Megatron repeats the data: a warning saying how many epochs); an empty one cannot train (an error).
A blend without a readable summary beside it (written by hand, on a file system this machine does not see, a pipe
step not yet run) is not checked."""

from __future__ import annotations

import json
import os

from ultra3.dotted import get

from ..contract import phase2_start
from ..model_math import GBS, SEQ, fmt_count, number, pos_int

SUMMARY = "manifest.json"  # written beside blend.json by `ultra3 data prep pretrain`
SUMMARY_MAX = 64 << 20  # bytes: a summary lists every shard; one larger is not read
HELD_OUT = ("valid", "test")


def check(cfg: dict, report) -> None:
    if get(cfg, "job.stage") != "pretrain" or get(cfg, "dataset.mock"):
        return
    seq, gbs, iters = pos_int(get(cfg, SEQ)), pos_int(get(cfg, GBS)), pos_int(get(cfg, "train.train_iters"))
    if not (seq and gbs and iters):
        return  # the schedule's own rules say what is missing
    start = phase2_start(cfg) if get(cfg, "phase2.blend_path") else None
    share = number(get(cfg, "dataset.mix.share")) if get(cfg, "dataset.mix.blend_path") else None
    share = share if share is not None and 0 < share < 1 else 0
    first = start if start is not None and start < iters else iters
    uses = [("dataset.blend_path", first, 1 - share, "phase 1" if first < iters else "the run"),
            ("phase2.blend_path", iters - first, 1 - share, "phase 2"),
            ("dataset.mix.blend_path", iters, share, f"its share ({share:g}) of the run")]
    for key, steps, part, what in uses:
        splits = _splits(get(cfg, key)) if steps and part else None
        if splits is not None:
            _train(key, splits, steps * seq * gbs * part, what, report)
            _held_out(cfg, key, splits, report)


def _splits(path: object) -> dict[str, int] | None:
    """Tokens per split of the blend at `path` as its data prep recorded them; None where there is no summary."""
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    summary = os.path.join(os.path.dirname(path), SUMMARY)
    try:
        if os.path.getsize(summary) > SUMMARY_MAX:
            return None
        with open(summary, encoding="utf-8") as f:
            splits = json.load(f).get("splits")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(splits, dict):
        return None
    return {name: _tokens(splits.get(name)) for name in ("train", *HELD_OUT)}


def _tokens(split: object) -> int:
    tokens = split.get("tokens") if isinstance(split, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0


def _train(key: str, splits: dict[str, int], needed: float, what: str, report) -> None:
    have = splits["train"]
    if not have:
        report.error(key, f"its train split is empty (the data prep's {SUMMARY}): {what} has nothing to train on; "
                          "prepare more data (more records, or num_shards above valid_shards + test_shards)")
    elif have < needed:
        report.warn(key, f"its train split holds {have:,} tokens but {what} trains on {int(needed):,} "
                         f"({fmt_count(needed)}): about {needed / have:,.1f} epochs, Megatron repeats the data; "
                         "prepare more data, or lower train.train_iters", quoting=("train.train_iters", GBS, SEQ))


def _held_out(cfg: dict, key: str, splits: dict[str, int], report) -> None:
    evals = pos_int(get(cfg, "validation.eval_iters"))
    empty = [name for name in HELD_OUT if not splits[name]]
    if evals and empty:
        report.warn(key, f"its {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty but "
                         f"validation.eval_iters={evals}: nothing to evaluate on; prepare it with valid_shards and "
                         "test_shards of 1 or more (and num_shards above their sum), or set validation.eval_iters=0",
                     quoting=("validation.eval_iters",))
