"""Lines of a binary file read a block at a time, with a bound on a line's length: a line longer than the bound
is dropped as it streams, never held whole, so a reader's memory stays within BLOCK_BYTES + the bound whatever
the length of a line (data prep's `max_record_bytes`; inputs.py counts such a line as a bad record)."""

from __future__ import annotations

from collections.abc import Iterator

BLOCK_BYTES = 8 << 20  # read and split at once
MAX_RECORD_BYTES = 16 << 20  # max_record_bytes' default


def line_blocks(f, max_bytes: int) -> Iterator[list]:
    """The lines of a binary file, without their newlines, in blocks read BLOCK_BYTES at a time. A line longer
    than `max_bytes` comes as None: its bytes are dropped as they are read, never held whole."""
    rest, skipping = b"", False
    while data := f.read(BLOCK_BYTES):
        if skipping:  # inside a line that is too long: drop its bytes up to its newline
            cut = data.find(b"\n")
            if cut < 0:
                continue
            data, skipping = data[cut + 1:], False
        end = data.rfind(b"\n") + 1
        if not end:
            if len(rest) + len(data) > max_bytes:
                yield [None]
                rest, skipping = b"", True
            else:
                rest += data
            continue
        whole = rest + data[:end] if rest else data[:end]
        rest = data[end:]
        block = whole.split(b"\n")
        block.pop()  # the empty string after the last newline
        if len(whole) > max_bytes:
            block = [line if len(line) <= max_bytes else None for line in block]
        yield block
    if len(rest) > max_bytes:
        yield [None]
    elif rest:
        yield [rest]


def lines(f, max_bytes: int = BLOCK_BYTES) -> Iterator[bytes | None]:
    """The lines of a binary file one by one (line_blocks)."""
    for block in line_blocks(f, max_bytes):
        yield from block


def over(max_bytes: int) -> str:
    return f"longer than max_record_bytes ({max_bytes:,} bytes)"
