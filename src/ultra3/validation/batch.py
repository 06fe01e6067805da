"""Batch split: global batch over micro-batches and data-parallel ranks, and the pipeline bubble it leaves.

* GBS % (MBS·DP) == 0; microbatches per step m = GBS/(MBS·DP)
* m < PP: warning; 1F1B leaves the pipeline idle (PP−1)/(m·VPP + PP−1) of each step
* virtual pipeline (VPP): m % PP == 0 (the interleaved schedule runs microbatches in groups of PP)
"""

from __future__ import annotations

from ultra3.dotted import get

from ..model_math import DP_KEYS, GBS, MBS, VPP, mesh, pos_int


def check(cfg: dict, report) -> None:
    gbs_raw, mbs_raw = get(cfg, GBS), get(cfg, MBS)
    gbs, mbs = pos_int(gbs_raw), pos_int(mbs_raw)
    for key, raw, value in ((GBS, gbs_raw, gbs), (MBS, mbs_raw, mbs)):
        if raw is not None and value is None:
            report.error(key, f"{key}={raw!r} is not a positive integer")
    m = mesh(cfg)
    if gbs is None or mbs is None or m is None or m.dp is None:
        return  # unknown world size: warned once by cluster.check; a bad mesh: reported by parallelism.check
    step = mbs * m.dp
    if gbs % step:
        below = (gbs // step) * step
        hint = ", ".join(f"{n:,}" for n in (below, below + step) if n > 0)
        report.error(
            GBS,
            f"global batch {gbs:,} is not divisible by MBS·DP = {mbs}·{m.dp} = {step}; use a multiple of {step} "
            f"(e.g. {hint})",
            quoting=(MBS, *DP_KEYS),
        )
        return
    micro = gbs // step
    chunks = m.vpp or 1
    bubble = (m.pp - 1) / (micro * chunks + m.pp - 1)
    report.facts["num_microbatches"] = micro
    report.facts["pipeline_bubble_fraction"] = round(bubble, 4)
    if m.pp > 1 and micro < m.pp:
        report.warn(
            GBS,
            f"{micro} microbatches per step < PP={m.pp}: the pipeline idles {bubble:.0%} of each step "
            f"(bubble (PP-1)/(m+PP-1)); raise the global batch to at least {m.pp * step:,} (PP·MBS·DP) or lower PP",
            quoting=(MBS, *DP_KEYS),
        )
    if m.vpp and micro % m.pp:
        report.error(
            GBS,
            f"virtual pipeline (VPP={m.vpp}) needs microbatches ({micro}) to be a multiple of PP={m.pp}; "
            f"use a global batch that is a multiple of {m.pp * step:,} (PP·MBS·DP) or unset VPP",
            quoting=(MBS, *DP_KEYS, VPP),
        )
