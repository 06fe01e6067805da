"""What packing leaves (Packed) and the two files made of its numbers: metadata.json (settings, counts,
statistics, provenance) and Megatron-Bridge's packing_metadata.json."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from . import bad_records, inputs
from . import packed_parquet as pp
from . import sft_output as out_
from . import tokenizer as tokenization
from .sft_outdir import FORMAT
from .sft_settings import Settings


@dataclass
class Packed:
    """What packing leaves: the splits' shards in staging, and the numbers metadata.json is made of."""

    staging: str
    records: int
    corpus: out_.Corpus
    per_dataset: dict  # dataset name: {records, conversations, bad}
    bad: bad_records.BadRecords
    split: np.ndarray  # of each conversation: 0 train, 1 valid, 2 test
    copies: np.ndarray  # times each conversation is packed (0: left out)
    lim: out_.Limits
    row_group: int
    stats: dict = field(default_factory=dict)  # split name: its packing statistics
    pack_seconds: float = 0.0



def totals(settings: Settings, packed: Packed) -> dict:
    """The counts over all datasets and splits, with the packing efficiency and factor."""
    stats, lim = packed.stats.values(), packed.lim
    result = {
        "records": packed.records,
        "conversations": len(packed.corpus),
        "bad_records": packed.bad.total,
        "truncated": int(lim.truncated.sum()),
        "dropped_too_long": int(lim.dropped_too_long.sum()),
        "dropped_no_loss": int(lim.dropped_no_loss.sum()),
        "sequences": sum(st["sequences"] for st in stats),
        "packs": sum(st["packs"] for st in stats),
        "tokens": sum(st.get("tokens", 0) for st in stats),
        "loss_tokens": sum(st.get("loss_tokens", 0) for st in stats),
    }
    capacity = result["packs"] * settings.pack_size
    result["packing_efficiency"] = round(sum(float(st["packing_efficiency"]) * st["packs"] for st in stats
                                             if st["packs"]) / max(result["packs"], 1), 6)
    result["token_efficiency"] = round((result["tokens"] - result["sequences"]) / capacity, 6) if capacity else 0.0
    result["packing_factor"] = round(result["sequences"] / result["packs"], 4) if result["packs"] else 0.0
    return result


def dataset_entries(settings: Settings, files: dict, sources: dict, packed: Packed) -> list:
    """Each dataset's inputs and counts; one with nothing usable or too many bad records fails the run."""
    corpus, split, copies, lim = packed.corpus, packed.split, packed.copies, packed.lim
    entries = []
    for i, d in enumerate(settings.datasets):
        mine = corpus.dataset == i
        pd = packed.per_dataset[d.name]
        bad_records.check_yield(f"dataset {d.name}", pd["records"], pd["conversations"], pd["bad"],
                                settings.max_bad_fraction)
        entries.append({
            "name": d.name, "path": d.path, "messages_field": d.field, "weight": d.weight,
            **({"split": d.split, "subset": d.subset, "hub": files[d.name][1]} if files[d.name][1] else {}),
            "inputs": [{"path": inputs.shown(s["path"]), "format": s["format"], **s["fingerprint"],
                        "records": s["records"]}
                       for s in sources[d.name]],
            "records": pd["records"], "conversations": pd["conversations"], "bad_records": pd["bad"].total,
            "bad": pd["bad"].to_json(),
            "train": int((mine & (split == 0)).sum()), "valid": int((mine & (split == 1)).sum()),
            "test": int((mine & (split == 2)).sum()),
            "train_sequences": int(copies[mine & (split == 0)].sum()),
            "truncated": int(lim.truncated[mine].sum()), "dropped_too_long": int(lim.dropped_too_long[mine].sum()),
            "dropped_no_loss": int(lim.dropped_no_loss[mine].sum()),
        })
    return entries


def build_metadata(settings: Settings, fp: str, files: dict, sources: dict, tok: tokenization.TokenizerInfo,
                   template_file: str, template_sha256: str, packed: Packed) -> dict:
    """metadata.json: the settings that shape the output, its counts and statistics, and where it came from."""
    counts = totals(settings, packed)
    datasets = dataset_entries(settings, files, sources, packed)
    return {
        "format": FORMAT,
        "fingerprint": fp,
        "megatron_bridge": {"dataset": "GPTSFTPackedParquetDataset", "columns": list(pp.COLUMNS),
                            "loss_mask": "label-aligned (loss_mask[t] weighs predicting input_ids[t+1])",
                            "pack_size_counts": "runtime tokens: sum(len(sequence) - 1) <= pack_size"},
        "sample": settings.sample,
        "pack_size": settings.pack_size,
        "pad_seq_to_mult": settings.pad_seq_to_mult,
        "truncate": settings.truncate,
        "valid_ratio": settings.valid_ratio,
        "test_ratio": settings.test_ratio,
        "seed": settings.seed,
        "row_group_size": packed.row_group,
        "algorithm": "best_fit_decreasing",
        "tokenizer": {**tok.describe(), "pad_token": tok.eod_token, "pad_id": tok.eod_id},
        "chat_template": {"name": settings.chat_template, "file": os.path.basename(template_file),
                          "sha256": template_sha256},
        "totals": counts,
        "splits": packed.stats,
        "bad_records": packed.bad.to_json(),
        "datasets": datasets,
    }


def bridge_metadata(settings: Settings, stats: dict) -> list:
    """packing_metadata.json: Megatron-Bridge's packed metadata of train and valid (those with packs)."""
    return [{"dataset_max_seqlen": stats[s].get("max_sequence_tokens", 0),
             "max_samples_per_bin": stats[s].get("max_sequences_per_pack", 0),
             "min_packed_seqlen": stats[s].get("min_pack_tokens", 0),
             "packing_factor": stats[s].get("packing_factor", 0),
             "packing_efficiency": round(100 * stats[s].get("packing_efficiency", 0), 2),
             "pack_size": settings.pack_size} for s in ("train", "valid") if stats[s]["packs"]]
