"""A tiny Nemotron-H BF16 checkpoint made on this machine, deterministically (seeded): Mamba-2, attention and
LatentMoE with a shared expert, shaped by the config's `model.*` keys (Megatron names), plus stand-in MTP
weights and the tokenizer, in the Hugging Face layout the real checkpoint has. Nothing is downloaded."""

from __future__ import annotations

import os
import shutil

MTP_PREFIX = "mtp."


def hf_config(model: dict):
    """A transformers NemotronHConfig from Megatron-Bridge model keys: the config.json the training runtime
    builds the same model from."""
    from transformers import NemotronHConfig

    from ..training.hf_config import hf_config as config_json

    return NemotronHConfig(**{"chunk_size": 64, **config_json(model), "dtype": "bfloat16"})


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
