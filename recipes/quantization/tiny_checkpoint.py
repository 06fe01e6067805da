"""A tiny Nemotron-H BF16 checkpoint made on this machine, deterministically (seeded): Mamba-2, attention and
LatentMoE with a shared expert, shaped by the config's `model.*` keys (Megatron names), plus stand-in MTP
weights and the tokenizer, in the Hugging Face layout the real checkpoint has. Nothing is downloaded."""

from __future__ import annotations

import os
import shutil

MTP_PREFIX = "mtp."


def hf_config(model: dict):
    """A transformers NemotronHConfig from Megatron-Bridge model keys."""
    from transformers import NemotronHConfig

    return NemotronHConfig(
        vocab_size=model["vocab_size"],
        hidden_size=model["hidden_size"],
        hybrid_override_pattern=model["hybrid_layer_pattern"],
        num_attention_heads=model["num_attention_heads"],
        num_key_value_heads=model["num_query_groups"],
        head_dim=model["kv_channels"],
        intermediate_size=model["ffn_hidden_size"],
        mamba_num_heads=model["mamba_num_heads"],
        mamba_head_dim=model["mamba_head_dim"],
        ssm_state_size=model["mamba_state_dim"],
        n_groups=model["mamba_num_groups"],
        n_routed_experts=model["num_moe_experts"],
        num_experts_per_tok=model["moe_router_topk"],
        moe_intermediate_size=model["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=model["moe_shared_expert_intermediate_size"],
        moe_latent_size=model["moe_latent_size"],
        num_nextn_predict_layers=model.get("mtp_num_layers") or 0,
        max_position_embeddings=model["seq_length"],
        chunk_size=64,
        architectures=["NemotronHForCausalLM"],
        dtype="bfloat16",
    )


def mtp_tensors(config, seed: int) -> dict:
    """Stand-ins for the MTP weights (norms and the embedding/hidden projection of each MTP layer): the HF
    model class drops `mtp.*` on load, so these check that the export carries them through."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    h = config.hidden_size
    out = {}
    for i in range(config.num_nextn_predict_layers):
        at = f"{MTP_PREFIX}layers.{i}."
        for norm in ("enorm", "hnorm", "final_layernorm"):
            out[f"{at}{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
        out[f"{at}eh_proj.weight"] = (torch.randn(h, 2 * h, generator=gen) * 0.02).to(torch.bfloat16)
    return out


def make(model: dict, tokenizer_file: str, out: str, seed: int) -> None:
    """Write the checkpoint to `out` (through a staging dir, so a failure leaves nothing)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import NemotronHForCausalLM, PreTrainedTokenizerFast

    config = hf_config(model)
    staging = f"{out}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    torch.manual_seed(seed)
    try:
        NemotronHForCausalLM(config).to(torch.bfloat16).save_pretrained(staging)
        weights = os.path.join(staging, "model.safetensors")
        save_file({**load_file(weights), **mtp_tensors(config, seed)}, weights, metadata={"format": "pt"})
        tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, eos_token="<|endoftext|>",
                                      pad_token="<|pad|>")
        tok.save_pretrained(staging)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
