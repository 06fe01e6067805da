"""Splits and the blend file.

Splits. A dataset with at least 3 shards gives `valid_shards` (default 1) shards to `valid` and
`test_shards` (default 1) to `test`, and keeps the rest (at least one) for `train`; one with fewer shards is
all `train`. Which shards go where is fixed by the dataset's name and shard count alone: shards are
ordered by SHA-256 of `"<dataset>/<index>"`, the first `valid_shards` are valid, the next `test_shards`
test. So held-out shards are spread over the corpus (not always its tail) and never depend on timing.

Blend. `blend.json` is Megatron-Bridge's `per_split_data_args_path` file,
`{"train": [w1, prefix1, w2, prefix2, ...], "valid": [...], "test": [...]}`, with absolute prefixes (the
`.bin`/`.idx` paths without extension). Megatron samples each prefix in proportion to its weight, so a
dataset's `weight` is shared among its shards of a split in proportion to their tokens:

    weight(shard) = weight(dataset) * tokens(shard) / tokens(dataset's shards in that split)

Each dataset then gets its configured share of every split, and within a dataset every token is equally
likely. Weights are not normalised (Megatron normalises them). Shards with no tokens (every record bad)
are left out: Megatron cannot memory-map an empty file.
"""

from __future__ import annotations

import hashlib

SPLITS = ("train", "valid", "test")


def assign_splits(dataset: str, shards: int, valid: int, test: int) -> list[str]:
    """The split of each shard of a dataset."""
    if shards < 3 or valid + test == 0:
        return ["train"] * shards
    order = sorted(range(shards), key=lambda i: hashlib.sha256(f"{dataset}/{i}".encode()).hexdigest())
    split = ["train"] * shards
    for i in order[:valid]:
        split[i] = "valid"
    for i in order[valid:valid + test]:
        split[i] = "test"
    return split


def _weight(x: float) -> float:
    return float(f"{x:.12g}")


def build(datasets: list[dict]) -> dict:
    """`datasets`: [{weight, shards: [{prefix, split, tokens}]}] -> the blend.json object."""
    blend: dict = {split: [] for split in SPLITS}
    for ds in datasets:
        for split in SPLITS:
            shards = [s for s in ds["shards"] if s["split"] == split and s["tokens"] > 0]
            total = sum(s["tokens"] for s in shards)
            for s in shards:
                blend[split] += [_weight(ds["weight"] * s["tokens"] / total), s["prefix"]]
    return blend
