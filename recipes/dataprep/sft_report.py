"""What a run of `ultra3 data prep sft` reports: each split's packing statistics (in metadata.json) and
the closing summary it prints."""

from __future__ import annotations

import os

from . import sft_output as out_
from .sft_settings import PROG


def split_stats(plan: out_.SplitPlan, corpus: out_.Corpus, pack_size: int, shard_rows: list) -> dict:
    import numpy as np

    if not plan.packs:
        return {"packs": 0, "sequences": 0, "shards": []}
    per_pack = np.add.reduceat(plan.padded - 1, plan.row_offsets[:-1])
    real = int((plan.stored - 1).sum())
    seqs_per_pack = np.diff(plan.row_offsets)
    return {
        "packs": plan.packs,
        "sequences": len(plan.seq),
        "conversations": len(np.unique(plan.seq)),
        "tokens": int(plan.stored.sum()),
        "padding_tokens": int((plan.padded - plan.stored).sum()),
        "loss_tokens": int(sum(r["loss_tokens"] for r in shard_rows)),
        "packing_efficiency": round(float(per_pack.sum()) / (plan.packs * pack_size), 6),
        "token_efficiency": round(real / (plan.packs * pack_size), 6),
        "packing_factor": round(len(plan.seq) / plan.packs, 4),
        "max_sequences_per_pack": int(seqs_per_pack.max()),
        "min_pack_tokens": int(per_pack.min()),
        "max_sequence_tokens": int((plan.padded - 1).max()),
        "shards": shard_rows,
    }


def summary(m: dict, out: str, seconds: float, packing_seconds: float) -> str:
    t = m["totals"]
    lines = [(f"{PROG}: {t['records']:,} records -> {t['conversations']:,} conversations ({t['bad_records']:,} bad), "
              f"{t['truncated']:,} truncated, {t['dropped_too_long']:,} dropped as too long, "
              f"{t['dropped_no_loss']:,} dropped with no trained token left")]
    for name, st in m["splits"].items():
        if st["packs"]:
            lines.append(f"  {name:<5} {st['packs']:>9,} packs in {len(st['shards'])} shard(s), "
                         f"{st['sequences']:,} sequences, {st['tokens']:,} tokens ({st['loss_tokens']:,} trained); "
                         f"packing efficiency {100 * st['packing_efficiency']:.2f}%, "
                         f"{st['packing_factor']:.2f} sequences/pack")
        else:
            lines.append(f"  {name:<5} (empty)")
    for kind, places in m["bad_records"]["examples"].items():
        lines.append(f"  bad records, {kind}: {m['bad_records']['counts'][kind]:,}; first at " + "; ".join(places))
    lines.append(f"  wall time {seconds:.1f} s (packing {packing_seconds:.2f} s); "
                 f"wrote {os.path.join(out, 'metadata.json')}")
    return "\n".join(lines)
