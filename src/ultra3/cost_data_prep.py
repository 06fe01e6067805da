"""The data preps' cost model (Parts.cost of `data prep pretrain|sft|rl`): tokens from the inputs' sizes at a
per-core tokenizer rate, RL blends by their bytes; a completed run of the same config gives a measured rate.
Stdlib only, like ultra3.cost, whose Estimate and helpers it shares; docs/cost.md lists the figures."""

from __future__ import annotations

import glob
import os
import struct

from .cost import Estimate, _bytes, _from_measured, _stage, _unknown
from .dotted import get
from .paths import RECIPES_DIR
from .model_math import fmt_count, pos_int

# Data prep, tokens/s per core. Text: the pipeline's steady state with one worker and a 131k-token vocabulary,
# 10.53-10.59 M tokens/s (docs/data_prep.md, benchmarks/data_prep_pretrain.py); with `encoder: tokenizers`,
# and for conversations (chat rendering on top, not counted): HF tokenizers on one thread, 0.63 M tokens/s
# (field.md §3.1 [measured]). Download time is not counted.
TEXT_TOKENS_PER_S = 10.5e6
HF_TOKENS_PER_S = 0.63e6
BYTES_PER_TOKEN = 4
# A record of unknown size (hf:// with `sample`): 2.3 KB, OSCAR's mean (50.4 MB/s at 21,903 docs/s, field.md §3.1).
BYTES_PER_RECORD = 2300
# RL blends, bytes/s per core: a blend task (rows JSON-decoded and checked, written, hashed; one task per blend)
# did 55-98 MB/s on a 200 MB blend on the 2-core VM (docs/data_prep.md), JSON decoding ~70% of it.
RL_BYTES_PER_S = 60e6
HF = "hf://"
# Stopping at the time-limit signal: running shards are abandoned (finished ones are kept by their receipts), the
# workers ended and the runtime exits; a few seconds, with a margin
STOP_S = 60
STARTUP_S = 30  # assumed: an allocation's start to its first task (the runtime's start, a Ray cluster over the nodes)


def data_prep(config: dict, measured: list[dict]) -> Estimate:
    """Tokenization on CPUs: tokens from the inputs' sizes at a per-core tokenizer rate (RL blends: bytes)."""
    stage = _stage(config)
    cores, cores_from = _cores(config)
    if "blends" in config:
        return _rl_data_prep(config, measured, stage, cores, cores_from)
    tokens, source = _input_tokens(config)
    if found := _from_measured(stage, measured, "tokens", tokens, 0, cores):
        return found
    if tokens is None:
        return _unknown(stage, source)
    conversations = config.get("pack_size") is not None  # render, mask and pack: HF tokenizers with offsets
    if conversations or config.get("encoder") == "tokenizers":
        rate, rate_from = HF_TOKENS_PER_S, "HF tokenizers"
    else:
        rate, rate_from = TEXT_TOKENS_PER_S, "data prep steady state"
    core_s = tokens / rate
    basis = (f"{fmt_count(tokens)} tokens ({source}) at {rate / 1e6:g} M tokens/s per core ({rate_from}; assumed)"
             + (f" on {cores} cores ({cores_from})" if cores else ""))
    return Estimate(stage, core_s / cores / 3600 if cores else None, None, core_s / 3600, basis)


def _input_tokens(config: dict) -> tuple[int | None, str]:
    """(tokens of the inputs, how counted) or (None, why): local files at 4 bytes per token (gzip: its
    uncompressed size), `sample` records at 2.3 KB each where that is less or the input is remote."""
    datasets = config.get("datasets") or []
    if not datasets:
        return None, "no datasets"
    size, how = _input_bytes([str(ds.get("path") or "") for ds in datasets], pos_int(config.get("sample")), "dataset",
                             "/4")
    return (None if size is None else size // BYTES_PER_TOKEN), how


def _input_bytes(paths: list[str], sample: int | None, noun: str, per: str = "") -> tuple[int | None, str]:
    """(bytes of the inputs, how counted: `per` after "local bytes") or (None, why)."""
    total_bytes, how = 0, set()
    for path in paths:
        remote = path.startswith(HF)
        size = None if remote else _local_bytes(path)
        if sample and (size is None or sample * BYTES_PER_RECORD < size):
            size, kind = sample * BYTES_PER_RECORD, f"sample={sample} x 2.3 KB/record"
        elif size is None:
            why = "the size of an hf:// dataset is unknown before download" if remote else "matches no file here"
            return None, f"{path}: {why}; set sample, or run once for a measured rate"
        else:
            kind = f"local bytes{per}"
        total_bytes += size
        how.add(kind)
    return total_bytes, f"{len(paths)} {noun}{'s' if len(paths) > 1 else ''}, {' and '.join(sorted(how))}"


def _rl_data_prep(config: dict, measured: list[dict], stage: str, cores: int | None, cores_from: str) -> Estimate:
    """RL blends: their bytes at RL_BYTES_PER_S per core, a task per blend (so no more cores than blends)."""
    if found := _from_measured(stage, measured, None, None, 0, cores):
        return found
    blends = [str(b) for b in config.get("blends") or []]
    source = str(config.get("source") or "").rstrip("/")
    if not blends:
        return _unknown(stage, "no blends")
    paths = [source if source.startswith(HF) else f"{source}/{b}.jsonl*" for b in blends]
    size, how = _input_bytes(paths, pos_int(config.get("sample")), "blend")
    if size is None:
        return _unknown(stage, how)
    core_s = size / RL_BYTES_PER_S
    used = min(cores, len(blends)) if cores else None
    basis = (f"{_bytes(size)} ({how}) at {RL_BYTES_PER_S / 1e6:g} MB/s per core (measured; see docs/data_prep.md)"
             + (f" on {used} cores ({cores_from}, one task per blend)" if used else ""))
    return Estimate(stage, core_s / used / 3600 if used else None, None, core_s / 3600, basis)


def _local_bytes(path: str) -> int | None:
    path = os.path.expanduser(path)
    files = [f for f in glob.glob(path if os.path.isabs(path) else str(RECIPES_DIR.parent / path)) if os.path.isfile(f)]
    return sum(_text_bytes(f) for f in files) if files else None


def _text_bytes(path: str) -> int:
    """A gzip file's uncompressed size, else the size on disk. The gzip trailer holds the size modulo 4 GiB of
    the last member only: below the size on disk it is not the file's, and the size on disk is taken."""
    size = os.path.getsize(path)
    if path.endswith(".gz") and size >= 18:
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                f.seek(-4, os.SEEK_END)
                return max(size, struct.unpack("<I", f.read(4))[0])
    return size


def _cores(config: dict) -> tuple[int | None, str]:
    """CPU cores the data prep runs on, when the config or this machine says."""
    workers = pos_int(config.get("workers"))
    if workers:
        return workers * (pos_int(config.get("cpus_per_task")) or 1), "workers x cpus_per_task"
    if get(config, "job.runs_here"):
        return len(os.sched_getaffinity(0)), "this machine"
    per_node = pos_int(get(config, "run.cpus_per_task"))
    if per_node:
        return per_node * (pos_int(get(config, "run.nodes")) or 1), "run.nodes x run.cpus_per_task"
    return None, ""


def data_prep_stop(config: dict) -> tuple[int, str]:
    return STOP_S, "the running tasks ended (the finished ones kept by their receipts) and the exit, assumed"
