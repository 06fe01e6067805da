"""The text of a record, or why it is a bad record (bad_records.BAD_KINDS): a JSON line decoded on its own
(`json_text`), a block of JSON lines decoded at once by Arrow (`jsonl_block`), a string array's missing, blank
and too long values (`checked`), any other value (`value_text`). Every path finds the same bad records, at the
same places, as decoding line by line with Python's `json` does (tested)."""

from __future__ import annotations

import functools
import json

from .bad_records import BadRecords
from .line_reader import MAX_RECORD_BYTES, over, split


def too_long(where: str, max_bytes: int, bad: BadRecords) -> None:
    bad.add("too_long", where, over(max_bytes))


def json_text(line: bytes, text_field: str, where: str, bad: BadRecords) -> str | None:
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
    return value_text(obj.get(text_field), text_field, where, bad, escaped="\\u" in s)


def value_text(value, text_field: str, where: str, bad: BadRecords, escaped: bool = True) -> str | None:
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


def jsonl_block(path: str, data: bytes, count: int, lineno, text_field: str, bad: BadRecords):
    """The texts of a block of `count` JSONL records (`data`: their lines, newline-separated; `lineno(i)`: the
    line number of the i-th). Arrow's C++ JSON reader decodes the whole block; a block it refuses, or reads
    otherwise than one record per line (it is more lenient in a few places), or that is not valid UTF-8
    throughout, is decoded again line by line, so every bad record is found and placed as if the block had
    been read line by line."""
    import pyarrow as pa
    import pyarrow.json as pj

    options = pj.ParseOptions(explicit_schema=pa.schema([(text_field, pa.large_string())]),
                              unexpected_field_behavior="ignore")
    try:
        _utf8(data).validate(full=True)
        table = pj.read_json(pa.BufferReader(data), parse_options=options,
                             read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        table = None
    if table is None or table.num_rows != count:
        texts = (json_text(line, text_field, f"{path}:{lineno(i)}", bad)
                 for i, line in enumerate(split(data, len(data))))
        return pa.array([t for t in texts if t is not None], pa.large_string())
    return checked(table.column(0).combine_chunks(), lambda i: f"{path}:{lineno(i)}", text_field, bad)


def _utf8(data: bytes):
    """`data` as one large_string value (not copied): its `validate(full=True)` checks UTF-8."""
    import numpy as np
    import pyarrow as pa

    return pa.LargeStringArray.from_buffers(1, pa.py_buffer(np.array([0, len(data)], np.int64)), pa.py_buffer(data))


@functools.cache
def whitespace() -> str:
    """Every character str.strip() strips (all of them are below U+3001: tested over the whole range)."""
    return "".join(c for c in map(chr, range(0x3001)) if c.isspace())


def checked(texts, where, text_field: str, bad: BadRecords, max_bytes: int = MAX_RECORD_BYTES):
    """`texts` (a string array, one value per record) without its missing, empty and too long texts, which are
    counted as bad records at `where(i)`, in record order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = texts.cast(pa.large_string())
    n = len(texts)
    missing = texts.is_null().to_numpy(zero_copy_only=False) if texts.null_count else np.zeros(n, dtype=bool)
    offsets = np.frombuffer(texts.buffers()[1], np.int64)[texts.offset:texts.offset + n + 1]
    chars = np.frombuffer(texts.buffers()[2] or b"\0", np.uint8)
    first = chars[np.minimum(offsets[:-1], chars.size - 1)]
    # only a text that is empty or starts with something other than printable ASCII can be blank
    maybe = np.flatnonzero(~missing & ((offsets[1:] == offsets[:-1]) | (first < 0x21) | (first > 0x7E)))
    empty = np.zeros(n, dtype=bool)
    if maybe.size:
        stripped = pc.utf8_ltrim(texts.take(pa.array(maybe)), characters=whitespace())
        empty[maybe] = pc.binary_length(stripped).to_numpy(zero_copy_only=False) == 0
    long = ~missing & (offsets[1:] - offsets[:-1] > max_bytes)
    drop = np.flatnonzero(missing | empty | long)
    for i in drop:
        if missing[i]:
            bad.add("missing_field", where(i), f"no {text_field!r} field")
        elif long[i]:
            too_long(where(i), max_bytes, bad)
        else:
            bad.add("empty_text", where(i), f"{text_field!r} is empty")
    if not drop.size:
        return texts
    keep = np.ones(n, dtype=bool)
    keep[drop] = False
    return texts.filter(pa.array(keep))
