"""Typed schema of the stage configs: unknown keys and wrong types are errors with a did-you-mean.

A schema is a nested dict: section -> {key: type}. Types are int, float, str, bool, a list type
(``list[str]``, ``list[int]``), ``dict`` (a free-form str -> str table), a nested schema dict, ``object``
(any value) or a tuple of types (any of them). Every leaf may be null. The training sections
``model``/``train``/... are Megatron-Bridge's ConfigContainer sections, derived from its recorded API.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from . import megatron_api
from .nemo_rl_api import TEACHER_ROLES
from .findings import Report
from .forms import ENV, INT64, PORT, Count, EnvTable, Text

Schema = dict[str, Any]




class ImagesTable:
    """A profile's overrides of the image kinds' pins and build settings: {kind: {key: value}} (a site that
    mirrors the base images); checked against CONTAINER's types."""

    KEYS = ("base", "args", "platform", "registry", "storage_driver", "storage_root", "isolation")
    what = (f"a table per image kind (training, rl, data) of {', '.join(KEYS)}")

    def __call__(self, value: object) -> bool:
        return isinstance(value, dict) and all(
            kind in ("training", "rl", "data") and isinstance(keys, dict)
            and all(k in self.KEYS and matches(v, CONTAINER[k]) for k, v in keys.items())
            for kind, keys in value.items())


IMAGES = ImagesTable()

# What the machines are, as a profile describes them (the `cluster` section): validation checks the
# job's shape (run.nodes x run.gpus_per_node) against it.
CLUSTER: Schema = {"gpu": str, "gpus_per_node": Count(0), "nvlink_domain_size": Count(1),
                   "node_mtbf_hours": (int, float)}  # a node's mean time between failures: the long-run plan's


# Our own keys of the `dataset` section: the runtime turns them into Megatron-Bridge's dataset config.
DATASET_KEYS: Schema = {
    "blend_path": str,  # blend.json written by `ultra3 data prep pretrain` (MB's per_split_data_args_path)
    "packed_dir": str,  # packed Parquet written by `ultra3 data prep sft`
    "pack_size": int,  # tokens per pack (the SFT sequence length)
}

# Megatron-Bridge's ConfigContainer sections from the record of its released API (ultra3.megatron_api): any
# real key is accepted with its type. `dataset` takes the pretraining and the SFT dataset classes' keys.
_MB = megatron_api.container_sections()

TRAINING: Schema = {
    "run": None,  # the executor's keys (executors.base.Executor.keys), checked by the caller
    "recipe": {"hf_model": str, "hf_revision": str, "pretrained_checkpoint": str, "allow_random_init": bool},
    "fork": str,  # RUN[@ITERATION]: start from that run's checkpoint (ultra3.fork)
    "mixed_precision": str,
    # Transformer Engine NVFP4 knobs (exported as NVTE_NVFP4_* env vars) and the module paths kept in BF16
    # under NVFP4 (Megatron-Core quant_recipe globs): docs/precision.md
    "precision": {
        "random_hadamard_transform": bool,
        "stochastic_rounding": bool,
        "weight_2d_blocks": bool,
        "bf16_modules": list[str],
    },
    **{k: v for k, v in _MB.items() if k not in ("peft", "optimizer_config_override_provider")},
    "dataset": {**_MB["dataset"], **megatron_api.section_schema("GPTSFTDatasetConfig"), **DATASET_KEYS},
    "env_vars": dict,
}

CONFIG_NAME = Text(r"[A-Za-z0-9][A-Za-z0-9._-]*", "a config name such as phase2")
_BLEND = {"blend_path": str, "data_config": CONFIG_NAME}  # a blend.json, else the newest of that data prep config
# Pretraining's own: the blend's data prep config, a second blend mixed in (the long-context phase's), and the
# quality phase the run switches to at a token count (ultra3.validation.phases)
PRETRAINING: Schema = {
    **TRAINING,
    "recipe": {**TRAINING["recipe"], "start_from": CONFIG_NAME},  # the pretrain config whose checkpoint it starts from
    "dataset": {**TRAINING["dataset"], "data_config": CONFIG_NAME, "mix": {**_BLEND, "share": float}},
    "phase2": {**_BLEND, "start_tokens": (int, float)},
}

# One dataset of a data-prep blend: a local JSONL (.gz/.zst), Parquet, a glob of those, or hf://org/name.
_DATASET: Schema = {"name": str, "path": str, "weight": float, "split": str, "subset": str, "revision": str}

_DATA_PREP: Schema = {
    "run": None,
    "tokenizer": str,  # a Hugging Face tokenizer name or a local path
    "output_dir": str,
    "num_shards": Count(1),
    "sample": Count(1),  # process only the first N documents, into <output_dir>/sample-N
    "force": bool,
    "strict": bool,  # bad records are errors instead of counted and skipped
    "max_bad_fraction": float,  # more bad records than this share of a dataset (or no tokens at all) fails the run
    "max_record_bytes": Count(1),  # a longer line or text is a bad record (too_long), never held whole
    "workers": Count(1),  # tasks at a time (null: all CPUs)
    "backend": Text(r"auto|processes|ray", "auto, processes or ray"),  # where the tasks run
    "hf_cache_dir": str,  # where hf:// datasets are downloaded first (shared storage)
    "progress_interval": float,  # seconds between progress lines (> 0: validation/data_prep.py)
    "object_store_mb": Count(80),  # MiB of the embedded Ray's object store (backend: ray); Ray takes no less than 75
}

DATA_PREP_PRETRAIN: Schema = {
    **_DATA_PREP,
    "datasets": [{**_DATASET, "text_field": Text(r".+", "a column name (not empty)")}],
    "text_field": Text(r".+", "a column name (not empty)"),  # the default of the datasets' text_field
    "cpus_per_task": Count(1),  # tokenizer threads per shard task
    "encoder": Text(r"auto|gigatoken|tokenizers", "auto, gigatoken or tokenizers"),  # what computes the token ids
    "verify": Text(r"size|checksum", "size or checksum"),  # how finished shards are checked before reuse
    "valid_shards": Count(0),
    "test_shards": Count(0),
    "eod_token": str,
}

DATA_PREP_SFT: Schema = {
    **_DATA_PREP,
    "datasets": [{**_DATASET, "messages_field": Text(r".+", "a column name (not empty)")}],
    "chat_template": str,  # a shipped template name (nemotron3) or a .jinja path
    "pack_size": Count(2),
    "pad_seq_to_mult": Count(1),
    "truncate": bool,
    "valid_ratio": float,
    "test_ratio": float,
    "seed": Count(0),  # shuffles the order of the packs, nothing else
    "row_group_size": Count(1),  # packs per Parquet row group (null: about 64 MiB)
}

# The RL blends: no tokenizer and no shards (one file per blend, a Ray task each).
_PLACEHOLDER_SOURCE: Schema = {"path": str, "split": str, "revision": str}  # a local path or hf://org/name
DATA_PREP_RL: Schema = {
    **{k: v for k, v in _DATA_PREP.items() if k not in ("tokenizer", "num_shards")},
    "source": str,  # hf://nvidia/Nemotron-RL-Ultra-Training-Blends or a local directory of <blend>.jsonl
    "revision": str,
    "blends": list[str],
    "val_rows": Count(1),  # the last rows of each blend held out as validation
    "placeholders": {"dapo": _PLACEHOLDER_SOURCE, "skywork": _PLACEHOLDER_SOURCE},  # unset: their rows dropped
}

# an image reference podman pulls (registry/name:tag@digest) or a local one (localhost/name:tag)
IMAGE_REF = Text(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", "an image reference such as nvcr.io/nvidia/nemo:26.04.01")

CONTAINER: Schema = {
    "run": None,
    "kind": Text(r"training|rl|data", "training, rl or data"),
    "base": IMAGE_REF,
    "containerfile": Text(r"[A-Za-z0-9._-]+", "a Containerfile's name, beside the config file"),
    "args": ENV,  # the Containerfile's build args: ARG names
    "platform": Text(r"auto|linux/(amd64|arm64)", "auto, linux/amd64 or linux/arm64"),
    "cache_dir": Text(r"[A-Za-z0-9_./:@+=-]*", "a directory of letters, digits and '_./:@+=-' (its images go into "
                                              "the stages' batch scripts unquoted)"),
    "registry": Text(r"[A-Za-z0-9][A-Za-z0-9._/:-]*", "a registry and namespace such as registry.example.com/team"),
    "storage_driver": Text(r"overlay|vfs|btrfs|zfs", "overlay, vfs, btrfs or zfs"),
    "storage_root": str,
    "isolation": Text(r"chroot|oci|rootless", "chroot, oci or rootless"),
    "force": bool,
}

_LAYOUT: Schema = {k: int for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                    "expert_model_parallel_size")}

QUANTIZE: Schema = {
    "run": None,
    "bf16_checkpoint": str,  # the BF16 Hugging Face checkpoint: a directory or a hub id
    "make_checkpoint": bool,  # build a seeded random bf16_checkpoint of `model` first (the tiny flow)
    "tokenizer": str,  # tokenizer.json of a made checkpoint
    "modelopt_recipe": str,  # a ModelOpt recipe shipped in modelopt_recipes/ (no .yaml) or a recipe YAML path
    "output_dir": str,
    "force": bool,
    "backend": str,  # hf (one process, any device) | megatron (Megatron-Bridge on the torchrun ranks)
    "device": str,  # hf backend: auto | cpu | cuda
    "seed": int,
    "calibration": {"path": str, "samples": int, "held_out": int, "seq_length": int, "batch_size": int},
    "model": _MB["model"],  # architecture and the calibration layout (Megatron-Bridge names)
    "export": _LAYOUT,  # megatron backend: the export layout
    "megatron": {"examples_dir": str},
}


def type_name(t: Any) -> str:
    if isinstance(t, dict):
        return "a table"
    if isinstance(t, list):
        return "a list of tables"
    if isinstance(t, tuple):
        return " or ".join(type_name(x) for x in t)
    if isinstance(t, (Text, Count, ImagesTable)):
        return t.what
    if isinstance(t, EnvTable):
        return "a table of environment variables (string values)"
    if getattr(t, "__origin__", None) is list and isinstance(t.__args__[0], Text):
        return f"a list, each {t.__args__[0].what}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false",
            dict: "a table of strings", list: "a list"}.get(t, f"a {t}".replace("list[", "list of ").rstrip("]"))


def matches(value: Any, t: Any) -> bool:
    if value is None or t is object:
        return True
    if isinstance(t, tuple):
        return any(matches(value, x) for x in t)
    if t is bool:
        return isinstance(value, bool)
    if t is int:  # what Megatron and Slurm can hold
        return isinstance(value, int) and not isinstance(value, bool) and -INT64 - 1 <= value <= INT64
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if t is str:
        return isinstance(value, str)
    if isinstance(t, (Text, EnvTable, Count, ImagesTable)):
        return t(value)
    if t is dict:
        return isinstance(value, dict) and all(isinstance(v, (str, int, float, bool)) for v in value.values())
    if t is list:
        return isinstance(value, list)
    if getattr(t, "__origin__", None) is list:
        (item,) = t.__args__
        return isinstance(value, list) and all(matches(v, item) for v in value)
    raise TypeError(f"unsupported schema type {t!r}")


def suggest(key: str, choices: list[str]) -> str:
    return did_you_mean(key, choices) or f"known keys: {', '.join(sorted(choices))}"


def did_you_mean(word: str, choices: list[str]) -> str:
    """`did you mean 'x'?` for the choice closest to `word`; "" when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def has_key(schema: Schema, dotted: str) -> bool:
    """Whether a dotted key names a leaf of `schema`."""
    node: Any = schema
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return not isinstance(node, dict)


def check(tree: dict, schema: Schema, report: Report, origin: dict[str, str], prefix: str = "") -> None:
    """Report every unknown key and wrongly typed value of `tree`; `origin` maps a dotted key to
    where it was set, so each error names the file or the command line to fix."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        where = where_from(path, origin)
        if key not in schema:
            report.error(path, f"unknown key{where}; {suggest(key, list(schema))}")
            continue
        t = schema[key]
        if isinstance(t, dict):
            if isinstance(value, dict):
                check(value, t, report, origin, f"{path}.")
            else:  # a null section would silently drop every default in it
                report.error(path, f"must be a table of keys, got {value!r}{where}")
        elif isinstance(t, list):  # a list of tables, each checked against t[0]
            if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
                report.error(path, f"must be a list of tables, got {value!r}{where}")
                continue
            for i, item in enumerate(value):
                check(item, t[0], report, origin, f"{path}[{i}].")
        elif isinstance(t, EnvTable) and isinstance(value, dict) and t.bad_names(value):
            for name in t.bad_names(value):
                key = f"{path}.{name}"
                report.error(key, f"not an environment variable name{where_from(key, origin)}; "
                                  "use letters, digits and '_', not starting with a digit")
        elif not matches(value, t):
            report.error(path, f"must be {_bounded(value, t) or type_name(t)}, got {value!r}{where}")
        else:  # a free-form value (NeMo RL's keys, env values, lists): its numbers still have to be numbers
            for inner, number in _numbers(value, path):
                report.error(inner, f"must be {_bounded(number, object)}, got {number!r}{where_from(inner, origin)}")


def _numbers(value: Any, path: str) -> list[tuple[str, int | float]]:
    """The NaNs, infinities and integers past 64 bits anywhere in a value, with their dotted keys."""
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _numbers(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _numbers(v, f"{path}[{i}]")]
    return [(path, value)] if _bounded(value, object) else []


def _bounded(value: Any, t: Any) -> str:
    """What a number of the right type is still missing: finiteness, the 64-bit range."""
    if isinstance(value, float) and not math.isfinite(value) and matches(1.0, t):
        return "a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64 and matches(1, t):
        return "an integer within 64 bits"
    return ""


def where_from(path: str, origin: dict[str, str]) -> str:
    path = path.split("[", 1)[0]  # a list item came from where its list was set
    # a table's own key has no origin; the first of its leaves tells where it came from
    src = origin.get(path) or next((v for k, v in origin.items() if k.startswith(path + ".")), None)
    return f" (set in {src})" if src else ""


# The RL stages (rl rlvr | teacher | mopd): our keys around NeMo RL's own config. `nemo_rl` holds NeMo RL's
# keys, in its own shape: checked against the record of its Ultra YAMLs (ultra3.nemo_rl_api), merged into the
# YAML named by `recipe` inside the job.
RL: Schema = {
    "run": None,
    "recipe": str,  # NeMo RL's config: examples/nemo_gym/nemotron-3-ultra/<recipe>.yaml at the pinned commit
    "nemo_rl_dir": str,  # the NeMo RL checkout in the job's container
    "experiment": str,  # the run's name: its checkpoints; a later job of the same experiment resumes them
    "policy": str,  # the starting policy: a Hugging Face checkpoint (a Megatron one is exported first)
    "data": {"dir": str, "blend": str},  # `ultra3 data prep rl`'s output, and which of its blends
    "layout": {"train_nodes": int, "generation_nodes": int, "gym_nodes": int, "nodes_per_teacher": int,
               "segment_nodes": int, "colocated": bool},
    "teachers": {role: str for role in TEACHER_ROLES},
    "judges": {"genrm_model": str, "genrm_url": str, "nl2bash_model": str, "nl2bash_url": str,
               "safety_model": str},
    "mtp": {"enabled": bool, "num_speculative": int, "max_num_batched": int},
    "output_dir": str,  # the final policy, exported to Hugging Face: the stage's artifact
    "max_steps": int,
    "sif_dir": str,  # the SWE teacher's per-instance apptainer images
    "wandb": {"project": str, "entity": str},  # logging is on when WANDB_API_KEY reaches the job
    "sandbox": {"image": str, "command": str, "port": PORT},  # NeMo Skills' sandbox, a sidecar on every node
    "check_only": bool,  # stop after the cluster preflight (Ray groups, GPUs, shared dir): exit 0
    "nemo_rl": object,
    "nemo_rl_add": object,  # keys NeMo RL takes that its YAML lacks (Hydra's ++): merged unchecked
}
