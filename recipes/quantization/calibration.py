"""Calibration and held-out token windows, from JSONL or from the packed Parquet of `ultra3 data prep sft`.

JSONL: our SFT conversations (a `messages` list, contents joined by newlines) or plain documents (a `text`
field); plain, .gz or .zst, a file, a directory or a glob; documents are tokenized in file order, joined
with the end-of-text token and cut into windows. A packed directory (with packing_metadata.json): its
train split's token ids, already tokenized, in shard order."""

from __future__ import annotations

import glob
import json
import os

from ..dataprep import inputs, line_reader
from ..dataprep.errors import DataPrepError

from .errors import QuantizeError


SIZES = {"samples": 512, "held_out": 16, "seq_length": 4096}  # calibration.*'s defaults


def sizes(calib: dict) -> tuple[int, int, int]:
    """(samples, held_out, seq_length) of the calibration config."""
    return tuple(calib.get(k) or default for k, default in SIZES.items())


def check_text(path: str, samples: int, held_out: int, seq_length: int) -> None:
    """The records the run will read parse, and hold text enough for the windows (a token covers at least a
    byte, and each document adds one end-of-text token): what can be known before a tokenizer is loaded."""
    need, size, docs = (samples + held_out) * seq_length, 0, 0
    for text in texts(path):
        size, docs = size + len(text.encode()), docs + 1
        if size + docs >= need:
            return
    raise QuantizeError(f"calibration.path: {path} holds {size:,} bytes of text in {docs:,} document(s), at most "
                        f"{size + docs:,} tokens, fewer than the {need:,} needed for {samples} + {held_out} windows "
                        f"of {seq_length}; add data or lower calibration.samples / held_out / seq_length")


def record_text(record: object) -> str | None:
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("text"), str):
        return record["text"]
    messages = record.get("messages")
    if isinstance(messages, list):
        parts = [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
        return "\n".join(parts) if parts else None
    return None


def texts(path: str):
    """The documents of `path`, in order; a line that is not a JSON record with text is an error."""
    files = inputs.expand(path)
    if not files:
        raise QuantizeError(f"calibration.path: {path} matches no file; give a JSONL file, directory or glob")
    for file in files:
        try:
            fmt = inputs.detect_format(file)
        except DataPrepError as e:
            raise QuantizeError(f"calibration.path: {e}") from None
        if fmt == inputs.PARQUET:
            raise QuantizeError(f"calibration.path: {file} is Parquet; give JSONL (plain, .gz or .zst) or the "
                                "directory `ultra3 data prep sft` wrote")
        with inputs.open_binary(file, fmt) as f:
            for number, line in enumerate(line_reader.lines(f, line_reader.MAX_RECORD_BYTES), 1):
                if line is not None and not line.strip():
                    continue
                try:
                    text = record_text(json.loads(line)) if line is not None else None
                except (ValueError, UnicodeDecodeError):
                    text = None
                if not text:
                    raise QuantizeError(f"calibration.path: {file}:{number} is not a JSON record with a `text` "
                                        "string or a `messages` list of {role, content}; fix or remove the line")
                yield text


PACKED_MARK = "packing_metadata.json"  # written last by `ultra3 data prep sft`


def packed_ids(folder: str, vocab: int):
    """The token ids of each pack of the train split, in shard order; ids the tokenizer does not have mean
    the data was tokenized with another one."""
    import pyarrow.parquet as pq

    shards = sorted(glob.glob(os.path.join(folder, "train", "*.parquet")))
    if not shards:
        raise QuantizeError(f"calibration.path: {folder} has no train/*.parquet; give the output_dir of a "
                            "completed `ultra3 data prep sft`")
    for shard in shards:
        for batch in pq.ParquetFile(shard).iter_batches(columns=["input_ids"]):
            for pack in batch.column(0).to_pylist():
                if pack and max(pack) >= vocab:
                    raise QuantizeError(f"calibration.path: {shard} holds token id {max(pack)}, beyond the "
                                        f"tokenizer's {vocab} ids; pack the data with the model's tokenizer")
                yield pack


def windows(path: str, tokenizer, samples: int, held_out: int, seq_length: int):
    """(calibration, held_out) LongTensors of shape [n, seq_length], disjoint, in data order."""
    import torch

    need = (samples + held_out) * seq_length
    ids: list[int] = []
    if os.path.isfile(os.path.join(path, PACKED_MARK)):
        for pack in packed_ids(path, len(tokenizer)):
            ids += pack
            if len(ids) >= need:
                break
    else:
        eos = tokenizer.eos_token_id
        for text in texts(path):
            ids += tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
            if len(ids) >= need:
                break
    if len(ids) < need:
        raise QuantizeError(f"calibration.path: {path} holds {len(ids):,} tokens, fewer than the {need:,} needed "
                            f"for {samples} + {held_out} windows of {seq_length}; add data or lower "
                            "calibration.samples / held_out / seq_length")
    tokens = torch.tensor(ids[:need], dtype=torch.long).view(samples + held_out, seq_length)
    return tokens[:samples], tokens[samples:]
