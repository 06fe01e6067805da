"""The HF `config.json` of a NemotronH model given by our model keys: the Ultra recipe builds its model
from one, so the tiny Ultra goes through the same path as the real model without any hub access."""

from __future__ import annotations

# HF NemotronH key -> our (Megatron-Bridge) model key, as Megatron-Bridge's NemotronH bridge maps them
# (tests/test_training_plan.py checks every pair against the record of the released bridge).
HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "hybrid_override_pattern": "hybrid_layer_pattern",
    "mtp_hybrid_override_pattern": "mtp_hybrid_override_pattern",
    "num_nextn_predict_layers": "mtp_num_layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_query_groups",
    "head_dim": "kv_channels",
    "mamba_num_heads": "mamba_num_heads",
    "mamba_head_dim": "mamba_head_dim",
    "ssm_state_size": "mamba_state_dim",
    "n_groups": "mamba_num_groups",
    "chunk_size": "mamba_chunk_size",
    "n_routed_experts": "num_moe_experts",
    "num_experts_per_tok": "moe_router_topk",
    "routed_scaling_factor": "moe_router_topk_scaling_factor",
    "moe_intermediate_size": "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
    "moe_latent_size": "moe_latent_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "seq_length",
    "initializer_range": "init_method_std",
    "tie_word_embeddings": "share_embeddings_and_output_weights",
}
MTP_PATTERN = "*E"  # one attention and one LatentMoE layer, as in the Ultra checkpoint


def hf_config(model: dict) -> dict:
    """config.json of the model; a model with MTP layers gets the Ultra MTP block unless it names one."""
    model = dict(model)
    if model.get("mtp_num_layers") and not model.get("mtp_hybrid_override_pattern"):
        model["mtp_hybrid_override_pattern"] = MTP_PATTERN
    config = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h"}
    config.update({hf: model[ours] for hf, ours in HF_KEYS.items() if model.get(ours) is not None})
    return config

