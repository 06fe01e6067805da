"""Lines of a binary file read a block at a time, with a bound on a line's length: a line longer than the bound
is dropped as it streams, never held whole, so a reader's memory stays within BLOCK_BYTES + the bound whatever
the length of a line (data prep's `max_record_bytes`; inputs.py counts such a line as a bad record)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

BLOCK_BYTES = 8 << 20  # read and split at once
# the readers' limit where no max_record_bytes is given (calibration); data prep passes its own
MAX_RECORD_BYTES = 16 << 20


def text_blocks(f, max_bytes: int, offset: int = 0, rewind: bool = False,
                stop: int | None = None) -> Iterator[tuple[int, bytes | memoryview | None]]:
    """(byte offset, block) of a binary file read BLOCK_BYTES at a time from `offset` (where `f` stands): each
    block is whole lines, ending with a newline (the file's last block may not). A line longer than `max_bytes`
    that spans reads comes alone as None: its bytes are dropped as they are read, never held whole (a shorter
    block may still hold lines over the bound: `split`). `rewind` (a plain file, where seeking back is cheap):
    a block's last, partial line is read again with the next block, so the block is a memoryview of what was
    read, not a copy. `stop`: a line start (a seek mark) where reading ends."""
    rest, skipping = b"", False
    while data := f.read(BLOCK_BYTES if stop is None else min(BLOCK_BYTES, stop - offset)):
        at = offset
        offset += len(data)
        if skipping:  # inside a line that is too long: drop its bytes up to its newline
            cut = data.find(b"\n")
            if cut < 0:
                continue
            data, skipping, at = data[cut + 1:], False, at + cut + 1
        end = data.rfind(b"\n") + 1
        if not end:
            if len(rest) + len(data) > max_bytes:
                yield at - len(rest), None
                rest, skipping = b"", True
            else:
                rest += data
            continue
        if rewind:  # the partial line after the last newline is read again with the next block
            if end < len(data):
                f.seek(end - len(data), 1)
                offset = at + end
            yield at - len(rest), (rest + data[:end] if rest else memoryview(data)[:end])
            rest = b""
            continue
        yield at - len(rest), (rest + data[:end] if rest else data[:end])
        rest = data[end:]
    if len(rest) > max_bytes:
        yield offset - len(rest), None
    elif rest:
        yield offset - len(rest), rest


def split(block: bytes, max_bytes: int) -> list[bytes | None]:
    """A block's lines without their newlines; one longer than `max_bytes` as None."""
    block = bytes(block)  # (a memoryview from text_blocks)
    lines = block.split(b"\n")
    if block.endswith(b"\n"):
        lines.pop()  # the empty string after the last newline
    if len(block) > max_bytes:
        lines = [line if len(line) <= max_bytes else None for line in lines]
    return lines


def line_starts(block: bytes) -> np.ndarray:
    """The byte offsets at which a block's lines start, 0 first."""
    data = np.frombuffer(block, np.uint8)
    starts = np.flatnonzero(data == 0x0A) + 1  # of the lines after the first
    if starts.size and starts[-1] == data.size:
        starts = starts[:-1]  # the block's final newline starts no line
    return np.concatenate(([0], starts))


def plain_starts(block: bytes, max_bytes: int):
    """The block's line_starts when every line starts with a byte above space (so none is blank: only a line
    that is empty or starts with whitespace can be) and none is longer than `max_bytes`: then every line is a
    record, and any run of lines can be used whole. None otherwise (the block is then read line by line)."""
    if not block or len(block) > max_bytes or block[0] <= 0x20:
        return None
    starts = line_starts(block)
    if (np.frombuffer(block, np.uint8)[starts[1:]] <= 0x20).any():
        return None
    return starts


def line_blocks(f, max_bytes: int) -> Iterator[list]:
    """The lines of a binary file, without their newlines, in blocks read BLOCK_BYTES at a time. A line longer
    than `max_bytes` comes as None: its bytes are dropped as they are read, never held whole."""
    for _, block in text_blocks(f, max_bytes):
        yield [None] if block is None else split(block, max_bytes)


def lines(f, max_bytes: int = BLOCK_BYTES) -> Iterator[bytes | None]:
    """The lines of a binary file one by one (line_blocks)."""
    for block in line_blocks(f, max_bytes):
        yield from block


def over(max_bytes: int) -> str:
    return f"longer than max_record_bytes ({max_bytes:,} bytes)"
