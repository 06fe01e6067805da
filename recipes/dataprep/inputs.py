"""Input files: finding them (paths, globs, directories), recognising their format, fingerprinting and
counting their records (and leaving seek marks), and reading a range of records; what a record's text is, or
why it is a bad record, is record_texts'.

Formats: JSON Lines, plain, gzip or zstd compressed (recognised by their magic bytes, whatever the file
is called), and Parquet. A *record* is a non-blank line of a JSONL file or a row of a Parquet file; record
numbers count from 0 in each file, in file order. Blank lines are skipped everywhere and are not records.

A record whose text cannot be used is a *bad record*, one of bad_records.BAD_KINDS; a record longer than
`max_record_bytes` is one too ("too_long"), skipped without ever being held whole, so a reader's memory
stays within line_reader.BLOCK_BYTES + max_record_bytes whatever the length of a line. It is counted (with the first
few places it happened, as `file:line` or `file:row=N`) and skipped, or under `strict` it stops the run.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import os
from collections.abc import Iterator

import numpy as np

from .bad_records import BadRecords
from .errors import DataPrepError
from .line_reader import BLOCK_BYTES, MAX_RECORD_BYTES, line_starts, plain_starts, split, text_blocks
from .record_texts import checked, jsonl_block, too_long, value_text

JSONL, JSONL_GZ, JSONL_ZST, PARQUET = "jsonl", "jsonl.gz", "jsonl.zst", "parquet"
# what a glob or a directory picks up (an explicitly named file is read whatever its name)
EXTENSIONS = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl.zst", ".json.zst",
              ".ndjson.zst", ".jsonl.zstd", ".parquet")
FINGERPRINT_BYTES = 1 << 20
SAMPLES, SAMPLE_BYTES = 64, 1 << 16
MARKS = 1024  # seek marks kept per plain JSONL file, at most
MARK_BYTES = 1 << 20  # and at least this far apart


def detect_format(path: str) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise DataPrepError(f"{path} is not readable ({e.strerror})") from None
    if head == b"PAR1":
        return PARQUET
    if head[:2] == b"\x1f\x8b":
        return JSONL_GZ
    if head == b"\x28\xb5\x2f\xfd":
        return JSONL_ZST
    return JSONL


def expand(path: str) -> list[str]:
    """The files a dataset `path` names, sorted: a file, a directory (searched recursively) or a glob."""
    path = os.path.expanduser(path)
    if glob.has_magic(path):
        found = [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
        return sorted(os.path.abspath(p) for p in found if p.lower().endswith(EXTENSIONS))
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found += [os.path.join(root, f) for f in files if f.lower().endswith(EXTENSIONS) and not f.startswith(".")]
        return sorted(os.path.abspath(p) for p in found)
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    return []


def fingerprint(path: str) -> dict:
    """What the file holds, never where it is or when it was written (a job reads its own copy of the shipped
    samples): its size and the SHA-256 of its first and last MiB and of SAMPLES evenly spaced 64 KiB blocks
    between them. Cheap on huge files; a rewrite, an append or a replacement changes it."""
    size = os.stat(path).st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if size > 2 * FINGERPRINT_BYTES:
            inner = size - 2 * FINGERPRINT_BYTES
            for i in range(SAMPLES):
                f.seek(FINGERPRINT_BYTES + inner * i // SAMPLES)
                h.update(f.read(SAMPLE_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return {"bytes": size, "sha256_sampled": h.hexdigest()}


def shown(path: str) -> str:
    """A path as outputs record it: relative to the job's directory when inside it (the job's copy of the shipped
    samples), so the same inputs give the same bytes from any job."""
    here = os.getcwd() + os.sep
    return os.path.relpath(path) if path.startswith(here) else path


def open_binary(path: str, fmt: str) -> io.BufferedIOBase:
    if fmt == JSONL_GZ:
        return gzip.open(path, "rb")
    if fmt == JSONL_ZST:
        import zstandard

        raw = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


def _blank(line: bytes | None) -> bool:
    return line is not None and (not line or line.isspace())


def count_records(path: str, fmt: str, text_field: str, limit: int | None = None) -> tuple[int, bool, list]:
    """(records, exhaustive, marks): the file's record count, or `limit` (exhaustive False) when it has at least
    that many; and for a plain JSONL file its seek marks, [records before, lines before, byte offset] at line
    starts about every MARK_BYTES (at most MARKS of them), from which a reader of a range of records starts,
    and at which it stops, instead of at the file's ends (shards.Piece). A Parquet file without the text column
    is a config error."""
    if fmt == PARQUET:
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as e:
            raise DataPrepError(f"{path} is not a readable Parquet file ({type(e).__name__}: {e})") from None
        names = pf.schema_arrow.names
        if text_field not in names:
            raise DataPrepError(f"{path} has no column {text_field!r} (text_field); its columns: {', '.join(names)}")
        n = pf.metadata.num_rows
        return ((n, True) if limit is None or n < limit else (limit, n == limit)) + ([],)
    n = lineno = 0
    marks: list = []
    spacing = max(MARK_BYTES, -(-os.path.getsize(path) // MARKS)) if fmt == JSONL else 0
    try:
        with open_binary(path, fmt) as f:
            for offset, block in text_blocks(f, BLOCK_BYTES, rewind=fmt == JSONL):
                starts = records_before = None  # of the block's lines (for the marks)
                if block is None:  # one line, too long: a record (a bad one)
                    lines, records = 1, 1
                elif (starts := plain_starts(block, len(block))) is not None:  # (a long line is still a record)
                    lines = records = len(starts)
                else:
                    kept = [not _blank(line) for line in split(block, BLOCK_BYTES)]
                    lines, records = len(kept), sum(kept)
                    if spacing:
                        starts, records_before = line_starts(block), np.cumsum([0] + kept[:-1])
                if spacing:
                    marks += _marks(n, lineno, offset, starts, records_before, spacing,
                                    marks[-1][2] if marks else -spacing)
                if limit is not None and n + records >= limit:
                    return limit, False, marks
                n, lineno = n + records, lineno + lines
    except (OSError, EOFError) as e:  # truncated or corrupt compressed data
        raise DataPrepError(f"{path} cannot be read to the end ({type(e).__name__}: {e})") from None
    return n, True, marks


def _marks(n: int, lineno: int, offset: int, starts, records_before, spacing: int, last: int) -> list:
    """A block's seek marks (count_records): for every multiple of `spacing` in the file after the last mark (at
    byte `last`), the first line that starts at or after it. `starts`: the offsets of the block's lines (None:
    one line, too long to hold); `records_before`: the records among the lines before each (None: every line
    is one)."""
    starts = np.zeros(1, np.int64) if starts is None else starts
    targets = np.arange((last // spacing + 1) * spacing, offset + int(starts[-1]) + 1, spacing) - offset
    lines = np.unique(np.searchsorted(starts, np.maximum(targets, 0)))
    records = lines if records_before is None else records_before[lines]
    return [[n + r, lineno + i, offset + at]
            for r, i, at in zip(records.tolist(), lines.tolist(), starts[lines].tolist())]


def read_texts(path: str, fmt: str, text_field: str, start: int, end: int, bad: BadRecords,
               max_bytes: int = MAX_RECORD_BYTES, mark: list | None = None,
               stop: int | None = None) -> Iterator[tuple]:
    """Blocks of the good records numbered [start, end) in the file, in order: (input bytes, texts), the texts
    a pyarrow large_string array. `mark`: a seek mark of the file (count_records) at or before `start`;
    `stop`: the byte offset of one at or after `end` (no record of the range lies past it)."""
    if fmt == PARQUET:
        yield from _parquet_texts(path, text_field, start, end, bad, max_bytes)
        return
    n, lineno, offset = mark if mark and fmt == JSONL else (0, 0, 0)  # records and lines before `offset`
    with open_binary(path, fmt) as f:
        if offset:
            f.seek(offset)
        for _, block in text_blocks(f, max_bytes, offset, rewind=fmt == JSONL,
                                    stop=stop if fmt == JSONL else None):
            if n >= end:
                return
            if block is None:  # one line, too long
                lineno += 1
                if n >= start:
                    too_long(f"{path}:{lineno}", max_bytes, bad)
                n += 1
                continue
            starts = plain_starts(block, max_bytes)
            if starts is not None:  # every line a record: the lines of the range, decoded at once
                count = len(starts)
                a, b = max(start - n, 0), min(end - n, count)
                if a < b:
                    lo, hi = int(starts[a]), int(starts[b]) if b < count else len(block)
                    first = lineno + a + 1
                    yield hi - lo, jsonl_block(path, block[lo:hi] if hi - lo < len(block) else block, b - a,
                                                lambda i: first + i, text_field, bad)
                n, lineno = n + count, lineno + count
                continue
            kept, linenos = [], []  # line by line: blank or too long lines, or an end of the range
            for lineno, line in enumerate(split(block, max_bytes), lineno + 1):
                if _blank(line):
                    continue
                if start <= n < end:
                    if line is None:
                        too_long(f"{path}:{lineno}", max_bytes, bad)
                    else:
                        kept.append(line)
                        linenos.append(lineno)
                n += 1
            if kept:
                texts = jsonl_block(path, b"\n".join(kept), len(kept), linenos.__getitem__, text_field, bad)
                if len(texts):
                    yield sum(map(len, kept)) + len(kept), texts


def _parquet_texts(path: str, text_field: str, start: int, end: int, bad: BadRecords,
                   max_bytes: int) -> Iterator[tuple]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    groups, first = row_groups(pf, start, end)
    if not groups:
        return
    row = first
    for batch in pf.iter_batches(batch_size=1024, row_groups=groups, columns=[text_field], use_threads=False):
        lo, hi = max(start - row, 0), min(end - row, batch.num_rows)
        column, base = batch.column(0).slice(lo, hi - lo), row + lo
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            texts = checked(column, lambda i: f"{path}:row={base + i}", text_field, bad, max_bytes)
        else:  # bytes, numbers, ...: value by value
            texts = [value_text(v, text_field, f"{path}:row={base + i}", bad)
                     for i, v in enumerate(column.to_pylist())]
            for i, t in enumerate(texts):
                if t is not None and len(t.encode()) > max_bytes:
                    too_long(f"{path}:row={base + i}", max_bytes, bad)
                    texts[i] = None
            texts = pa.array([t for t in texts if t is not None], pa.large_string())
        if len(texts):
            yield texts.nbytes, texts
        row += batch.num_rows
        if row >= end:
            return


def scan(path: str, fmt: str, text_field: str, cached: dict | None = None, limit: int | None = None) -> dict:
    """A source entry of the plan: {path, format, text_field, fingerprint, records, exhaustive}. The records
    are counted again only when `cached` (the entry of an earlier run) does not match the fingerprint or
    did not count far enough; `limit` stops counting there (sample runs)."""
    try:
        fp = fingerprint(path)
    except OSError as e:
        raise DataPrepError(f"{path} is not readable ({e.strerror})") from None
    entry = {"path": path, "format": fmt, "text_field": text_field, "fingerprint": fp}
    if cached and all(cached.get(k) == entry[k] for k in entry if k != "path"):  # the same content anywhere
        n, full, marks = cached["records"], cached["exhaustive"], cached.get("marks") or []
        if full:
            return {**entry, "records": n if limit is None else min(n, limit),
                    "exhaustive": limit is None or n <= limit, "marks": marks}
        if limit is not None and n >= limit:
            return {**entry, "records": limit, "exhaustive": False, "marks": marks}
    n, full, marks = count_records(path, fmt, text_field, limit)
    return {**entry, "records": n, "exhaustive": full, "marks": marks}


def row_groups(pf, start: int, end: int) -> tuple[list[int], int | None]:
    """The row groups of a ParquetFile that hold rows [start, end), and the first row of the first one."""
    groups, first, offset = [], None, 0
    for g in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(g).num_rows
        if offset + rows > start and offset < end:
            groups.append(g)
            first = offset if first is None else first
        offset += rows
    return groups, first
