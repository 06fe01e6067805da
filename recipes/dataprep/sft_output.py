"""From tokenized conversations to packed-Parquet shards: splits, weights, truncation, packing, shards.

Everything here runs on arrays of per-conversation numbers in the driver (a few bytes per conversation),
except `write_shard`, which runs as one Ray task per shard and reads the tokens from the part files.

* Splits, per dataset: its conversations are ordered by their 64-bit content key (ties by position);
  the first round(n * valid_ratio) go to `valid`, the next round(n * test_ratio) to `test`, the rest
  to `train` (a ratio > 0 takes at least one conversation of a dataset of 3 or more; at least one
  conversation is kept for train). So held-out conversations are a
  content-determined sample spread over the dataset, and identical in every run.
* Weights: `weight` w of a dataset repeats its train conversations: each appears floor(w) times plus
  once more with probability frac(w), decided by its key (w = 1 keeps them once; 0.5 keeps half;
  valid and test are never repeated).
* Length limits (Megatron-Bridge's packing sizes are runtime lengths L - 1, see packed_parquet): with
  cap = pack_size rounded down to pad_seq_to_mult, a conversation with L - 1 > cap is cut to cap + 1
  tokens (`truncate: true`, counted) or dropped (`truncate: false`, counted); a cut conversation that
  keeps no trained token is dropped too (counted).
* Packing: each split separately, best-fit decreasing over the padded runtime lengths in units of
  pad_seq_to_mult (`packing.best_fit_decreasing`); then the packs are shuffled with `seed` and cut into
  shards of equal pack counts (`num_shards` for train; valid/test get as many as that shard size needs).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from . import packed_parquet as pp
from .conversations import load_part
from .packing import Packing, best_fit_decreasing
from .files import fsync_dir, fsync_file, sha256_file, tmp_name, write_json

SPLITS = ("train", "valid", "test")
SHARD_NAME = "shard_{:06d}.parquet"
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class Corpus:
    """All good conversations, in input order (dataset, file, record)."""

    dataset: np.ndarray  # int64 dataset index
    part: np.ndarray  # int64 partition index
    offset: np.ndarray  # int64 first token in the partition's arrays
    length: np.ndarray  # int64 tokens
    first_loss: np.ndarray  # int64 first trained position (>= 1)
    loss_tokens: np.ndarray  # int64 trained tokens
    key: np.ndarray  # uint64 content key

    def __len__(self) -> int:
        return len(self.length)


def assign_splits(corpus: Corpus, n_datasets: int, valid_ratio: float, test_ratio: float) -> np.ndarray:
    """Split of each conversation: 0 train, 1 valid, 2 test."""
    split = np.zeros(len(corpus), dtype=np.int8)
    for d in range(n_datasets):
        idx = np.flatnonzero(corpus.dataset == d)
        n = len(idx)
        if not n:
            continue
        order = idx[np.lexsort((idx, corpus.key[idx]))]
        nv, nt = (max(1, round(n * r)) if r > 0 and n >= 3 else 0 for r in (valid_ratio, test_ratio))
        while nv + nt >= n and nv + nt > 0:  # keep one for train
            if nt >= nv:
                nt -= 1
            else:
                nv -= 1
        split[order[:nv]] = 1
        split[order[nv:nv + nt]] = 2
    return split


def _unit_draw(key: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per key, independent of the split order (a multiplicative hash)."""
    with np.errstate(over="ignore"):
        mixed = (key * GOLDEN) ^ (key >> np.uint64(29))
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def repeats(corpus: Corpus, split: np.ndarray, weights: list[float]) -> np.ndarray:
    """How many times each conversation goes into its split (weights apply to train only)."""
    w = np.asarray(weights, dtype=np.float64)[corpus.dataset]
    w = np.where(split == 0, w, 1.0)
    whole = np.floor(w)
    return (whole + (_unit_draw(corpus.key) < (w - whole))).astype(np.int64)


@dataclass
class Limits:
    stored: np.ndarray  # stored tokens after truncation
    keep: np.ndarray  # bool
    truncated: np.ndarray  # bool (kept, cut)
    dropped_too_long: np.ndarray  # bool (truncate: false)
    dropped_no_loss: np.ndarray  # bool (cut away every trained token)


def limit(corpus: Corpus, pack_size: int, mult: int, truncate: bool) -> Limits:
    cap = pp.runtime_cap(pack_size, mult)
    too_long = corpus.length - 1 > cap
    stored = np.where(too_long, cap + 1, corpus.length)
    if truncate:
        no_loss = too_long & (corpus.first_loss > cap)  # the first trained token is past the cut
        dropped_too_long = np.zeros(len(corpus), dtype=bool)
    else:
        no_loss = np.zeros(len(corpus), dtype=bool)
        dropped_too_long = too_long
    keep = ~(dropped_too_long | no_loss)
    return Limits(stored, keep, too_long & keep, dropped_too_long, no_loss)


@dataclass
class SplitPlan:
    name: str
    seq: np.ndarray  # conversation index of each packed sequence, pack by pack (shuffled pack order)
    row_offsets: np.ndarray  # packs as CSR over `seq`
    stored: np.ndarray  # stored tokens of each packed sequence (after truncation)
    padded: np.ndarray  # stored tokens after padding (runtime multiple of pad_seq_to_mult, + 1)
    shard_rows: np.ndarray  # packs per shard as CSR over rows
    packing: Packing | None

    @property
    def packs(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def shards(self) -> int:
        return len(self.shard_rows) - 1


def plan_split(name: str, members: np.ndarray, stored_all: np.ndarray, pack_size: int, mult: int,
               seed: int, shards: int | None, rows_per_shard: int | None) -> SplitPlan:
    """Pack the conversations `members` (indices, repeats included, in order) of one split."""
    stored = stored_all[members]
    padded_runtime = pp.padded_runtime(stored, mult)
    sizes = padded_runtime // mult
    packing = best_fit_decreasing(sizes, pack_size // mult) if len(sizes) else None
    if packing is None:
        empty = np.zeros(1, dtype=np.int64)
        return SplitPlan(name, np.zeros(0, np.int64), empty, np.zeros(0, np.int64), np.zeros(0, np.int64),
                         empty, None)
    rng = np.random.default_rng([seed, SPLITS.index(name)])
    perm = rng.permutation(packing.num_bins)
    counts = np.diff(packing.offsets)[perm]
    starts = packing.offsets[:-1][perm]
    order = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(counts.sum())
    items = packing.items[order]
    row_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    if rows_per_shard is None:
        n_shards = max(1, min(shards or 1, packing.num_bins))
    else:
        n_shards = max(1, -(-packing.num_bins // rows_per_shard))
    shard_rows = np.array([i * packing.num_bins // n_shards for i in range(n_shards + 1)], dtype=np.int64)
    return SplitPlan(name, members[items], row_offsets, stored[items], padded_runtime[items] + 1, shard_rows,
                     packing)


_PARTS: dict = {}


def _part(path: str, dtype: str) -> np.ndarray:
    arr = _PARTS.get(path)
    if arr is None:
        if len(_PARTS) > 256:
            _PARTS.clear()
        arr = _PARTS[path] = load_part(path, dtype)
    return arr


def write_shard(path: str, seq_part: np.ndarray, seq_offset: np.ndarray, stored: np.ndarray, padded: np.ndarray,
                row_offsets: np.ndarray, part_paths: dict, pad_id: int, row_group_size: int,
                receipt: str | None = None) -> dict:
    """Assemble one shard's packs from the part files and write it, one row group at a time (memory stays
    at one row group), to a temporary name renamed into place; returns its stats, also written to `receipt`
    (after the shard is synced) so that a later run takes it as done (`kept_shard`)."""
    import pyarrow.parquet as pq

    tmp = tmp_name(path)
    rows = len(row_offsets) - 1
    loss = 0
    try:
        with pq.ParquetWriter(tmp, pp.schema(), compression="zstd") as writer:
            for r0 in range(0, rows, row_group_size):
                r1 = min(r0 + row_group_size, rows)
                s0, s1 = int(row_offsets[r0]), int(row_offsets[r1])
                size = padded[s0:s1]
                total = int(size.sum())
                ids = np.full(total, pad_id, dtype=np.int32)
                mask = np.zeros(total, dtype=np.int8)
                pos = 0
                for p, off, n, width in zip(seq_part[s0:s1].tolist(), seq_offset[s0:s1].tolist(),
                                            stored[s0:s1].tolist(), size.tolist()):
                    ids[pos:pos + n] = _part(part_paths[p]["ids"], "<i4")[off:off + n]
                    mask[pos:pos + n - 1] = _part(part_paths[p]["mask"], "i1")[off + 1:off + n]  # label-aligned
                    pos += width
                ends = np.cumsum(size)
                seq_abs = ends - size
                local_rows = row_offsets[r0:r1 + 1] - s0
                row_tok = np.concatenate(([0], ends))[local_rows]
                seq_start = seq_abs - np.repeat(row_tok[:-1], np.diff(local_rows))
                writer.write_table(pp.table(ids, mask, row_tok, seq_start, local_rows), row_group_size=row_group_size)
                loss += int(mask.sum())
        if receipt:
            fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stats = {"file": os.path.basename(path), "rows": rows, "sequences": len(stored),
             "tokens": int(stored.sum()), "stored_tokens": int(padded.sum()), "loss_tokens": loss,
             "bytes": os.path.getsize(path), "sha256": sha256_file(path)}
    if receipt:
        fsync_dir(os.path.dirname(path))
        write_json(receipt, stats)
    return stats


def kept_shard(path: str, receipt: str) -> dict | None:
    """The stats of a shard an earlier run wrote (its receipt), if the file is still the size it says."""
    try:
        with open(receipt, encoding="utf-8") as f:
            stats = json.load(f)
        return stats if os.path.getsize(path) == stats["bytes"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
