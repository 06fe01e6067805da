"""Rules for the data-prep stages: a blend that can run, inputs that exist, packing that fits.

Local paths are checked here when they should be visible from this machine: an error for a local run,
a warning for a Slurm submission (compute nodes may mount what the login node does not). A relative
path is relative to the job's working directory, which holds the shipped `recipes/` (and its samples)."""

from __future__ import annotations

import glob
import os

from ultra3.findings import Report
from ultra3.paths import RECIPES_DIR

from ._common import get

HF = "hf://"


def validate_data_prep(cfg: dict, report: Report) -> None:
    datasets = get(cfg, "datasets") or []
    if not datasets:
        report.error("datasets", "the blend is empty; list at least one dataset (name, path, weight)")
    names = [d.get("name") for d in datasets]
    for i, ds in enumerate(datasets):
        key = f"datasets[{i}]"
        if not ds.get("name"):
            report.error(f"{key}.name", "every dataset needs a name (it names its shards and its blend entry)")
        elif names.count(ds["name"]) > 1:
            report.error(f"{key}.name", f"'{ds['name']}' is used by {names.count(ds['name'])} datasets; names "
                                        "must be unique")
        weight = ds.get("weight", 1.0)
        if weight is not None and weight <= 0:
            report.error(f"{key}.weight", f"{weight} is not positive; give a weight > 0 or remove the dataset")
        _check_path(cfg, ds.get("path"), f"{key}.path", report)
    tokenizer = get(cfg, "tokenizer")
    if not tokenizer:
        report.error("tokenizer", "no tokenizer; set a Hugging Face name or a local tokenizer.json or directory")
    elif (tokenizer.endswith(".json") or tokenizer.startswith(("/", "~", "."))) and not _exists(tokenizer):
        _missing(cfg, "tokenizer", f"{tokenizer} does not exist", report)
    if not get(cfg, "output_dir"):
        report.error("output_dir", "no output_dir; set where the shards go (shared storage for a cluster)")
    for key in ("num_shards", "sample", "workers", "pack_size", "valid_shards", "test_shards"):
        value = get(cfg, key)
        if value is not None and value < (0 if key.endswith("_shards") else 1):
            report.error(key, f"{value} is out of range; use a positive number")
    _check_packing(cfg, report)


def _check_path(cfg: dict, path: object, key: str, report: Report) -> None:
    if not path:
        report.error(key, "no path; give a local file or glob (.jsonl, .jsonl.gz, .jsonl.zst, .parquet) or hf://org/name")
    elif isinstance(path, str) and not path.startswith(HF) and not _exists(path):
        _missing(cfg, key, f"{path} matches no file", report)


def _exists(path: str) -> bool:
    path = os.path.expanduser(path)
    return bool(glob.glob(path if os.path.isabs(path) else str(RECIPES_DIR.parent / path)))


def _missing(cfg: dict, key: str, what: str, report: Report) -> None:
    if any(i.get("key") == key and i.get("pending") for i in get(cfg, "job.inputs") or []):
        return  # the output of an earlier pipe step, not made yet
    if get(cfg, "job.executor") == "local":
        report.error(key, f"{what} on this machine; fix the path")
    else:
        report.warn(key, f"{what} on this machine; fine if the cluster mounts it (the job's preflight checks)")


def _check_packing(cfg: dict, report: Report) -> None:
    pack, mult = get(cfg, "pack_size"), get(cfg, "pad_seq_to_mult")
    if pack and mult and pack % mult:
        report.error("pad_seq_to_mult", f"pack_size {pack} is not a multiple of pad_seq_to_mult {mult}; use a pack "
                                        f"size like {pack - pack % mult} or {pack - pack % mult + mult}")
    ratios = [get(cfg, k) or 0 for k in ("valid_ratio", "test_ratio")]
    if any(r < 0 for r in ratios) or sum(ratios) >= 1:
        report.error("valid_ratio", f"valid_ratio + test_ratio = {sum(ratios)} leaves nothing to train on; keep the "
                                    "sum below 1")
