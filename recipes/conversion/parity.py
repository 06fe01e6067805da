"""The parity gate of `ultra3 convert`: the held-out tokens, a Hugging Face model's logits on them (any machine:
the tests run it on CPU) and the converted logits against the source's."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .checks import ConvertError


class ParityFailed(Exception):
    """The converted model's logits are too far from its source's."""


def held_out_ids(data: str, tokenizer_dir: str, tokens: int):
    """The first `tokens` tokens of `data`'s documents joined by the end-of-text token, as one [1, tokens] batch."""
    import torch
    from transformers import AutoTokenizer

    from ..quantization import calibration

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids: list[int] = []
    for text in calibration.texts(data):
        ids += tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        if len(ids) >= tokens:
            return torch.tensor([ids[:tokens]])
    raise ConvertError(f"parity.data: {data} gives {len(ids)} tokens, fewer than parity.tokens {tokens}; add text "
                       "or lower parity.tokens")


def hf_logits(model_dir: str, ids, dtype=None):
    """Logits [tokens, vocab] (float32, CPU) of a Hugging Face checkpoint on `ids`, over the visible GPUs if any."""
    import torch
    from transformers import AutoModelForCausalLM

    spread = torch.cuda.is_available() and importlib.util.find_spec("accelerate") is not None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype or "auto",
                                                 **({"device_map": "auto"} if spread else {})).eval()
    if not spread and torch.cuda.is_available():
        model = model.cuda()
    with torch.no_grad():
        logits = model(ids.to(model.device)).logits
    return logits.float().reshape(-1, logits.shape[-1]).cpu()


@dataclass(frozen=True)
class Parity:
    tokens: int
    relative_error: float  # ||a - b|| / ||a|| over all logits, float32
    top1: float  # share of positions whose most likely token agrees
    max_abs: float

    def failures(self, max_relative_error: float, min_top1: float) -> list[str]:
        out = []
        if not self.relative_error <= max_relative_error:  # NaN fails too
            out.append(f"relative error {self.relative_error:.4g} > {max_relative_error:g}")
        if not self.top1 >= min_top1:
            out.append(f"top-1 {self.top1:.4f} < {min_top1:g}")
        return out


def parity(source, converted, vocab_size: int) -> Parity:
    """The converted logits against the source's ([tokens, vocab]; a padded vocab is cut to `vocab_size`)."""
    from ..quantization.accuracy import agreement

    a, b = source[:, :vocab_size].float(), converted[:, :vocab_size].float()
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    error, top1 = agreement(a, b)
    return Parity(a.shape[0], error, top1, (a - b).abs().max().item())
