"""Inputs given as paths, checked in the dry run for what is at them: nothing (an error on this machine, a warning for
a cluster, whose nodes may mount what this machine does not; the job's preflight checks again), a blend.json
naming shards without .bin/.idx, a packed SFT dir of another data prep or pack size, a path inside the job's own
directory that is empty until it starts."""

from __future__ import annotations

import json
import os
from typing import Any

from .artifacts import Producers, Source, hint
from .dotted import get
from .findings import Report
from .paths import JOB_DIR_PLACEHOLDER
from .stage import Stage


def check_paths(stage: Stage, config: dict[str, Any], sources: list[Source | None], profile: str | None, local: bool,
                report: Report, producers: Producers) -> None:
    """Inputs given as paths must exist: an error on this machine, a warning for a cluster (its nodes may
    mount what this machine does not; the job's preflight checks again). A blend.json must name shards."""
    for inp, src in zip(stage.inputs, sources):
        if src and src.path.startswith(JOB_DIR_PLACEHOLDER):  # nothing is there before the job starts
            made = f", or {inp.unless}=true to make it" if inp.unless else ""
            path = src.path.replace(JOB_DIR_PLACEHOLDER, "${job.dir}")
            report.error(inp.key, f"{path} is inside this job's own new directory, empty until the job starts "
                                  f"({src.how}); set {inp.key}=PATH, or {inp.key}=null for the newest "
                                  f"{' or '.join(inp.kinds)} artifact{made}")
            continue
        if not src or src.pending or not src.path.startswith(("/", "~")):
            continue  # hub ids and repo-relative samples are the stage validator's
        path = os.path.expanduser(src.path)
        problem = None
        if not os.path.exists(path):
            problem = f"{src.path} does not exist"
        elif "pretrain-data" in inp.kinds and os.path.isfile(path):
            problem = blend_problem(path)
        elif inp.kinds == ("sft-data",) and inp.key == "dataset.packed_dir":
            problem = _packed_problem(path, config)
        if problem:
            fix = f"run `{hint(inp, producers, profile, config)}` or fix the path"
            if local:
                report.error(inp.key, f"{problem} ({src.how}); {fix}")
            else:
                report.warn(inp.key, f"{problem} on this machine ({src.how}); fine if the cluster mounts it")


def _packed_problem(path: str, config: dict[str, Any]) -> str | None:
    """What training would find wrong with a packed SFT dir: not one, another data prep's, another pack size."""
    meta = os.path.join(path, "metadata.json")
    if not os.path.isdir(path):
        return f"{path} is not a directory"
    try:
        with open(meta, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return f"{path} has no readable metadata.json, so it is no output of `ultra3 data prep sft`"
    if not isinstance(found, dict) or not str(found.get("format", "")).startswith("ultra3-sft-packed-parquet/"):
        return f"{path} is no output of `ultra3 data prep sft` (its metadata.json is of {found.get('format')!r})" \
            if isinstance(found, dict) else f"{path}/metadata.json is not a JSON object"
    want = get(config, "dataset.pack_size") or get(config, "model.seq_length")
    if want and found.get("pack_size") != want:
        return (f"{path} is packed at {found.get('pack_size')} tokens but this run trains on {want} "
                f"(dataset.pack_size); pack it again at {want} or set dataset.pack_size={found.get('pack_size')}")
    return None


def blend_problem(path: str) -> str | None:
    try:
        with open(path) as f:
            blend = json.load(f)
    except (OSError, ValueError) as e:
        return f"{path} is not a readable JSON blend ({e})"
    prefixes = [p for split in blend.values() if isinstance(split, list) for p in split if isinstance(p, str)] \
        if isinstance(blend, dict) else []
    missing = [p for p in prefixes if not (os.path.exists(p + ".bin") and os.path.exists(p + ".idx"))]
    if not prefixes or missing:
        return (f"{path} names {len(missing)} of {len(prefixes)} shard(s) without .bin/.idx"
                f"{f', e.g. {missing[0]}' if missing else ''}")
    return None
