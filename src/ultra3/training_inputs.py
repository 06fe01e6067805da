"""The model a training job starts from: when `recipe.hf_model` is a local directory with config.json,
our model keys must agree with it (through Megatron-Bridge's own HF -> Megatron key mapping). Where its
checkpoint comes from is the stage's input (stage.Input, resolved by ultra3.artifacts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import megatron_api
from .findings import Report

# HF keys the NemotronH bridge copies under the same name, besides its CONFIG_MAPPING
SAME_NAME = ("mtp_hybrid_override_pattern", "moe_latent_size")


def check_hf_config(cfg: dict, report: Report) -> None:
    """Our model keys against the local HF config.json they will meet at run time."""
    hf_model = (cfg.get("recipe") or {}).get("hf_model")
    path = Path(str(hf_model)).expanduser() / "config.json" if hf_model else None
    if path is None or not path.is_file():
        return
    try:
        hf = json.loads(path.read_text())
    except ValueError as e:
        report.error("recipe.hf_model", f"{path} is not JSON ({e})")
        return
    model = cfg.get("model") or {}
    theirs = hf_model_keys(hf)
    for key, value in theirs.items():
        ours = model.get(key)
        if ours is not None and ours != value:
            report.error(f"model.{key}", f"{ours!r} disagrees with {path} ({value!r}); remove it from the config "
                                         f"or set it to {value!r}")
    report.note("recipe.hf_model", f"model keys checked against {path} ({len(theirs)} keys)")


def hf_model_keys(hf: dict) -> dict[str, Any]:
    """Our model keys of an HF NemotronH config.json, by Megatron-Bridge's mapping (the pattern from
    `hybrid_override_pattern` or transformers' `layers_block_type` list)."""
    hf = dict(hf)
    # transformers 5.x names Mamba layers linear_attention and attention layers full_attention
    symbols = {"mamba": "M", "linear_attention": "M", "moe": "E", "attention": "*", "full_attention": "*", "mlp": "-"}
    for key, pattern in (("layers_block_type", "hybrid_override_pattern"),
                         ("mtp_layers_block_type", "mtp_hybrid_override_pattern")):
        if isinstance(hf.get(key), list) and pattern not in hf:
            hf[pattern] = "".join(symbols.get(t, "?") for t in hf[key])
    if isinstance(hf.get("hybrid_override_pattern"), str):
        hf.setdefault("num_hidden_layers", len(hf["hybrid_override_pattern"]))
    out = {ours: hf[theirs] for theirs, ours in megatron_api.hf_config_mapping() if theirs in hf}
    out.update({key: hf[key] for key in SAME_NAME if key in hf})
    return out
