"""SFT conversations of one input partition -> token ids and loss masks on disk (one Ray task each).

A partition is a contiguous range of records of one dataset (possibly across its files), numbered the way
`inputs` numbers them. For each record: parse it (JSONL line or Parquet row), validate the messages
(`chat.conversation`), render them through the chat template, tokenize once with offsets and mask
(`chat.encode`). Bad records are counted by kind with their `file:line` (`bad_records.BadRecords`).

Output, written atomically under the run's staging directory:

* `part_NNNNNN.ids`  raw little-endian int32, the token ids of the good conversations back to back;
* `part_NNNNNN.mask` raw int8, 1 on the tokens the model is trained to produce;
* `part_NNNNNN.npz`  the receipt, written last (both files synced first): what is returned to the driver, so
  that a later run (the next allocation, after the time-limit signal) takes the partition as done (`kept`).

Returned to the driver (small): per good conversation its token count, its first trained position
(>= 1), its trained-token count and a 64-bit content key (for the deterministic split); the bad-record
counts. Nothing here depends on the worker count or on timing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from dataclasses import asdict, dataclass, field

import numpy as np

from . import chat
from .bad_records import BadRecords
from .inputs import PARQUET, open_binary, row_groups
from .record_texts import too_long
from .line_reader import lines
from .files import fsync_file, tmp_name, write_atomic

BATCH = 256  # conversations per encode_batch call
# kinds of bad records counted here: invalid_json, bad_utf8 (read); missing_field, bad_messages, no_assistant
# (chat.conversation); template_error (rendering)
BAD_KINDS = ("invalid_json", "missing_field", "bad_utf8", "bad_messages", "no_assistant", "template_error")


@dataclass
class Piece:
    file: str
    fmt: str
    start: int  # record numbers in the file, [start, end)
    end: int


@dataclass
class Partition:
    index: int
    dataset: str
    messages_field: str
    max_bytes: int  # max_record_bytes
    pieces: list = field(default_factory=list)  # of Piece
    records: int = 0

    @property
    def stem(self) -> str:
        return f"part_{self.index:06d}"


def read_records(piece: Piece, bad: BadRecords, max_bytes: int):
    """(where, record) of each parsable record numbered [start, end) of the piece's file, in order."""
    if piece.fmt == PARQUET:
        yield from _parquet_records(piece)
        return
    n = 0  # record number of the next non-blank line
    with open_binary(piece.file, piece.fmt) as f:
        for lineno, line in enumerate(lines(f, max_bytes), 1):
            if line is not None and (not line or line.isspace()):
                continue
            if n >= piece.start:
                if n >= piece.end:
                    return
                where = f"{piece.file}:{lineno}"
                if line is None:
                    too_long(where, max_bytes, bad)
                    n += 1
                    continue
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    bad.add("bad_utf8", where, f"invalid UTF-8 at byte {e.start}")
                else:
                    try:
                        yield where, json.loads(text)
                    except ValueError as e:
                        bad.add("invalid_json", where, str(e))
            n += 1


def _parquet_records(piece: Piece):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(piece.file)
    groups, first = row_groups(pf, piece.start, piece.end)
    if not groups:
        return
    row = first
    for batch in pf.iter_batches(batch_size=512, row_groups=groups, use_threads=False):
        records = batch.to_pylist()
        lo, hi = max(piece.start - row, 0), min(piece.end - row, len(records))
        for i in range(lo, hi):
            yield f"{piece.file}:row={row + i}", records[i]
        row += len(records)
        if row >= piece.end:
            return


def content_key(dataset: str, messages: list, tools: list) -> int:
    """64-bit key of a conversation's content (format-independent: the same conversation from JSONL or
    Parquet gets the same key), salted by its dataset."""
    canon = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.blake2b(f"{dataset}\0{canon}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


_CACHE: dict = {}


def _tools(tokenizer_json: str, template_source: str, template_name: str):
    key = (hashlib.sha256(tokenizer_json.encode()).hexdigest(), template_source)
    if _CACHE.get("key") != key:
        from tokenizers import Tokenizer

        _CACHE.clear()
        _CACHE.update(key=key, tok=Tokenizer.from_str(tokenizer_json),
                      template=chat.ChatTemplate(template_source, template_name))
    return _CACHE["tok"], _CACHE["template"]


def tokenize_partition(part: Partition, staging: str, tokenizer_json: str, template_source: str,
                       template_name: str, strict: bool = False) -> dict:
    """Tokenize one partition into its part files (streamed: memory stays at one batch); returns the
    per-conversation arrays and the bad records."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok, template = _tools(tokenizer_json, template_source, template_name)
    bad = BadRecords(strict=strict)
    lengths: list[int] = []
    keys: list[int] = []
    first_loss: list[int] = []
    loss_tokens: list[int] = []
    pending: list[tuple[str, str, list, int]] = []  # (where, text, spans, key)
    final = {name: os.path.join(staging, f"{part.stem}.{name}") for name in ("ids", "mask")}
    tmp = {name: tmp_name(path) for name, path in final.items()}
    files = {name: open(path, "wb", buffering=1 << 20) for name, path in tmp.items()}  # noqa: SIM115 (closed below)

    def flush() -> None:
        encodings = tok.encode_batch([p[1] for p in pending], add_special_tokens=False)
        for (where, text, spans, key), enc in zip(pending, encodings):
            try:
                e = chat.masked(enc, spans)
            except chat.BadRecord as err:
                bad.add(err.kind, where, str(err))
                continue
            nz = np.flatnonzero(e.mask[1:])
            if not len(nz):  # nothing after the first token to predict
                bad.add("no_assistant", where, "no assistant tokens to train on")
                continue
            files["ids"].write(e.ids.astype("<i4", copy=False).tobytes())
            files["mask"].write(e.mask.tobytes())
            lengths.append(len(e.ids))
            keys.append(key)
            first_loss.append(int(nz[0]) + 1)
            loss_tokens.append(len(nz))
        pending.clear()

    try:
        for piece in part.pieces:
            for where, record in read_records(piece, bad, part.max_bytes):
                try:
                    messages, tools = chat.conversation(record, part.messages_field)
                    text, spans = template.render(messages, tools)
                    chat.check_text(text)
                except chat.BadRecord as err:
                    bad.add(err.kind, where, str(err))
                    continue
                pending.append((where, text, spans, content_key(part.dataset, messages, tools)))
                if len(pending) >= BATCH:
                    flush()
        if pending:
            flush()
        for name, f in files.items():
            f.close()
            fsync_file(tmp[name])
            os.replace(tmp[name], final[name])
    except BaseException:
        for name, f in files.items():
            f.close()
            if os.path.exists(tmp[name]):
                os.unlink(tmp[name])
        raise
    result = {
        "index": part.index,
        "dataset": part.dataset,
        "records": part.records,
        "lengths": np.array(lengths, dtype=np.int64),
        "first_loss": np.array(first_loss, dtype=np.int64),
        "loss_tokens": np.array(loss_tokens, dtype=np.int64),
        "keys": np.array(keys, dtype=np.uint64),
        "bad": {"counts": bad.counts, "examples": bad.examples},
        "paths": final,
    }
    meta = {"partition": asdict(part), "bad": result["bad"], "bytes": {n: os.path.getsize(p) for n, p in final.items()}}
    data = io.BytesIO()
    np.savez(data, meta=np.array(json.dumps(meta)), **{k: result[k] for k in ARRAYS})
    write_atomic(receipt_path(part, staging), data.getvalue())
    return result


ARRAYS = ("lengths", "first_loss", "loss_tokens", "keys")


def receipt_path(part: Partition, staging: str) -> str:
    return os.path.join(staging, f"{part.stem}.npz")


def kept(part: Partition, staging: str, arrays: bool = True) -> dict | None:
    """What `tokenize_partition` returned for the partition, from its receipt (`arrays` False: without the
    per-conversation arrays), if an earlier run finished it: None if not, or if its files are not what the
    receipt says."""
    try:
        with np.load(receipt_path(part, staging), allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta"]))
            found = {k: npz[k] for k in ARRAYS} if arrays else {}
        final = {name: os.path.join(staging, f"{part.stem}.{name}") for name in ("ids", "mask")}
        if meta["partition"] != json.loads(json.dumps(asdict(part))) or \
                any(os.path.getsize(path) != meta["bytes"][name] for name, path in final.items()):
            return None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None
    return {"index": part.index, "dataset": part.dataset, "records": part.records, **found, "bad": meta["bad"],
            "paths": final}


def load_part(path: str, dtype: str) -> np.ndarray:
    """A part file as a read-only memory map (an empty array for an empty file)."""
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
