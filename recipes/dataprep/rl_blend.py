"""One RL blend, prepared by one Ray task: its rows checked, its placeholders restored (or dropped where
their source is not given), its last `val_rows` records held out, written as train.jsonl and val.jsonl.

A *record* is a non-blank line; lines are numbered from 1 as in the file. The split is by record position in
the blend as published: the last `val_rows` records are validation (those of the first `sample` records on a
sampled run), whatever is dropped, so restoring placeholders or not never moves a row between the splits.
A row kept as published is written with its own bytes (a byte-order mark and surrounding whitespace removed);
a restored row as Python's json.dumps writes it.

The task writes into the run's staging directory: both files under temporary names, fsynced, renamed, and
only then its receipt `<blend>.json` (the counts, sizes and SHA-256 of both files, and the key: a hash of
everything the files depend on). A later run reuses a blend whose receipt has the same key and whose files
have the recorded sizes; anything else is written again from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

from . import rl_records as records
from .errors import BadRecordError, DataPrepError
from .bad_records import BadRecords
from .inputs import open_binary
from .line_reader import lines, over
from .files import TMP_MARK, fsync_dir, tmp_name, write_json

FORMAT = "ultra3-rl-jsonl/1"
SPLITS = ("train", "val")
BOM = b"\xef\xbb\xbf"


@dataclass
class BlendTask:
    name: str
    path: str  # the blend's JSONL (plain, .gz or .zst)
    fmt: str
    fingerprint: dict
    staging: str
    limit: int | None  # `sample`: only the first records
    val_rows: int
    strict: bool
    sources: dict  # {source: [{path, format, fingerprint}]}, the sources given
    max_bytes: int  # max_record_bytes

    @property
    def key(self) -> str:
        what = {k: v for k, v in asdict(self).items() if k not in ("staging", "path")}  # content, not place
        what["sources"] = {s: [{k: v for k, v in f.items() if k != "path"} for f in files]
                           for s, files in self.sources.items()}
        return hashlib.sha256(json.dumps({"format": FORMAT, **what}, sort_keys=True).encode()).hexdigest()

    @property
    def directory(self) -> str:
        return os.path.join(self.staging, self.name)

    @property
    def receipt(self) -> str:
        return os.path.join(self.staging, f"{self.name}.json")


def finished(task: BlendTask) -> dict | None:
    """The receipt of a blend an earlier run prepared with the same key, its files still the recorded size."""
    try:
        with open(task.receipt, encoding="utf-8") as f:
            receipt = json.load(f)
        if receipt.get("key") == task.key and all(
                os.path.getsize(os.path.join(task.directory, f"{s}.jsonl")) == receipt[s]["bytes"] for s in SPLITS):
            return receipt
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


class _Writer:
    """A split file written under a temporary name, hashed as it goes."""

    def __init__(self, path: str) -> None:
        self.path, self.tmp = path, tmp_name(path)
        self.file = open(self.tmp, "wb", buffering=1 << 20)
        self.hash, self.rows, self.bytes = hashlib.sha256(), 0, 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.hash.update(data)
        self.rows += 1
        self.bytes += len(data)

    def finish(self) -> dict:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return {"file": os.path.basename(self.path), "rows": self.rows, "bytes": self.bytes,
                "sha256": self.hash.hexdigest()}

    def abort(self) -> None:
        self.file.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


def _records(task: BlendTask):
    """(record number, line number, line) of the blend's records, the first `limit` of them; a line longer
    than max_record_bytes is None."""
    n = 0
    with open_binary(task.path, task.fmt) as f:
        for lineno, line in enumerate(lines(f, task.max_bytes), 1):
            if task.limit is not None and n >= task.limit:
                return
            line = line if line is None else line.strip()
            if line is None:
                yield n, lineno, None
                n += 1
            elif line:
                yield n, lineno, line.removeprefix(BOM)
                n += 1


def _scan(task: BlendTask) -> tuple[int, dict]:
    """The number of records and the source rows the placeholders ask for ({source: {row}}); a malformed
    placeholder is left for the writing pass to report in its place."""
    total, wanted = 0, {}
    for n, _, line in _records(task):
        total = n + 1
        if line is not None and records.MARK in line:
            row, _, _ = records.parse(line)
            found = records.placeholder(row) if row is not None and records.PLACEHOLDER in row else None
            if isinstance(found, tuple):
                wanted.setdefault(found[0], set()).add(found[1])
    return total, wanted


def prepare_blend(task: BlendTask) -> dict:
    """Write the blend's split files into staging and its receipt; the receipt."""
    os.makedirs(task.directory, exist_ok=True)
    for name in os.listdir(task.directory):  # leftovers of an interrupted run
        if TMP_MARK in name:
            os.unlink(os.path.join(task.directory, name))
    total, wanted = _scan(task)
    if total <= task.val_rows:
        raise DataPrepError(f"blend {task.name} ({task.path}) has {total:,} record(s), not more than val_rows="
                            f"{task.val_rows}: nothing left to train on; lower val_rows")
    fetched = {s: records.fetch([(e["path"], e["format"]) for e in task.sources[s]], rows, task.max_bytes)
               for s, rows in sorted(wanted.items()) if s in task.sources}
    writers = {s: _Writer(os.path.join(task.directory, f"{s}.jsonl")) for s in SPLITS}
    counts = {k: {} for k in ("found", "restored", "dropped")}
    bad = BadRecords()
    try:
        for n, lineno, line in _records(task):
            if line is None:
                data, kind, problem = None, "too_long", over(task.max_bytes)
            else:
                data, kind, problem = _row(line, fetched, counts)
            if problem:
                where = f"{task.path}:{lineno}"
                if task.strict:
                    raise BadRecordError(f"{where}: {problem}")
                bad.add(kind, where, problem)
            elif data:
                writers["val" if n >= total - task.val_rows else "train"].write(data)
        files = {s: w.finish() for s, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    fsync_dir(task.directory)
    receipt = {"key": task.key, "blend": task.name, "rows_in": total, **files,
               "placeholders": {k: dict(sorted(v.items())) for k, v in counts.items()},
               "bad_rows": bad.total, "bad": bad.to_json()}
    write_json(task.receipt, receipt)
    return receipt


def _row(line: bytes, fetched: dict, counts: dict) -> tuple[bytes | None, str, str]:
    """(the bytes to write, or None for a dropped placeholder; kind of bad record; what is wrong; the fix)."""
    row, kind, problem = records.parse(line)
    if row is None:
        return None, kind, problem
    data, source = line + b"\n", None
    if records.PLACEHOLDER in row:
        found = records.placeholder(row)
        if isinstance(found, str):
            return None, "bad_placeholder", found
        source, index = found
        _count(counts["found"], source)
        if source not in fetched:
            _count(counts["dropped"], source)
            return None, "", ""
        rows, size = fetched[source]
        value = rows.get(index, f"{records.PLACEHOLDER}.row {index} is beyond the {size:,} rows of {source}")
        if isinstance(value, str):
            return None, "bad_placeholder", f"{value}; set placeholders.{source} to the dataset the blend was made from"
        row = records.restore(row, source, *value)
        try:
            data = json.dumps(row, ensure_ascii=False).encode() + b"\n"
        except UnicodeEncodeError:  # a lone surrogate from a \ud800-style escape: keep it escaped
            data = json.dumps(row).encode() + b"\n"
    problem = records.check(row)
    if problem:
        return None, "bad_fields", problem
    if source:
        _count(counts["restored"], source)
    return data, "", ""


def _count(counter: dict, key: str) -> None:
    counter[key] = counter.get(key, 0) + 1
