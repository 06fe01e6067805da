"""A streaming writer of Megatron's indexed dataset (`MMIDIDX`, the `.bin`/`.idx` pair that Megatron-Core's
`IndexedDataset` reads), one sequence per document.

`.bin`: the token ids of all documents back to back, little-endian, in the shard's dtype.
`.idx`: a 34-byte header — magic `MMIDIDX\\0\\0`, version `<Q` 1, dtype code `<B`, sequence count `<Q`,
document count `<Q` (= sequences + 1) — then int32 sequence lengths, int64 byte offsets of the sequences
in `.bin`, and int64 document indices 0, 1, ..., N (document i is sequence i).

Memory stays flat in the shard's size: tokens go straight to `.bin`, lengths to a side file, and the index
is built from that file in fixed-size chunks at the end. Both files are hashed (SHA-256) as they are written.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
               np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
CHUNK = 1 << 20  # index entries per chunk when building .idx


class _HashedFile:
    def __init__(self, path: str) -> None:
        self.f = open(path, "wb", buffering=1 << 20)
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        self.f.write(mv)
        self.sha.update(mv)
        self.size += mv.nbytes

    def close(self) -> None:
        self.f.close()


class IndexedWriter:
    """Write documents to `bin_path`/`idx_path` (temporary names: the caller renames them when done)."""

    def __init__(self, bin_path: str, idx_path: str, dtype: str, lengths_path: str) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"no MMIDIDX code for dtype {dtype}")
        self.idx_path, self.lengths_path = idx_path, lengths_path
        self.bin = _HashedFile(bin_path)
        self.lengths = open(lengths_path, "wb", buffering=1 << 20)
        self.docs = 0
        self.tokens = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: `tokens` is their ids back to back, `lengths` the number of ids of each."""
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        lengths = np.ascontiguousarray(lengths, dtype="<i4")
        if int(lengths.sum(dtype=np.int64)) != tokens.size:
            raise ValueError("lengths do not add up to the tokens given")
        self.bin.write(tokens.astype(self.dtype.newbyteorder("<"), copy=False))
        self.lengths.write(memoryview(lengths).cast("B"))
        self.docs += lengths.size
        self.tokens += tokens.size

    def finish(self) -> dict:
        """Close `.bin`, write `.idx`; the sizes and SHA-256 of both. Neither is fsynced: the caller does, before
        it renames them (shards.publish)."""
        self.bin.close()
        self.lengths.close()
        idx = _HashedFile(self.idx_path)
        n = self.docs
        idx.write(MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", DTYPE_CODES[self.dtype])
                  + struct.pack("<Q", n) + struct.pack("<Q", n + 1))
        with open(self.lengths_path, "rb") as f:  # sequence lengths
            while chunk := f.read(CHUNK * 4):
                idx.write(chunk)
        with open(self.lengths_path, "rb") as f:  # byte offsets: exclusive cumulative sums, in chunks
            offset = 0
            while chunk := f.read(CHUNK * 4):
                lengths = np.frombuffer(chunk, dtype="<i4").astype("<i8") * self.dtype.itemsize
                ends = np.cumsum(lengths) + offset
                idx.write(np.concatenate(([offset], ends[:-1])).astype("<i8"))
                offset = int(ends[-1])
        for lo in range(0, n + 1, CHUNK):  # document indices 0..n
            idx.write(np.arange(lo, min(lo + CHUNK, n + 1), dtype="<i8"))
        idx.close()
        os.unlink(self.lengths_path)
        return {"docs": n, "tokens": self.tokens,
                "bin": {"bytes": self.bin.size, "sha256": self.bin.sha.hexdigest()},
                "idx": {"bytes": idx.size, "sha256": idx.sha.hexdigest()}}

    def abort(self) -> None:
        for f in (self.bin.f, self.lengths):
            if not f.closed:
                f.close()


def read_index(idx_path: str) -> dict:
    """The header and arrays of an `.idx` file (for checks; Megatron-Core has its own reader)."""
    with open(idx_path, "rb") as f:
        header = f.read(34)
        if header[:9] != MAGIC:
            raise ValueError(f"{idx_path}: not an MMIDIDX index")
        version, code, n, docs = struct.unpack("<QBQQ", header[9:])
        lengths = np.fromfile(f, dtype="<i4", count=n)
        pointers = np.fromfile(f, dtype="<i8", count=n)
        doc_index = np.fromfile(f, dtype="<i8", count=docs)
    dtype = next(d for d, c in DTYPE_CODES.items() if c == code)
    return {"version": version, "dtype": dtype, "lengths": lengths, "pointers": pointers, "doc_index": doc_index}
