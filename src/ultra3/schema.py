"""Typed schema of the stage configs: unknown keys and wrong types are errors with a did-you-mean.

A schema is a nested dict: section -> {key: type}. Types are int, float, str, bool, a list type
(``list[str]``, ``list[int]``), ``dict`` (a free-form str -> str table) or a nested schema dict.
Every leaf may be null. Keys under ``model``/``train``/... are Megatron-Bridge ConfigContainer names.
"""

from __future__ import annotations

import difflib
from typing import Any

from .findings import Report

Schema = dict[str, Any]

# The job's shape and executor settings: the `run` section of every stage, fed by the stage config,
# the env.toml profile and the command line. The tuple lists which executors read the key.
RUN_KEYS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "nodes": (int, ("local", "slurm")),
    "gpus_per_node": (int, ("local", "slurm")),
    "cpus_per_task": (int, ("slurm",)),
    "env": (dict, ("local", "slurm", "ray")),
    "setup": (list[str], ("local", "slurm")),
    "time": (str, ("slurm",)),
    "container_image": (str, ("slurm",)),
    "mounts": (list[str], ("slurm",)),
    "account": (str, ("slurm",)),
    "partition": (str, ("slurm",)),
    "qos": (str, ("slurm",)),
    "mem": (str, ("slurm",)),
    "exclusive": (bool, ("slurm",)),
    "constraint": (str, ("slurm",)),
    "reservation": (str, ("slurm",)),
    "job_name_prefix": (str, ("slurm",)),
    "host": (str, ("slurm",)),
    "user": (str, ("slurm",)),
    "port": (int, ("slurm",)),
    "identity": (str, ("slurm",)),
    "job_dir": (str, ("slurm",)),
    "address": (str, ("ray",)),  # an existing Ray cluster's dashboard (Jobs API), e.g. http://head:8265
}
EXECUTORS = ("local", "slurm", "ray")

# What the machines are, as a profile describes them (the `cluster` section): validation checks the
# job's shape (run.nodes x run.gpus_per_node) against it.
CLUSTER: Schema = {"gpu": str, "gpus_per_node": int, "nvlink_domain_size": int}


def run_schema(executor: str) -> Schema:
    return {k: t for k, (t, used_by) in RUN_KEYS.items() if executor in used_by}


_PARALLEL = {
    "tensor_model_parallel_size": int,
    "pipeline_model_parallel_size": int,
    "virtual_pipeline_model_parallel_size": int,
    "pipeline_model_parallel_layout": str,
    "context_parallel_size": int,
    "expert_model_parallel_size": int,
    "expert_tensor_parallel_size": int,
    "sequence_parallel": bool,
}

MODEL: Schema = {
    **_PARALLEL,
    "num_layers": int,
    "hybrid_layer_pattern": str,
    "mtp_hybrid_override_pattern": str,
    "hidden_size": int,
    "ffn_hidden_size": int,
    "num_attention_heads": int,
    "num_query_groups": int,
    "kv_channels": int,
    "mamba_num_heads": int,
    "mamba_head_dim": int,
    "mamba_state_dim": int,
    "mamba_num_groups": int,
    "num_moe_experts": int,
    "moe_router_topk": int,
    "moe_router_topk_scaling_factor": float,
    "moe_ffn_hidden_size": int,
    "moe_shared_expert_intermediate_size": int,
    "moe_latent_size": int,
    "moe_token_dispatcher_type": str,
    "moe_flex_dispatcher_backend": str,
    "moe_aux_loss_coeff": float,
    "moe_router_padding_for_quantization": bool,
    "mtp_num_layers": int,
    "mtp_loss_scaling_factor": float,
    "vocab_size": int,
    "seq_length": int,
    "init_method_std": float,
    "recompute_granularity": str,
    "recompute_method": str,
    "recompute_num_layers": int,
    "recompute_modules": list[str],
    "first_last_layers_bf16": bool,
    "num_layers_at_start_in_bf16": int,
    "num_layers_at_end_in_bf16": int,
    "fp8": str,
    "fp8_recipe": str,
    "fp4_param_gather": bool,
    "cuda_graph_impl": str,
    "enable_cuda_graph": bool,
    "mamba_chunk_size": int,
    "share_embeddings_and_output_weights": bool,
    "mtp_use_repeated_layer": bool,
}

TRAINING: Schema = {
    "run": None,  # filled per executor by the caller
    "recipe": {"hf_model": str, "hf_revision": str, "pretrained_checkpoint": str},
    "mixed_precision": str,
    "model": MODEL,
    "ddp": {
        "grad_reduce_in_fp32": bool,
        "overlap_grad_reduce": bool,
        "overlap_param_gather": bool,
        "use_distributed_optimizer": bool,
        "use_megatron_fsdp": bool,
    },
    "train": {
        "train_iters": int,
        "train_samples": int,
        "global_batch_size": int,
        "micro_batch_size": int,
        "manual_gc": bool,
        "exit_duration_in_mins": int,
    },
    "validation": {"eval_interval": int, "eval_iters": int},
    "optimizer": {
        "optimizer": str,
        "lr": float,
        "min_lr": float,
        "weight_decay": float,
        "adam_beta1": float,
        "adam_beta2": float,
        "adam_eps": float,
        "clip_grad": float,
        "use_distributed_optimizer": bool,
    },
    "scheduler": {
        "lr_decay_style": str,
        "lr_wsd_decay_style": str,
        "lr_warmup_iters": int,
        "lr_warmup_fraction": float,
        "lr_decay_iters": int,
        "lr_wsd_decay_iters": int,
    },
    "dataset": {
        "blend_path": str,
        "packed_dir": str,
        "pack_size": int,
        "seq_length": int,
        "mock": bool,
        "num_workers": int,
    },
    "checkpoint": {
        "save": str,
        "load": str,
        "save_interval": int,
        "async_save": bool,
    },
    "logger": {
        "log_interval": int,
        "tensorboard_dir": str,
        "wandb_project": str,
        "wandb_entity": str,
        "wandb_exp_name": str,
    },
    "rng": {"seed": int},
    "dist": {"distributed_timeout_minutes": int, "use_megatron_fsdp": bool},
}

# One dataset of a data-prep blend: a local JSONL (.gz/.zst), Parquet, a glob of those, or hf://org/name.
_DATASET: Schema = {"name": str, "path": str, "weight": float, "split": str, "subset": str, "revision": str}

_DATA_PREP: Schema = {
    "run": None,
    "tokenizer": str,  # a Hugging Face tokenizer name or a local path
    "output_dir": str,
    "num_shards": int,
    "sample": int,  # process only the first N documents, into <output_dir>/sample-N
    "force": bool,
    "strict": bool,  # bad records are errors instead of counted and skipped
    "workers": int,  # Ray tasks at a time (default: all CPUs)
    "hf_cache_dir": str,  # where hf:// datasets are downloaded first (shared storage)
    "progress_interval": float,  # seconds between progress lines
    "object_store_mb": int,  # the embedded Ray's object store
}

DATA_PREP_PRETRAIN: Schema = {
    **_DATA_PREP,
    "datasets": [{**_DATASET, "text_field": str}],
    "text_field": str,  # the default of the datasets' text_field
    "cpus_per_task": int,  # tokenizer threads per shard task
    "encoder": str,  # what computes the token ids (same bytes either way): auto | gigatoken | tokenizers
    "verify": str,  # how finished shards are checked before reuse: size | checksum
    "valid_shards": int,
    "test_shards": int,
    "eod_token": str,
}

DATA_PREP_SFT: Schema = {
    **_DATA_PREP,
    "datasets": [{**_DATASET, "messages_field": str}],
    "chat_template": str,  # a shipped template name (nemotron3) or a .jinja path
    "pack_size": int,
    "pad_seq_to_mult": int,
    "truncate": bool,
    "valid_ratio": float,
    "test_ratio": float,
    "seed": int,  # shuffles the order of the packs, nothing else
    "row_group_size": int,  # packs per Parquet row group (default: about 64 MiB)
}


def type_name(t: Any) -> str:
    if isinstance(t, dict):
        return "a table"
    if isinstance(t, list):
        return "a list of tables"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false",
            dict: "a table of strings", list: "a list"}.get(t, f"a {t}".replace("list[", "list of ").rstrip("]"))


def matches(value: Any, t: Any) -> bool:
    if value is None:
        return True
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is str:
        return isinstance(value, str)
    if t is dict:
        return isinstance(value, dict) and all(isinstance(v, (str, int, float, bool)) for v in value.values())
    if t is list:
        return isinstance(value, list)
    if getattr(t, "__origin__", None) is list:
        (item,) = t.__args__
        return isinstance(value, list) and all(matches(v, item) for v in value)
    raise TypeError(f"unsupported schema type {t!r}")


def suggest(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(choices))}"


def check(tree: dict, schema: Schema, report: Report, origin: dict[str, str], prefix: str = "") -> None:
    """Report every unknown key and wrongly typed value of `tree`; `origin` maps a dotted key to
    where it was set, so each error names the file or the command line to fix."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        where = _where(path, origin)
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
        elif not matches(value, t):
            report.error(path, f"must be {type_name(t)}, got {value!r}{where}")


def _where(path: str, origin: dict[str, str]) -> str:
    path = path.split("[", 1)[0]  # a list item came from where its list was set
    # a table's own key has no origin; the first of its leaves tells where it came from
    src = origin.get(path) or next((v for k, v in origin.items() if k.startswith(path + ".")), None)
    return f" (set in {src})" if src else ""
