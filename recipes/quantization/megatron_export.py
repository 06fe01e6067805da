"""A Megatron-Bridge checkpoint as the BF16 input: the `checkpoint.save` directory of a pretrain or sft job (a
tracker file and iter_NNNNNNN/ subdirectories) is exported to Hugging Face with Megatron-Bridge's own API before
quantization, as its examples/conversion/convert_checkpoints.py export does. The export needs the model's Hugging
Face config and tokenizer: `recipe.hf_model` of the job that saved the checkpoint (its <task>/code/config.yaml),
or, for a model built from our keys (recipe.hf_model null, the tiny model), the config.json the training
runtime built it from (training/hf_config.py) with the job's tokenizer. Megatron-Bridge is imported only here, when
there is a checkpoint to export: it runs in the training container."""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from contextlib import contextmanager

import yaml

from ..contract import CHECKPOINT_TRACKERS
from .errors import QuantizeError

TRACKERS = CHECKPOINT_TRACKERS  # the files that name a Megatron-Bridge checkpoint's latest iteration
EXPORT_DIR = "bf16-hf"  # under the quantize job's dir
REFERENCE = "hf_reference"  # in a checkpoint `ultra3 convert hf-to-megatron` made: the source's config and tokenizer
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")


def is_megatron(path: str) -> bool:
    return any(os.path.isfile(os.path.join(os.path.expanduser(path), t)) for t in TRACKERS)


def job_configs(checkpoint: str) -> list[str]:
    """Config files of the jobs that may have saved `checkpoint`: in the job dir above it (checkpoint.save under
    ${job.dir}) and in the job dirs of its stage (under ${job.outputs}: <root>/outputs/<stage slug>/<config>/...,
    the jobs being <root>/<stage slug>/<job id>/)."""
    parent = os.path.dirname(checkpoint)
    found = glob.glob(os.path.join(parent, "*", "code", "config.yaml"))
    slug_dir = os.path.dirname(parent)
    outputs = os.path.dirname(slug_dir)
    if os.path.basename(outputs) == "outputs":
        found += glob.glob(os.path.join(os.path.dirname(outputs), os.path.basename(slug_dir), "*", "*", "code",
                                        "config.yaml"))
    return sorted(found, key=os.path.getmtime, reverse=True)


def training_config(checkpoint: str, key: str = "bf16_checkpoint") -> tuple[dict, str]:
    """The config of the newest job whose checkpoint.save is `checkpoint`, and its code dir (where the job ran)."""
    ckpt = os.path.realpath(os.path.expanduser(checkpoint))
    for path in job_configs(ckpt):
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
        save = (cfg.get("checkpoint") or {}).get("save")
        if isinstance(save, str) and os.path.realpath(save) == ckpt:
            return cfg, os.path.dirname(path)
    raise QuantizeError(f"{key}: {checkpoint} is a Megatron checkpoint, but no job config "
                        "(<job dir>/<task>/code/config.yaml) next to it saved there, so its Hugging Face model is "
                        "unknown; give the checkpoint.save dir of a pretrain/sft job, or a Hugging Face checkpoint")


def imported_reference(checkpoint: str) -> str | None:
    """The Hugging Face config and tokenizer `ultra3 convert hf-to-megatron` keeps beside the checkpoint it made, if
    this is one: no job config names that model."""
    saved = os.path.join(os.path.expanduser(checkpoint), REFERENCE)
    return saved if os.path.isfile(os.path.join(saved, "config.json")) else None


def reference_model(train: dict, code_dir: str, dest: str, key: str = "bf16_checkpoint") -> str:
    """The Hugging Face model the export is made against: recipe.hf_model (a hub id or a directory), or `dest`
    holding the config.json the training runtime made from the job's model keys, and the job's tokenizer."""
    hf_model = (train.get("recipe") or {}).get("hf_model")
    if hf_model:
        local = os.path.join(code_dir, os.path.expanduser(hf_model))
        return local if os.path.isdir(local) else hf_model
    from ..training.hf_config import hf_config
    from transformers import AutoTokenizer

    tokenizer = (train.get("tokenizer") or {}).get("tokenizer_model")
    if not tokenizer:
        raise QuantizeError(f"{key}: the job that saved it names neither recipe.hf_model nor "
                            "tokenizer.tokenizer_model; export it to Hugging Face yourself and give that directory")
    local = os.path.join(code_dir, tokenizer)
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(train["model"]), f, indent=2)
    AutoTokenizer.from_pretrained(local if os.path.isdir(local) else tokenizer).save_pretrained(dest)
    return dest


@contextmanager
def own_rendezvous():
    """Megatron-Bridge's export starts a one-process group; under torchrun it must not join the job's store."""
    saved = {k: os.environ.pop(k) for k in RENDEZVOUS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def export(checkpoint: str, reference: str, dest: str) -> None:
    """Megatron-Bridge's export: a Hugging Face config synthesized from the checkpoint's run_config.yaml and the
    reference model, the weights converted on CPU into `dest` with the reference's tokenizer."""
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    bridge = AutoBridge.from_auto_config(megatron_path=checkpoint, hf_model_id=reference)
    with own_rendezvous():
        bridge.export_ckpt(megatron_path=checkpoint, hf_path=dest, show_progress=False)


def to_hf(cfg: dict, log) -> str:
    """`bf16_checkpoint` as a Hugging Face checkpoint: itself, or its export under the job dir."""
    ckpt = cfg.get("bf16_checkpoint")
    if not ckpt or cfg.get("make_checkpoint") or not is_megatron(ckpt):
        return ckpt
    dest = os.path.join((cfg.get("job") or {}).get("dir") or os.path.dirname(cfg["output_dir"]), EXPORT_DIR)
    return export_once(ckpt, dest, "bf16_checkpoint", log)


def export_once(ckpt: str, dest: str, key: str, log, container: str = "the training container") -> str:
    """The Megatron checkpoint `ckpt` (the value of config key `key`) exported to Hugging Face at `dest`, made
    by the first rank, once: a re-run reuses it; the other ranks wait for it."""
    if os.path.isdir(dest):
        log(f"{ckpt} is a Megatron checkpoint: using its Hugging Face export {dest}")
        return dest
    failed = f"{dest}.failed"  # rank 0's reason, for the ranks waiting on it
    if int(os.environ.get("RANK", "0")):
        return wait_for_export(dest, failed, key)
    if os.path.exists(failed):
        os.unlink(failed)
    try:
        imported = imported_reference(ckpt)
        train, code_dir = training_config(ckpt, key) if not imported else ({}, "")
        try:
            import megatron.bridge  # noqa: F401
        except ImportError:
            raise QuantizeError(f"{key}: {ckpt} is a Megatron checkpoint, and exporting it needs "
                                f"Megatron-Bridge: run in {container}") from None
        partial = f"{dest}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        reference = imported or reference_model(train, code_dir, f"{dest}.reference", key)
        log(f"{ckpt} is a Megatron checkpoint: exporting it to Hugging Face with Megatron-Bridge against {reference}")
        started = time.time()
        export(ckpt, reference, partial)
        os.replace(partial, dest)
    except BaseException as e:
        try:  # best effort: the error itself is what this rank reports
            with open(failed, "w", encoding="utf-8") as f:
                f.write(f"{type(e).__name__}: {e}")
        except OSError:
            pass
        raise
    log(f"exported {dest} in {time.time() - started:.0f} s")
    return dest


EXPORT_WAIT_S = float(os.environ.get("ULTRA3_EXPORT_WAIT_S", 6 * 3600))  # rank 0's export, at the longest


def wait_for_export(dest: str, failed: str, key: str, poll: float = 10.0) -> str:
    """The other ranks wait for rank 0's export: until it is there, rank 0 says it failed, or the wait ends."""
    deadline = time.time() + EXPORT_WAIT_S
    while not os.path.isdir(dest):
        if os.path.exists(failed):
            with open(failed, encoding="utf-8") as f:
                raise QuantizeError(f"{key}: rank 0's Hugging Face export failed ({f.read().strip()}); see rank 0's "
                                    "log")
        if time.time() > deadline:
            raise QuantizeError(f"{key}: rank 0's Hugging Face export {dest} did not appear within "
                                f"{EXPORT_WAIT_S:.0f} s; see rank 0's log (ULTRA3_EXPORT_WAIT_S sets the wait)")
        time.sleep(min(poll, max(0.0, deadline - time.time())))
    return dest
