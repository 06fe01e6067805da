"""The quantized model against the BF16 one on held-out windows: relative logit error, top-1 agreement and
the change in perplexity (next-token cross entropy over the windows)."""

from __future__ import annotations


def logits(model, windows, batch_size: int):
    import torch

    with torch.no_grad():
        return torch.cat([model(windows[i:i + batch_size]).logits.float() for i in range(0, len(windows), batch_size)])


def perplexity(logits, windows) -> float:
    import torch.nn.functional as F

    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    return float(loss.exp())


def agreement(reference, other) -> tuple[float, float]:
    """How far `other` logits are from `reference` ones on the same tokens: ||other - reference|| / ||reference||
    (NaN stays NaN), and the share of positions whose most likely token agrees."""
    import torch

    error = (other - reference).norm() / reference.norm().clamp_min(torch.finfo(torch.float32).tiny)
    return float(error), float((other.argmax(-1) == reference.argmax(-1)).float().mean())


def compare(reference, quantized, windows) -> dict:
    """Metrics of `quantized` logits against `reference` logits on the same windows."""
    ppl_ref, ppl_q = perplexity(reference, windows), perplexity(quantized, windows)
    error, top1 = agreement(reference, quantized)
    return {
        "held_out_tokens": windows.numel(),
        "relative_logit_error": round(error, 6),
        "top1_agreement": round(top1, 6),
        "perplexity_bf16": round(ppl_ref, 4),
        "perplexity_quantized": round(ppl_q, 4),
        "perplexity_change": round(ppl_q / ppl_ref - 1, 6),
    }
