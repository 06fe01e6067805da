"""What `ultra3 convert` checks before any heavy import (plain Python and PyYAML): the config's keys, the paths,
the Hugging Face reference of an export, and a Megatron checkpoint's run_config.yaml against the Hugging Face
config.json it is exported with."""

from __future__ import annotations

import glob
import json
import os

import yaml

from ..contract import CHECKPOINT_TRACKERS, HUB_MODEL
from ..dataprep.errors import DataPrepError
from ..dataprep.settings import take
from ..quantization import megatron_export
from ..training.hf_config import HF_KEYS, hf_config

STAGES = ("convert hf-to-megatron", "convert megatron-to-hf")
REFERENCE = megatron_export.REFERENCE
# Megatron names of what the weights' shapes follow: a checkpoint and its Hugging Face config must agree on them
MUST_MATCH = ("num_layers", "hybrid_layer_pattern", "mtp_hybrid_override_pattern", "mtp_num_layers", "hidden_size",
              "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "mamba_num_heads",
              "mamba_head_dim", "mamba_state_dim", "mamba_num_groups", "num_moe_experts", "moe_router_topk",
              "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_latent_size", "vocab_size",
              "share_embeddings_and_output_weights")
BLOCKS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}


class ConvertError(DataPrepError):
    """A problem with the config or the inputs: one line, exit INPUT_ERROR_EXIT, nothing written."""


# -- the config and the checks that need no heavy import ------------------------------------------------------------


def settings(cfg: dict) -> dict:
    """The config's keys, each present and of its kind; the direction from job.stage."""
    stage = (cfg.get("job") or {}).get("stage")
    if stage not in STAGES:
        raise ConvertError(f"job.stage: {stage!r} is not {' or '.join(map(repr, STAGES))}; run it through `ultra3 "
                           "convert`, or give `job: {stage: convert hf-to-megatron}` in a config written by hand")
    s = {"direction": stage.split()[1], "model": take(cfg, "model", dict), "seed": take(cfg, "seed", int)}
    own = (("make_checkpoint", bool), ("tokenizer", str | None)) if s["direction"] == "hf-to-megatron" else \
        (("megatron_checkpoint", str | None),)
    s.update(make_checkpoint=False, tokenizer=None, megatron_checkpoint=None)  # the other direction's keys
    for key, kind in (("hf_model", str | None), ("output_dir", str), *own):
        s[key] = take(cfg, key, kind)
    parity = take(cfg, "parity", dict)
    s["parity"] = {k: take(parity, k, kind, "parity.") for k, kind in
                   (("tokens", int), ("data", str), ("max_relative_error", float), ("min_top1", float))}
    s["job_dir"] = (cfg.get("job") or {}).get("dir") or os.path.dirname(os.path.abspath(s["output_dir"]))
    return s


def is_local(path: str) -> bool:
    return path.startswith(("/", "~", ".")) or os.path.exists(path) or not HUB_MODEL.match(path)


def hf_dir_config(path: str, key: str, how: str = "") -> dict:
    """config.json of the local Hugging Face Nemotron-H checkpoint `path` (config key `key`)."""
    file = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isdir(os.path.expanduser(path)):
        raise ConvertError(f"{key}: {path}{how} is not a directory nor a hub id (org/name); give a Hugging Face "
                           "model dir or hub id")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConvertError(f"{key}: {file}{how} is not a readable JSON config ({e}); give a Hugging Face model dir")
    if not isinstance(config, dict) or config.get("model_type") != "nemotron_h":
        found = config.get("model_type") if isinstance(config, dict) else None
        raise ConvertError(f"{key}: {path}{how} is not a Nemotron-H checkpoint ({file} says model_type {found!r}, "
                           "not 'nemotron_h'); give a Nemotron-H model")
    return config


def iteration_dir(ckpt: str) -> str:
    """The iteration of a Megatron-Bridge checkpoint its tracker names (the newest iter_* for a binary tracker)."""
    key = "megatron_checkpoint"
    text_tracker = os.path.join(ckpt, CHECKPOINT_TRACKERS[1])
    if not megatron_export.is_megatron(ckpt):
        raise ConvertError(f"{key}: {ckpt} is not a Megatron-Bridge checkpoint (no {' or '.join(CHECKPOINT_TRACKERS)}"
                           "); give the checkpoint.save dir of a pretrain/sft job or an hf-to-megatron output_dir")
    found = sorted(glob.glob(os.path.join(ckpt, "iter_[0-9]*")))
    if os.path.isfile(text_tracker):
        with open(text_tracker, encoding="utf-8") as f:
            named = f.read().strip()
        found = [os.path.join(ckpt, f"iter_{int(named):07d}")] if named.isdigit() else []
    if not found or not os.path.isfile(os.path.join(found[-1], "run_config.yaml")):
        raise ConvertError(f"{key}: {ckpt}'s tracker names no iteration dir with a run_config.yaml "
                           f"({found[-1] if found else 'no iter_NNNNNNN/'}); give a complete checkpoint")
    return found[-1]


def hf_shape(config: dict) -> dict:
    """A Hugging Face config.json in Megatron names, the layer patterns spelled M * E - whichever way it is saved."""
    shape = {ours: config[hf] for hf, ours in HF_KEYS.items() if config.get(hf) is not None}
    mtp = "mtp_hybrid_override_pattern"
    for ours, pattern, blocks in (("hybrid_layer_pattern", "hybrid_override_pattern", "layers_block_type"),
                                  (mtp, mtp, "mtp_layers_block_type")):
        if config.get(pattern) is None and isinstance(config.get(blocks), list):
            shape[ours] = "".join(BLOCKS.get(str(b), "?") for b in config[blocks])
    if "num_layers" not in shape and "hybrid_layer_pattern" in shape:
        shape["num_layers"] = len(shape["hybrid_layer_pattern"])
    shape.setdefault("mtp_num_layers", 0)
    return shape


def megatron_shape(model: dict) -> dict:
    """A run_config.yaml `model:` section, its pattern without pipeline splits and its MTP part split off."""
    shape = {k: model.get(k) for k in MUST_MATCH if model.get(k) is not None}
    pattern = model.get("hybrid_layer_pattern") or model.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        main, *mtp = pattern.replace("|", "").split("/")
        shape["hybrid_layer_pattern"] = main
        if mtp and mtp[0]:
            shape["mtp_hybrid_override_pattern"] = mtp[0]
    shape["mtp_num_layers"] = shape.get("mtp_num_layers") or 0
    if not shape["mtp_num_layers"]:
        shape.pop("mtp_hybrid_override_pattern", None)
    return shape


def compare(iter_dir: str, reference: dict, where: str) -> None:
    """Refuse a checkpoint whose run_config.yaml disagrees with the Hugging Face config (from `where`)."""
    file = os.path.join(iter_dir, "run_config.yaml")
    try:
        with open(file, encoding="utf-8") as f:
            model = (yaml.safe_load(f) or {}).get("model") or {}
    except (OSError, yaml.YAMLError, AttributeError) as e:
        raise ConvertError(f"megatron_checkpoint: {file} is not a readable run_config.yaml ({str(e).splitlines()[0]})"
                           "; give a complete Megatron-Bridge checkpoint") from None
    ours, theirs = megatron_shape(model), hf_shape(reference)
    differ = [f"{k} {ours[k]!r} vs {theirs[k]!r}" for k in MUST_MATCH
              if k in ours and k in theirs and ours[k] != theirs[k]]
    if differ:
        raise ConvertError(f"megatron_checkpoint: {file} holds another model than the Hugging Face config {where}: "
                           f"{'; '.join(differ[:4])}; give the hf_model this checkpoint was made from")


def check_data(parity: dict) -> None:
    """parity.data parses and holds text enough for parity.tokens (a token covers a byte at least)."""
    from ..quantization import calibration

    need, size = parity["tokens"], 0
    try:
        for text in calibration.texts(parity["data"]):
            size += len(text.encode()) + 1
            if size >= need:
                return
    except DataPrepError as e:
        raise ConvertError(str(e).replace("calibration.path", "parity.data", 1)) from None
    raise ConvertError(f"parity.data: {parity['data']} holds at most {size} tokens, fewer than parity.tokens "
                       f"{need}; add text or lower parity.tokens")


def resolve_reference(s: dict) -> tuple[str | None, dict | None, tuple | None]:
    """megatron-to-hf's Hugging Face reference: (path or hub id, its config when local, the training job's
    (config, code dir) when the reference must be written from it)."""
    ckpt = s["megatron_checkpoint"]
    if s["hf_model"]:
        local = is_local(s["hf_model"])
        return s["hf_model"], hf_dir_config(s["hf_model"], "hf_model") if local else None, None
    if saved := megatron_export.imported_reference(ckpt):
        return saved, hf_dir_config(saved, "megatron_checkpoint", f" (its {REFERENCE}/)"), None
    train, code_dir = megatron_export.training_config(ckpt, "megatron_checkpoint")
    named = (train.get("recipe") or {}).get("hf_model")
    if named:
        local = os.path.join(code_dir, os.path.expanduser(named))
        return (local, hf_dir_config(local, "megatron_checkpoint", " (its job's recipe.hf_model)"), None) \
            if os.path.isdir(local) else (named, None, None)
    return None, hf_config(train.get("model") or {}), (train, code_dir)


def precheck(s: dict) -> dict:
    """Every input check that needs no torch, transformers or Megatron; what the conversion then works from."""
    out = s["output_dir"]
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ConvertError(f"output_dir: {out} exists and is not an empty directory; choose a new output_dir")
    check_data(s["parity"])
    plan = {"reference": s["hf_model"], "train": None, "note": None}
    if s["direction"] == "hf-to-megatron":
        if not s["hf_model"]:
            raise ConvertError("hf_model is null; give the Hugging Face checkpoint to import (a dir or hub id)")
        if s["make_checkpoint"]:
            if not s["tokenizer"] or not os.path.isfile(s["tokenizer"]):
                raise ConvertError(f"tokenizer: {s['tokenizer']} is not a tokenizer.json file; make_checkpoint "
                                   "needs one")
        elif is_local(s["hf_model"]):
            hf_dir_config(s["hf_model"], "hf_model")
        return plan
    if not s["megatron_checkpoint"]:
        raise ConvertError("megatron_checkpoint is null; give the Megatron-Bridge checkpoint to export")
    iter_dir = iteration_dir(s["megatron_checkpoint"])
    plan["reference"], config, plan["train"] = resolve_reference(s)
    if config is None:
        plan["note"] = f"{plan['reference']} is a hub id: Megatron-Bridge's load checks the checkpoint's shape"
    else:
        compare(iter_dir, config, f"({plan['reference'] or 'from its training job'})")
    return plan
