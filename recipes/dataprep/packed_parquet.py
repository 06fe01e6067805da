"""Megatron-Bridge 0.6.x packed-Parquet SFT rows: one row per pack.

Columns (what `megatron.bridge.data.packing.parquet.GPTSFTPackedParquetDataset` reads):

* `input_ids`   list<int32>: the pack's sequences back to back;
* `loss_mask`   list<int8>:  same length; MB's *label-aligned* mask (see below);
* `seq_start_id` list<int32>: where each sequence starts in the row (first 0, increasing, < len).

The MB contract this follows (megatron/bridge/data/packing, 0.6.x):

* Each stored sequence of L tokens trains as L - 1 (input, label) pairs: input `ids[s:e-1]`, labels
  `ids[s+1:e]`. Packing sizes are those runtime lengths: sum(L_i - 1) <= pack_size per row, so a row
  holds up to pack_size + (number of sequences) stored tokens.
* `loss_mask[t]` weighs the loss of predicting token t + 1 (MB's packer rolls the token mask left by
  one: `loss_mask = mask[1:] + [0]`); the last position of each sequence is 0.
* With `pad_seq_to_mult` = m > 1 each sequence is padded with the EOS id (loss 0) so that its runtime
  length L - 1 is a multiple of m (MB's `_pre_pad_data_point`); the collator drops trailing EOS from the
  logical lengths and passes the padded ones as `cu_seqlens_padded` for THD context parallelism.

Shards are written (sft_output.write_shard) to a temporary name beside the target and renamed into place.
"""

from __future__ import annotations

import itertools

import numpy as np

COLUMNS = ("input_ids", "loss_mask", "seq_start_id")


def runtime_cap(pack_size: int, mult: int) -> int:
    """Longest runtime length (L - 1) a sequence may have: pack_size rounded down to the multiple."""
    return (pack_size // mult) * mult


def padded_runtime(stored_len: np.ndarray, mult: int) -> np.ndarray:
    """Runtime length after padding: ceil((L - 1) / m) * m (at least m)."""
    r = np.maximum(np.asarray(stored_len, dtype=np.int64) - 1, 1)
    return -(-r // mult) * mult


def default_row_group_size(pack_size: int) -> int:
    """~64 MiB of tokens per row group (16 rows at 294,912 like NVIDIA's config; 1,000 for small packs)."""
    return int(max(1, min(1000, (64 << 20) // (pack_size * 5))))


def schema():
    import pyarrow as pa

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                      ("seq_start_id", pa.list_(pa.int32()))])


def table(input_ids: np.ndarray, loss_mask: np.ndarray, row_offsets: np.ndarray,
          seq_start: np.ndarray, seq_offsets: np.ndarray):
    """An Arrow table from flat arrays: row r is input_ids[row_offsets[r]:row_offsets[r+1]], its
    seq_start_id is seq_start[seq_offsets[r]:seq_offsets[r+1]]."""
    import pyarrow as pa

    row_offsets = pa.array(np.asarray(row_offsets, dtype=np.int32))
    seq_offsets = pa.array(np.asarray(seq_offsets, dtype=np.int32))
    return pa.Table.from_arrays([
        pa.ListArray.from_arrays(row_offsets, pa.array(np.asarray(input_ids, dtype=np.int32))),
        pa.ListArray.from_arrays(row_offsets, pa.array(np.asarray(loss_mask, dtype=np.int8))),
        pa.ListArray.from_arrays(seq_offsets, pa.array(np.asarray(seq_start, dtype=np.int32))),
    ], schema=schema())


def check_row(row: dict, pack_size: int, mult: int = 1) -> None:
    """MB's row invariants (GPTSFTPackedParquetDataset.validate_row) plus ours; raises ValueError."""
    ids, mask, starts = row["input_ids"], row["loss_mask"], row["seq_start_id"]
    if len(mask) != len(ids):
        raise ValueError(f"loss_mask has {len(mask)} entries, input_ids {len(ids)}")
    if not starts or starts[0] != 0:
        raise ValueError("seq_start_id must start with 0")
    bounds = list(starts) + [len(ids)]
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    if min(lengths) < 2:
        raise ValueError(f"seq_start_id is not strictly increasing with sequences of >= 2 tokens: {starts[:8]}")
    if sum(n - 1 for n in lengths) > pack_size:
        raise ValueError(f"runtime tokens {sum(n - 1 for n in lengths)} exceed pack_size {pack_size}")
    if mult > 1 and any((n - 1) % mult for n in lengths):
        raise ValueError(f"a sequence's runtime length is not a multiple of {mult}")
    for b in bounds[1:]:
        if mask[b - 1]:
            raise ValueError("the last position of a sequence has loss (nothing follows it)")
