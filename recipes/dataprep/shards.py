"""Shards: planning them from the inputs, tokenizing one, and its receipt.

Plan. A dataset's records are numbered in file order (files sorted by path, records in file order) and
cut into `num_shards` contiguous ranges of (nearly) equal record counts: shard i holds records
[i*N // n, (i+1)*N // n). The plan is a function of the input files and the config only, never of the
number of workers or their timing, so every run writes the same bytes.

Shard. `write_shard` reads its records in blocks (inputs.read_texts), tokenizes each block (encoders.py:
gigatoken where it reproduces `tokenizers` exactly, else `tokenizers`; the same bytes either way), appends
EOD and writes `shard_NNNNNN.bin/.idx` (numpy arrays, one write per block) under temporary names
(`*.tmp-<random>`); `publish` fsyncs them, renames them to their final names, and only then writes the
receipt `shard_NNNNNN.json` (again tmp + rename). The task publishes its shard itself, or, where the driver
runs on the same machine (the process pool), the driver's Publisher does while the worker goes on to its next
shard. No shard is visible under its final name half-written, and a shard without a valid receipt is written
again from scratch.

Receipt. It records the shard's plan hash (SHA-256 of everything its bytes depend on: the input files'
fingerprints (content, not paths) and record range, the tokenizer's SHA-256, EOD, dtype, text field, format
version) and the sizes and SHA-256 of both files. A later run skips a shard whose receipt has the same plan hash and
whose files still have the recorded sizes and are not newer than the receipt (`verify: checksum` also re-hashes
them).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from . import encoders
from .indexed import IndexedWriter
from .files import TMP_MARK, fsync_dir, fsync_file, sha256_file, tmp_name, write_json
from .bad_records import BadRecords
from .inputs import read_texts

FORMAT = "ultra3-binidx/1"
SHARD_NAME = "shard_{:06d}"
SHARD_FILE = re.compile(r"^shard_(\d{6})\.(bin|idx|json)$")
PROGRESS_EVERY_S = 1.0


@dataclass
class Piece:
    file: str
    fmt: str
    fingerprint: dict
    start: int  # record numbers in the file, [start, end)
    end: int
    # where reading starts and where it may stop (inputs.count_records' seek marks); not in the plan hash: no
    # byte depends on them
    mark: list | None = None
    stop: int | None = None


@dataclass
class ShardTask:
    dataset: str
    index: int
    directory: str  # the dataset's output directory
    text_field: str
    max_bytes: int  # max_record_bytes
    pieces: list = field(default_factory=list)  # of Piece
    records: int = 0
    est_bytes: int = 0  # input bytes, estimated (for scheduling the largest first)
    plan_hash: str = ""

    @property
    def name(self) -> str:
        return SHARD_NAME.format(self.index)

    @property
    def prefix(self) -> str:
        return os.path.join(self.directory, self.name)

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.name}"


def ranges(total: int, n: int) -> list[tuple[int, int]]:
    return [(i * total // n, (i + 1) * total // n) for i in range(n)]


def plan_dataset(name: str, directory: str, text_field: str, sources: list[dict], num_shards: int,
                 tokenizer_sha: str, eod_id: int, dtype: str, max_bytes: int) -> list[ShardTask]:
    """`sources`: [{path, format, fingerprint, records}] in order; shards of contiguous record ranges."""
    total = sum(s["records"] for s in sources)
    n = max(1, min(num_shards, total))
    starts = list(itertools.accumulate([0] + [s["records"] for s in sources]))
    tasks = []
    for i, (lo, hi) in enumerate(ranges(total, n)):
        task = ShardTask(dataset=name, index=i, directory=directory, text_field=text_field, max_bytes=max_bytes,
                         records=hi - lo)
        for s, first in zip(sources, starts):
            a, b = max(lo, first), min(hi, first + s["records"])
            if a < b:
                marks = s.get("marks") or []
                task.pieces.append(Piece(s["path"], s["format"], s["fingerprint"], a - first, b - first,
                                         _mark(marks, a - first), _stop(marks, b - first)))
                task.est_bytes += s["fingerprint"]["bytes"] * (b - a) // max(s["records"], 1)
        task.plan_hash = hashlib.sha256(json.dumps({
            "format": FORMAT, "tokenizer_sha256": tokenizer_sha, "eod_id": eod_id, "dtype": dtype,
            "text_field": text_field, "max_record_bytes": max_bytes,
            "pieces": [{k: v for k, v in asdict(p).items() if k not in ("file", "mark", "stop")} for p in task.pieces],
        }, sort_keys=True).encode()).hexdigest()
        tasks.append(task)
    return tasks


def _mark(marks: list, record: int) -> list | None:
    """The last seek mark at or before `record`."""
    i = bisect.bisect_right([m[0] for m in marks], record)
    return marks[i - 1] if i else None


def _stop(marks: list, record: int) -> int | None:
    """The byte offset of the first mark at or after `record`: no record before it lies past it."""
    i = bisect.bisect_left([m[0] for m in marks], record)
    return marks[i][2] if i < len(marks) else None


def receipt_path(task: ShardTask) -> str:
    return task.prefix + ".json"


def read_receipt(task: ShardTask, verify: str = "size") -> dict | None:
    """The shard's receipt if the shard is complete for this plan, else None."""
    path = receipt_path(task)
    try:
        with open(path, encoding="utf-8") as f:
            receipt = json.load(f)
        receipt_mtime = os.stat(path).st_mtime_ns
    except (OSError, ValueError):
        return None
    if not isinstance(receipt, dict) or receipt.get("format") != FORMAT or receipt.get("plan_hash") != task.plan_hash:
        return None
    for ext in ("bin", "idx"):
        want = receipt.get(ext) or {}
        try:
            st = os.stat(f"{task.prefix}.{ext}")
        except OSError:
            return None
        if st.st_size != want.get("bytes") or st.st_mtime_ns > receipt_mtime:
            return None
        if verify == "checksum" and sha256_file(f"{task.prefix}.{ext}") != want.get("sha256"):
            return None
    return receipt


def clean_dataset_dir(directory: str, shards: int) -> list[str]:
    """Remove leftovers of interrupted runs (temporary files) and shards numbered past the plan's."""
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        m = SHARD_FILE.match(name)
        stale = (TMP_MARK in name and name.startswith("shard_")) or (m and int(m.group(1)) >= shards)
        if stale:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    return removed


def invalidate(task: ShardTask) -> None:
    """Before a shard is (re)written: its receipt goes first, so a half-done rewrite is never taken as done."""
    path = receipt_path(task)
    if os.path.exists(path):
        os.unlink(path)
        fsync_dir(task.directory)


# ---- the work ------------------------------------------------------------------------------------------

def _blocks(task: ShardTask, bad: BadRecords):
    """(input bytes, texts) blocks of the shard's good records, in order (inputs.read_texts)."""
    for piece in task.pieces:
        yield from read_texts(piece.file, piece.fmt, task.text_field, piece.start, piece.end, bad, task.max_bytes,
                              piece.mark, piece.stop)


# what a worker imports: the pool's server imports it once, before it forks the workers (cluster.start)
PRELOAD = ("numpy", "pyarrow", "pyarrow.json", "pyarrow.compute", "tokenizers", "awkward", "gigatoken", __name__)


def warm(tokenizer_json: str, tokenizer_sha: str, mode: str, threads: int = 1) -> tuple[str, str | None]:
    """A warm-up task, one per worker before the first shard: what a shard task would otherwise wait for
    (imports, encoders), and the encoder check (encoders.choose), made where the shards are encoded. Returns
    (encoder, why gigatoken is not used or None), or ("", the error) when `encoder: gigatoken` cannot be used."""
    import pyarrow.compute  # noqa: F401 (record_texts imports them)
    import pyarrow.json  # noqa: F401

    try:
        encoder, why = encoders.choose(mode, tokenizer_json, tokenizer_sha)
    except encoders.EncoderError as e:
        return "", str(e)
    encoders.ShardEncoder(encoder, tokenizer_json, tokenizer_sha, threads).encode(["warm-up"], 0, np.dtype(np.int32))
    return encoder, why


def write_shard(*args, **kwargs) -> dict:
    """Tokenize one shard into its .bin/.idx and write its receipt (`shard_steps` to its end); returns the
    receipt."""
    *_, receipt = shard_steps(*args, **kwargs)
    return receipt


def shard_steps(task: ShardTask, tokenizer_json: str, tokenizer_sha: str, eod_id: int, dtype: str,
                strict: bool = False, threads: int = 1, encoder: str = "tokenizers",
                encoder_required: bool = False, publish_here: bool = True) -> Iterator:
    """Tokenize one shard into its .bin/.idx and write its receipt. Yields the shard's progress, (records,
    docs, tokens, input bytes), about once a second, and last the receipt (a Ray streaming generator: the
    driver reads the progress with the results, no process in between).

    `encoder`: "gigatoken" (checked against `tokenizers` on the shard's first documents first: on a
    mismatch the shard is encoded with `tokenizers`, or with `encoder_required` an EncoderError) or
    "tokenizers". The bytes are the same either way.

    `publish_here` False (a driver on the same machine, whose Publisher does it): the files stay under their
    temporary names, unsynced and without a receipt, named in the receipt returned (`_tmp`), so that the worker
    goes on to its next shard instead of waiting on the disk."""
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(threads, 1)))
    started = time.time()
    enc = encoders.ShardEncoder(encoder, tokenizer_json, tokenizer_sha, threads, encoder_required)
    np_dtype = np.dtype(dtype)
    os.makedirs(task.directory, exist_ok=True)
    invalidate(task)
    tmp = {ext: tmp_name(f"{task.prefix}.{ext}") for ext in ("bin", "idx")}
    tmp["lengths"] = tmp_name(task.prefix + ".lengths")
    writer = IndexedWriter(tmp["bin"], tmp["idx"], dtype, tmp["lengths"])
    bad = BadRecords(strict=strict)
    read_bytes, last = 0, time.time()
    try:
        for size, texts in _blocks(task, bad):
            writer.add(*enc.encode(texts, eod_id, np_dtype))
            read_bytes += size
            if time.time() - last >= PROGRESS_EVERY_S:
                yield writer.docs + bad.total, writer.docs, writer.tokens, read_bytes
                last = time.time()
        stats = writer.finish()
    except BaseException:
        writer.abort()
        for path in tmp.values():
            if os.path.exists(path):
                os.unlink(path)
        raise
    receipt = {
        "format": FORMAT,
        "dataset": task.dataset,
        "shard": task.index,
        "plan_hash": task.plan_hash,
        "records": task.records,
        "docs": stats["docs"],
        "tokens": stats["tokens"],
        "dtype": dtype,
        "bad": bad.to_json(),
        "bin": stats["bin"],
        "idx": stats["idx"],
    }
    if publish_here:
        publish(task, tmp, receipt)
    else:
        receipt["_tmp"] = {ext: tmp[ext] for ext in ("bin", "idx")}
    # returned to the driver only, not written (the bytes do not depend on the encoder)
    receipt["_input_bytes"] = read_bytes
    receipt["_started"] = started
    receipt["_seconds"] = round(time.time() - started, 3)
    receipt["_encoder"] = enc.name
    receipt["_encoder_fallback"] = enc.fallback
    yield receipt


def publish(task: ShardTask, tmp: dict, receipt: dict) -> None:
    """Make a written shard final: its files (`tmp`: their temporary names) fsynced and renamed to their final
    names, then its receipt written (tmp + fsync + rename). A crash before the receipt leaves the shard to be
    written again. The driver's Publisher calls it from another process of the same machine (one page cache)."""
    for ext in ("bin", "idx"):
        fsync_file(tmp[ext])
    for ext in ("bin", "idx"):
        os.replace(tmp[ext], f"{task.prefix}.{ext}")
    fsync_dir(task.directory)
    write_json(receipt_path(task), {k: v for k, v in receipt.items() if not k.startswith("_")})


class Publisher:
    """The driver's thread that publishes (`publish`) the shards written with `publish_here` False, in the order
    they come, so that the workers never wait on the disk; `published` holds the time each shard was done,
    whoever published it. Leaving it (`with`) publishes what is queued, since those shards are whole; an error
    publishing stops it and is raised there."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.published: dict = {}  # shard key -> time.time() of its receipt
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="publish-shards", daemon=True)
        self.thread.start()

    def put(self, task: ShardTask, receipt: dict) -> None:
        """A shard task's receipt: queued when its shard is still to publish (`_tmp`), else done now."""
        if "_tmp" in receipt:
            self.queue.put((task, receipt))
        else:
            self.published[task.key] = time.time()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                task, receipt = item
                try:
                    publish(task, receipt["_tmp"], receipt)
                    self.published[task.key] = time.time()
                except BaseException as e:  # the rest stays unpublished: written again by the next run
                    self.error = e

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error
