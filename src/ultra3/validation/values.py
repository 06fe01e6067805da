"""Single values Megatron would refuse at start-up, refused here first: sizes and counts that must be positive,
and a mixed-precision preset that must exist in the recorded Megatron-Bridge API.
(Types, finiteness and the 64-bit range are the schema's.)"""

from __future__ import annotations

from ultra3 import megatron_api
from ultra3.dotted import get
from ultra3.schema import suggest

from ..model_math import is_int, number

POSITIVE = tuple(f"model.{k}" for k in (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "vocab_size", "seq_length", "mamba_num_heads", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
    "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_latent_size",
    "moe_shared_expert_intermediate_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size")) + \
    ("train.train_iters", "train.global_batch_size", "train.micro_batch_size")
NON_NEGATIVE = ("model.mtp_num_layers", "optimizer.min_lr", "optimizer.weight_decay", "scheduler.lr_warmup_iters")


def check(cfg: dict, report) -> None:
    for key in POSITIVE:
        value = get(cfg, key)
        if is_int(value) and value <= 0:
            report.error(key, f"{key}={value} must be 1 or more; leave it unset for the recipe's value")
    for key in NON_NEGATIVE:
        value = number(get(cfg, key))
        if value is not None and value < 0:
            report.error(key, f"{key}={get(cfg, key)} must not be negative")
    name = cfg.get("mixed_precision")
    presets = megatron_api.mixed_precision_presets()
    if isinstance(name, str) and name not in presets:
        report.error("mixed_precision", f"'{name}' is no Megatron-Bridge {megatron_api.versions()['megatron-bridge']} "
                                        f"preset; {suggest(name, presets)}")
