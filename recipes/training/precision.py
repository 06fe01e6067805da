"""The job's precision on the Megatron-Bridge ConfigContainer: the mixed-precision preset, the layers and modules kept
in BF16, FP32 gradient reduction.

* NVFP4: Megatron-Bridge's Ultra preset (nemotron_3_ultra_bf16_with_nvfp4_mixed, new in 0.6.2) when the installed
  Megatron-Bridge registers it, else the same composed by hand: bf16_with_nvfp4_mixed plus the last 16 layers in
  BF16. The module kinds the preset cannot reach (precision.bf16_modules: Mamba-2 out_proj, attention, latent
  projections, MTP) go through Megatron-Core's per-module quantization recipe, model.quant_recipe: one BF16 config,
  one glob matcher per pattern.
* Our model/ddp keys that are MixedPrecisionConfig fields too go into it: its setup() copies its own values over the
  model and DDP configs, so a value set anywhere else would not survive.
* Transformer Engine reads the NVFP4 knobs from NVTE_NVFP4_* env vars when it is imported: the launcher exports them
  with the job (run.env), here they are only checked.

decide() is pure Python (tests check it on any machine against the recorded APIs); apply_precision() imports
Megatron-Bridge and Megatron-Core lazily and applies the decision.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..contract import trains_nvfp4

ULTRA_PRESET = "nemotron_3_ultra_bf16_with_nvfp4_mixed"
NVFP4_PRESET = "bf16_with_nvfp4_mixed"
# What Megatron-Bridge 0.6.2's Ultra preset sets on top of bf16_with_nvfp4_mixed ("last 15% of layers in BF16")
ULTRA_LAYERS = {"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 16}
MODEL_FIELDS = ("first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
                "fp8", "fp8_recipe")
DDP_FIELDS = ("grad_reduce_in_fp32", "fp4_param_gather")  # the preset's setup() copies its own over ddp.*
TE_ENV_PREFIX = "NVTE_NVFP4_"
# Megatron-Core's per-module recipe: a TEQuantizationParams config whose training recipe names no FP8/FP4 recipe
# runs its modules in BF16, also inside a layer's NVFP4 autocast.
BF16_CONFIG = {"bf16": {"transformer_engine_config_type": "TEQuantizationParams", "training_recipe": {}}}


class PrecisionError(RuntimeError):
    """The job's precision cannot run here; the message names the fix."""


@dataclass(frozen=True)
class Decision:
    name: str  # mixed_precision as the job asks for it
    preset: str  # the Megatron-Bridge preset to start from: `name`, or the one it is composed from
    fields: dict[str, Any]  # MixedPrecisionConfig fields set on it
    bf16_modules: tuple[str, ...]  # module-path globs kept in BF16 through model.quant_recipe

    def quant_recipe(self) -> dict | None:
        """The dict for megatron.core.quantization.quant_config.RecipeConfig.from_config_dict, None for none."""
        if not self.bf16_modules:
            return None
        matchers = {f"bf16_{i}": {"config": "bf16", "type": "glob", "pattern": glob, "enabled": True}
                    for i, glob in enumerate(self.bf16_modules)}
        return {"configs": BF16_CONFIG, "matchers": matchers}

    def lines(self) -> list[str]:
        how = "the Megatron-Bridge preset" if self.preset == self.name else \
            f"composed from {self.preset} (this Megatron-Bridge does not register {self.name})"
        out = [f"precision: {self.name}, {how}"]
        if self.fields:
            out.append(f"precision: MixedPrecisionConfig {_fmt(self.fields)}")
        if self.bf16_modules:
            out.append(f"precision: kept in BF16 through model.quant_recipe: {', '.join(self.bf16_modules)}")
        return out


def _fmt(fields: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def decide(cfg: dict, presets: set[str], capability: tuple[int, int] | None) -> Decision:
    """The precision of the resolved job config `cfg` given the preset names the installed Megatron-Bridge registers
    and the GPU's compute capability (None when unknown)."""
    name = cfg.get("mixed_precision") or "bf16_mixed"  # the Ultra recipes' own
    nvfp4 = "nvfp4" in name.lower()
    if nvfp4 and capability is not None and not trains_nvfp4(capability):
        raise PrecisionError(
            f"mixed_precision={name} trains in NVFP4, which Transformer Engine runs on SM 10.0/10.3 (Blackwell) "
            f"only, but this GPU is SM {capability[0]}.{capability[1]}; set mixed_precision=bf16_mixed (BF16) or "
            "bf16_with_fp8_current_scaling_mixed (FP8)")
    composed = name == ULTRA_PRESET and name not in presets
    if name not in presets and not composed:
        raise PrecisionError(f"mixed_precision={name} is not a Megatron-Bridge preset here; use one of: "
                             f"{', '.join(sorted(presets))}")
    fields = dict(ULTRA_LAYERS) if composed else {}
    model, ddp = cfg.get("model") or {}, cfg.get("ddp") or {}
    fields.update({k: model[k] for k in MODEL_FIELDS if model.get(k) is not None})
    fields.update({k: ddp[k] for k in DDP_FIELDS if isinstance(ddp.get(k), bool)})
    globs = (cfg.get("precision") or {}).get("bf16_modules") or []
    return Decision(name, NVFP4_PRESET if composed else name, fields, tuple(globs) if nvfp4 else ())


def check_te_env(cfg: dict, environ: dict[str, str]) -> list[str]:
    """The NVFP4 knobs the job exports (run.env), checked against the process environment Transformer Engine reads."""
    wanted = {k: str(v) for k, v in ((cfg.get("run") or {}).get("env") or {}).items() if k.startswith(TE_ENV_PREFIX)}
    wrong = [f"{k}={environ.get(k)!r} (the job sets {v!r})" for k, v in wanted.items() if environ.get(k) != v]
    if wrong:
        raise PrecisionError(f"Transformer Engine would read {', '.join(wrong)}; these are read when it is imported, "
                             "so start the runtime through the launcher, which exports them")
    return [f"precision: Transformer Engine NVFP4 knobs {_fmt(wanted)}"] if wanted else []


def apply_precision(container: Any, cfg: dict) -> list[str]:
    """Set container.mixed_precision (and container.model.quant_recipe under NVFP4) for the job; the log lines."""
    from megatron.bridge.training import mixed_precision

    decision = decide(cfg, set(mixed_precision.MIXED_PRECISION_RECIPES), _capability())
    config = mixed_precision.get_mixed_precision_config(decision.preset)
    for name, value in decision.fields.items():
        setattr(config, name, value)
    container.mixed_precision = config
    recipe = decision.quant_recipe()
    if recipe is not None:
        from megatron.core.quantization.quant_config import RecipeConfig

        container.model.quant_recipe = RecipeConfig.from_config_dict(recipe)
    return decision.lines() + check_te_env(cfg, dict(os.environ))


def _capability() -> tuple[int, int] | None:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None
