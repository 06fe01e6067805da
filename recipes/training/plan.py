"""What the runtime hands Megatron-Bridge 0.6.x, computed from our resolved job config in pure Python (no
Megatron import, so tests check it on any machine against the record of the released API):

* the Ultra recipe function of the stage and the entry point (pretrain / finetune);
* where the model config comes from: a local HF directory, a hub id at a pinned revision, or the HF
  config.json written from our own model keys (the tiny Ultra);
* the dataset: the blend file of `data prep pretrain`, the packed Parquet of `data prep sft`, or mock data;
* the override dotlist for Megatron-Bridge's own override helper: every Megatron-Bridge key of our config,
  plus checkpoint resume, the pretrained checkpoint of SFT and W&B when configured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..contract import CHECKPOINT_TRACKERS, pad_seq_to_mult
from .phases import Phase, current, schedule_overrides
from .resilience import ft_values

ULTRA = "megatron.bridge.recipes.nemotronh.h100.nemotron_3_ultra"
RECIPES = {"pretrain": f"{ULTRA}.nemotron_3_ultra_pretrain_24gpu_h100_bf16_config",
           "sft": f"{ULTRA}.nemotron_3_ultra_sft_192gpu_h100_bf16_openmathinstruct2_packed_config"}
HF_MODEL_ID = f"{ULTRA}.NEMOTRON_3_ULTRA_HF_MODEL_ID"  # the recipe reads it when called
ENTRY_POINTS = {"pretrain": "megatron.bridge.training.pretrain.pretrain",
                "sft": "megatron.bridge.training.finetune.finetune"}
FORWARD_STEP = "megatron.bridge.training.gpt_step.forward_step"
OVERRIDE_HELPER = "megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides"
BLEND_HELPER = "megatron.bridge.recipes.utils.dataset_utils.get_blend_fields_from_data_paths"
GPT_DATASET = "megatron.bridge.training.config.GPTDatasetConfig"
SFT_DATASET = "megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig"
PACKING_SPECS = "megatron.bridge.data.packing.config.PackedSequenceSpecs"

# Our sections that are not Megatron-Bridge's, and our own keys of its `dataset` section
NOT_MB = ("run", "recipe", "job", "cluster", "mixed_precision", "precision", "fork", "phase2")
OWN_DATASET_KEYS = ("blend_path", "packed_dir", "pack_size", "mock", "data_config", "mix")
# the config.json files of a hub model: the recipe needs the model config and the tokenizer, never weights
HF_CONFIG_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.py"]


class TrainingInputError(Exception):
    """The job's config or inputs cannot train: one line on stderr, exit INPUT_ERROR_EXIT (as every runtime)."""


@dataclass
class Build:
    """A Megatron-Bridge config object to construct: `target(**kwargs)`; a kwarg may be a Build too."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    recipe: str  # the Ultra recipe function
    entry: str  # pretrain or finetune
    model_source: str  # "local" (recipe.hf_model is a directory), "hub" or "keys" (config.json from our keys)
    hf_model: str | None
    hf_revision: str | None
    blend_path: str | None  # per_split_data_args_path for the blend helper: the phase's blend
    dataset: Build | None  # replaces the recipe's dataset (SFT)
    overrides: list[str]
    phase: Phase | None = None  # pretraining: the phase this start trains
    mix: tuple[str, float] | None = None  # a blend sampled beside blend_path, and its share (dataset.mix)


def make_plan(cfg: dict) -> Plan:
    stage = cfg["job"]["stage"]
    recipe = cfg.get("recipe") or {}
    hf_model = recipe.get("hf_model")
    source = "keys" if not hf_model else "local" if os.path.isdir(os.path.expanduser(hf_model)) else "hub"
    dataset = cfg.get("dataset") or {}
    values = override_values(cfg)
    phase = current(cfg, values) if stage == "pretrain" else None
    if phase:
        values.update(schedule_overrides(cfg, phase))
    mix = dataset.get("mix") or {}
    return Plan(
        recipe=RECIPES[stage], entry=ENTRY_POINTS[stage], model_source=source,
        hf_model=os.path.expanduser(hf_model) if source == "local" else hf_model,
        hf_revision=recipe.get("hf_revision"),
        blend_path=phase.blend_path if phase else None,
        dataset=sft_dataset(cfg) if stage == "sft" else None,
        overrides=[_override(key, value) for key, value in values.items()],
        phase=phase,
        mix=(mix["blend_path"], float(mix["share"])) if phase and phase.blend_path and mix.get("share") else None,
    )


def sft_dataset(cfg: dict) -> Build:
    """Packed Parquet from `data prep sft` (train/ and valid/ shards), or mock data."""
    dataset, model = cfg.get("dataset") or {}, cfg.get("model") or {}
    seq_length = dataset.get("pack_size") or model.get("seq_length")
    if dataset.get("mock"):  # no blend: Megatron-Core sets its `mock` (not a constructor argument) itself
        return Build(GPT_DATASET, {"seq_length": seq_length, "random_seed": (cfg.get("rng") or {}).get("seed") or 1234,
                                   "reset_attention_mask": False, "reset_position_ids": False, "eod_mask_loss": False,
                                   "num_dataset_builder_threads": 1, "blend": None, "blend_per_split": None,
                                   "split": "1,1,1", "dataloader_type": "single"})
    root = dataset.get("packed_dir")
    if not root:
        raise TrainingInputError("dataset.packed_dir is not set: give the output dir of `ultra3 data prep sft`, or "
                                 "dataset.mock=true")
    tp, cp = model.get("tensor_model_parallel_size") or 1, model.get("context_parallel_size") or 1
    specs = Build(PACKING_SPECS, {
        "packed_sequence_size": seq_length,
        "packed_train_data_path": os.path.join(root, "train"),
        "packed_val_data_path": os.path.join(root, "valid"),
        "packed_metadata_path": os.path.join(root, "packing_metadata.json"),
        "pad_seq_to_mult": pad_seq_to_mult(tp, cp, bool(model.get("sequence_parallel"))),
    })
    return Build(SFT_DATASET, {"seq_length": seq_length, "dataset_root": root, "enable_offline_packing": True,
                               "offline_packing_specs": specs, "do_test": False})


def override_list(cfg: dict) -> list[str]:
    """The dotlist for Megatron-Bridge's override helper."""
    return [_override(key, value) for key, value in override_values(cfg).items()]


def override_values(cfg: dict) -> dict[str, Any]:
    """Dotted Megatron-Bridge key -> value: our Megatron-Bridge keys, then what we derive from the rest."""
    values: dict[str, Any] = {}
    for section, tree in cfg.items():
        if section in NOT_MB or not isinstance(tree, dict):
            continue
        if section == "dataset":
            tree = {k: v for k, v in tree.items() if k not in OWN_DATASET_KEYS}
        values.update(_flatten(tree, f"{section}."))
    values.update(derived(cfg, values))
    return values


def derived(cfg: dict, values: dict[str, Any]) -> dict[str, Any]:
    stage, job = cfg["job"]["stage"], cfg["job"]
    dataset = cfg.get("dataset") or {}
    out: dict[str, Any] = {}
    seq = (cfg.get("model") or {}).get("seq_length")
    if stage == "sft":
        seq = dataset.get("pack_size") or seq
        out["model.seq_length"] = seq
    if seq and "dataset.seq_length" not in values:
        out["dataset.seq_length"] = seq
    if stage == "pretrain" and dataset.get("mock"):
        out["dataset.mock"] = True
    save = values.get("checkpoint.save")
    if save and not values.get("checkpoint.load"):
        out["checkpoint.load"] = save  # resume from the latest checkpoint there (none: start fresh)
    elif "checkpoint.save" in values and not save:
        # nothing saved: no resume from the recipe's default directory, and no async save (it needs a directory)
        out.update({k: v for k, v in (("checkpoint.load", None), ("checkpoint.async_save", False)) if k not in values})
    if stage == "sft" or (cfg.get("recipe") or {}).get("pretrained_checkpoint"):  # pretrain: the long-context phase
        out["checkpoint.pretrained_checkpoint"] = (cfg.get("recipe") or {}).get("pretrained_checkpoint")
    out.update(fork_resumed(cfg, values))
    out.update(ft_values(cfg, values))  # run.fault_tolerance: the ranks run under ft_launcher
    if values.get("logger.wandb_project"):
        out.setdefault("logger.wandb_exp_name", values.get("logger.wandb_exp_name") or job.get("id"))
        out.setdefault("logger.wandb_save_dir", values.get("logger.wandb_save_dir") or f"{job['dir']}/wandb")
    return out


def fork_resumed(cfg: dict, values: dict[str, Any]) -> dict[str, Any]:
    """A forked run (job.fork) loads its source's checkpoint at the fork's iteration once: when its own
    checkpoint.save holds a checkpoint (a later allocation, an in-job restart, the same fork submitted again), it goes
    on from its newest one there, as any run does, instead of starting over from the fork's iteration."""
    save = values.get("checkpoint.save")
    if not cfg["job"].get("fork") or not save or not any(os.path.isfile(os.path.join(save, t))
                                                          for t in CHECKPOINT_TRACKERS):
        return {}
    return {"checkpoint.load": save, "checkpoint.ckpt_step": None}


def _flatten(tree: dict, prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _override(key: str, value: Any) -> str:
    force = "++" if key.startswith("env_vars.") else ""  # the recipe's env_vars table may lack the key
    return f"{force}{key}={_value(value)}"


def _value(value: Any) -> str:
    """A value in Hydra's override grammar: strings always quoted, so '4:00' or 'a b' stay strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
