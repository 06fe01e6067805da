"""Input files: finding them (paths, globs, directories), recognising their format, fingerprinting and
counting their records, reading a range of records, and accounting for bad records.

Formats: JSON Lines, plain, gzip or zstd compressed (recognised by their magic bytes, whatever the file
is called), and Parquet. A *record* is a non-blank line of a JSONL file or a row of a Parquet file; record
numbers count from 0 in each file, in file order. Blank lines are skipped everywhere and are not records.

A record whose text cannot be used is a *bad record*, one of BAD_KINDS. It is counted (with the first
few places it happened, as `file:line` or `file:row=N`) and skipped, or under `strict` it stops the run.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from .errors import BadRecordError, DataPrepError

JSONL, JSONL_GZ, JSONL_ZST, PARQUET = "jsonl", "jsonl.gz", "jsonl.zst", "parquet"
# what a glob or a directory picks up (an explicitly named file is read whatever its name)
EXTENSIONS = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl.zst", ".json.zst",
              ".ndjson.zst", ".jsonl.zstd", ".parquet")
BAD_KINDS = ("invalid_json", "missing_field", "not_a_string", "bad_utf8", "empty_text")
MAX_EXAMPLES = 5  # places kept per kind of bad record, per shard and per dataset
FINGERPRINT_BYTES = 1 << 20


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
    """Size, modification time and the SHA-256 of the first and last MiB: cheap on huge files, and it
    changes whenever a file is rewritten, appended to or replaced."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if st.st_size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, st.st_size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256_head_tail": h.hexdigest()}


def open_binary(path: str, fmt: str) -> io.BufferedIOBase:
    if fmt == JSONL_GZ:
        return gzip.open(path, "rb")
    if fmt == JSONL_ZST:
        import zstandard

        raw = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


def _blank(line: bytes) -> bool:
    return not line or line.isspace()


def count_records(path: str, fmt: str, text_field: str, limit: int | None = None) -> tuple[int, bool]:
    """(records, exhaustive): the file's record count, or `limit` (exhaustive False) when it has at least
    that many. A Parquet file without the text column is a config error."""
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
        return (n, True) if limit is None or n < limit else (limit, n == limit)
    n = 0
    try:
        with open_binary(path, fmt) as f:
            for line in f:
                if not _blank(line):
                    n += 1
                    if limit is not None and n >= limit:
                        return n, False
    except (OSError, EOFError) as e:  # truncated or corrupt compressed data
        raise DataPrepError(f"{path} cannot be read to the end ({type(e).__name__}: {e})") from None
    return n, True


@dataclass
class BadRecords:
    """Counts of bad records by kind, with the first MAX_EXAMPLES places of each kind."""

    strict: bool = False
    counts: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)

    def add(self, kind: str, where: str, detail: str) -> None:
        if self.strict:
            raise BadRecordError(f"bad record ({kind}) at {where}: {detail} (strict: true)")
        self.counts[kind] = self.counts.get(kind, 0) + 1
        seen = self.examples.setdefault(kind, [])
        if len(seen) < MAX_EXAMPLES:
            seen.append(f"{where}: {detail}")

    def merge(self, counts: dict, examples: dict) -> None:
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        for kind, places in examples.items():
            seen = self.examples.setdefault(kind, [])
            seen += places[: MAX_EXAMPLES - len(seen)]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict:
        order = {k: i for i, k in enumerate(BAD_KINDS)}
        kinds = sorted(self.counts, key=lambda k: (order.get(k, len(order)), k))
        return {"counts": {k: self.counts[k] for k in kinds}, "examples": {k: self.examples[k] for k in kinds}}


def _json_text(line: bytes, text_field: str, where: str, bad: BadRecords) -> str | None:
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        bad.add("bad_utf8", where, f"invalid UTF-8 at byte {e.start}")
        return None
    if s.startswith("\ufeff"):  # a byte-order mark (first line of some files)
        s = s[1:]
    try:
        obj = json.loads(s)
    except ValueError as e:
        bad.add("invalid_json", where, str(e))
        return None
    if not isinstance(obj, dict):
        bad.add("invalid_json", where, f"a JSON {type(obj).__name__}, not an object")
        return None
    return _text(obj.get(text_field), text_field, where, bad, escaped="\\u" in s)


def _text(value, text_field: str, where: str, bad: BadRecords, escaped: bool = True) -> str | None:
    if value is None:
        bad.add("missing_field", where, f"no {text_field!r} field")
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as e:
            bad.add("bad_utf8", where, f"invalid UTF-8 at byte {e.start}")
            return None
    if not isinstance(value, str):
        bad.add("not_a_string", where, f"{text_field!r} is a {type(value).__name__}")
        return None
    if escaped:  # JSON \ud800-style escapes give lone surrogates, which are not text
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            bad.add("bad_utf8", where, f"lone surrogate at character {e.start}")
            return None
    if not value.strip():
        bad.add("empty_text", where, f"{text_field!r} is empty")
        return None
    return value


def read_texts(path: str, fmt: str, text_field: str, start: int, end: int,
               bad: BadRecords) -> Iterator[tuple[int, str]]:
    """(record size in bytes, text) of each good record numbered [start, end) in the file, in order."""
    if fmt == PARQUET:
        yield from _parquet_texts(path, text_field, start, end, bad)
        return
    n = 0  # record number of the next non-blank line
    with open_binary(path, fmt) as f:
        for lineno, line in enumerate(f, 1):
            if _blank(line):
                continue
            if n >= start:
                if n >= end:
                    return
                text = _json_text(line, text_field, f"{path}:{lineno}", bad)
                if text is not None:
                    yield len(line), text
            n += 1


def _parquet_texts(path: str, text_field: str, start: int, end: int,
                   bad: BadRecords) -> Iterator[tuple[int, str]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    groups, first = row_groups(pf, start, end)
    if not groups:
        return
    row = first
    for batch in pf.iter_batches(batch_size=1024, row_groups=groups, columns=[text_field], use_threads=False):
        values = batch.column(0).to_pylist()
        lo, hi = max(start - row, 0), min(end - row, len(values))
        for i in range(lo, hi):
            text = _text(values[i], text_field, f"{path}:row={row + i}", bad)
            if text is not None:
                yield len(text), text
        row += len(values)
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
    if cached and all(cached.get(k) == entry[k] for k in entry):
        n, full = cached["records"], cached["exhaustive"]
        if full:
            return {**entry, "records": n if limit is None else min(n, limit),
                    "exhaustive": limit is None or n <= limit}
        if limit is not None and n >= limit:
            return {**entry, "records": limit, "exhaustive": False}
    n, full = count_records(path, fmt, text_field, limit)
    return {**entry, "records": n, "exhaustive": full}


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
