"""The learning rate at an iteration, as Megatron-Core's OptimizerParamScheduler computes it (linear warmup from
lr_warmup_init, then the decay style up to lr_decay_iters, min_lr after): what the dry run shows at the edges of a
run's phases. Stdlib only."""

from __future__ import annotations

import math

from .dotted import get


def lr_at(cfg: dict, step: int) -> float | None:
    """The LR at `step`; None when the config names no peak LR or no decay length."""
    peak, low = get(cfg, "optimizer.lr"), get(cfg, "optimizer.min_lr") or 0.0
    decay = get(cfg, "scheduler.lr_decay_iters") or get(cfg, "train.train_iters")
    if not isinstance(peak, (int, float)) or not isinstance(decay, int):
        return None
    warmup = get(cfg, "scheduler.lr_warmup_iters") or 0
    style = get(cfg, "scheduler.lr_decay_style") or "linear"
    if warmup and step <= warmup:
        start = get(cfg, "scheduler.lr_warmup_init") or 0.0
        return start + (peak - start) * step / warmup
    if style == "constant":
        return peak
    if style == "inverse-square-root":
        return max(low, peak * math.sqrt(max(warmup, 1)) / math.sqrt(max(step, 1)))
    if step > decay:
        return low
    if style == "WSD":
        anneal = get(cfg, "scheduler.lr_wsd_decay_iters") or 0
        first = decay - anneal
        if step <= first or not anneal:
            return peak
        ratio = (step - first) / anneal
        coeff = {"linear": 1 - ratio, "cosine": 0.5 * (math.cos(math.pi * ratio) + 1),
                 "exponential": 2 * 0.5 ** ratio - 1,
                 "minus_sqrt": 1 - math.sqrt(ratio)}.get(get(cfg, "scheduler.lr_wsd_decay_style") or "exponential")
    else:
        ratio = (step - warmup) / max(decay - warmup, 1)
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1) if style == "cosine" else 1 - ratio
    return low + (coeff if coeff is not None else 1.0) * (peak - low)
