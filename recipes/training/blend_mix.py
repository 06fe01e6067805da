"""Two blends sampled together (dataset.mix): the long-context phase's own corpus beside the phase-2 blend. Both
are Megatron-Bridge per-split blend files ({"train": [w, prefix, ...], "valid": [...], "test": [...]}); within each
split the mixed-in blend's weights are scaled to `share` of the total and the other's to the rest, each keeping its
own proportions. A split only one of them has is that one's alone. Stdlib only."""

from __future__ import annotations

import json
import os

from ..contract import write_atomic


class BlendError(ValueError):
    """A blend file that cannot be mixed: one line naming it."""


def read_blend(path: str) -> dict[str, list]:
    try:
        with open(path, encoding="utf-8") as f:
            blend = json.load(f)
    except (OSError, ValueError) as e:
        raise BlendError(f"{path}: not a readable blend.json ({type(e).__name__}: {e})") from None
    if not isinstance(blend, dict) or not all(isinstance(v, list) and len(v) % 2 == 0 for v in blend.values()):
        raise BlendError(f"{path}: not a per-split blend ({{split: [weight, prefix, ...]}}); give the blend.json "
                         "that `ultra3 data prep pretrain` wrote")
    return blend


def _scaled(pairs: list, to: float) -> list:
    total = sum(float(w) for w in pairs[0::2])
    return [x for w, prefix in zip(pairs[0::2], pairs[1::2]) for x in (float(f"{float(w) * to / total:.12g}"), prefix)]


def mix(own: str, other: str, share: float) -> dict[str, list]:
    """The blend of `own` and `other`, `other` taking `share` of every split both have."""
    a, b = read_blend(own), read_blend(other)
    out = {}
    for split in dict.fromkeys([*a, *b]):
        mine, theirs = a.get(split) or [], b.get(split) or []
        if mine and theirs:
            out[split] = _scaled(mine, 1 - share) + _scaled(theirs, share)
        else:
            out[split] = list(mine or theirs)
    return out


def write_mixed(own: str, other: str, share: float, job_dir: str) -> str:
    """The mixed blend written into the job dir; its path."""
    path = os.path.join(job_dir, "blend-mixed.json")
    write_atomic(path, json.dumps(mix(own, other, share), indent=1) + "\n")
    return path
