"""The job registry's index ($NEMOTRON_HOME/jobs.index, beside jobs/): a line per record, `<name>\\t<submitted>\\t
<scheduler id>\\t<stamp>` (the name of its file without .json), oldest first, appended as jobs are saved, so that
`nemotron jobs status` and `jobs list` read only the records they show. It vouches for jobs/ as it was when its
last line was written (the folder's mtime, that line's stamp): a record added or removed by anything else (an older
launcher, a hand, a prune) leaves the index stale, and the next look rebuilds it from the records. A damaged record
has a line too (`!` for its time), read again, and named, at every look. Lines written by the records module only."""

from __future__ import annotations

import os
from pathlib import Path

DAMAGED = b"!"


def path(folder: Path) -> Path:
    return folder.with_name("jobs.index")  # outside jobs/: writing it leaves the folder's mtime alone


def stamp(folder: Path) -> bytes:
    return str(folder.stat().st_mtime_ns).encode()


def name(text: str) -> bytes | None:
    """`text` as a field; None where it cannot be one (a tab or a line break in it)."""
    data = text.encode("utf-8", "surrogateescape")
    return None if b"\t" in data or b"\n" in data else data


def entry(file_name: str, submitted: float, alias: str | None) -> bytes | None:
    """A record's line, without its stamp; None where its file's name cannot be a field."""
    key = name(file_name)
    return b"%s\t%s\t%s" % (key, repr(submitted).encode(), name(alias or "") or b"") if key else None


class Index:
    def __init__(self, data: bytes):
        self.data = data

    def newest(self, n: int) -> list[str]:
        """The names of (at least) the n newest records, newest first; appends that raced each other may stand a
        little out of order, hence the margin."""
        lines = self.data.rsplit(b"\n", n + 65)[-(n + 65):]
        return _names(_entry(line) for line in lines)

    def matching(self, ref: str) -> tuple[list[str], list[str]]:
        """The records `ref` names exactly (its name or its scheduler id), and those whose name, or the part
        after its first `_`, starts with `ref`; each newest first."""
        key = name(ref)
        exact, prefixed = [], []
        at = self.data.find(key) if key else -1
        while at >= 0:
            start = self.data.rfind(b"\n", 0, at) + 1
            end = self.data.find(b"\n", at) % (len(self.data) + 1)  # none: the end
            entry = _entry(self.data[start:end])
            if entry and entry[1] != DAMAGED:
                if key in (entry[0], entry[2]):
                    exact.append(entry)
                elif entry[0].startswith(key) or entry[0].split(b"_", 1)[-1].startswith(key):
                    prefixed.append(entry)
            at = self.data.find(key, end)
        return _names(exact), _names(prefixed)

    def damaged(self) -> list[str]:
        found, at = [], self.data.find(b"\t" + DAMAGED + b"\t")
        while at >= 0:
            found.append(self.data[self.data.rfind(b"\n", 0, at) + 1:at].decode("utf-8", "surrogateescape"))
            at = self.data.find(b"\t" + DAMAGED + b"\t", at + 1)
        return found


def _entry(line: bytes) -> tuple[bytes, bytes, bytes] | None:
    fields = line.split(b"\t")
    return (fields[0], fields[1], fields[2]) if len(fields) == 4 and fields[0] else None


def _names(entries) -> list[str]:
    """Newest first, each name once (its last line counts); a line that is no entry (a write cut short) is none."""
    times = {e[0]: t for e in entries if e and (t := _time(e[1])) is not None}
    return [n.decode("utf-8", "surrogateescape") for n in sorted(times, key=times.__getitem__, reverse=True)]


def _time(field: bytes) -> float | None:
    try:
        return float(field)
    except ValueError:
        return None


def read(folder: Path) -> Index | None:
    """The index, where it vouches for the folder as it is now: None where it is missing, stale or damaged."""
    try:
        data = path(folder).read_bytes()
        lines = data.rsplit(b"\n", 2)
        now = stamp(folder)
    except OSError:
        return None
    if len(lines) < 2 or lines[-1] or lines[-2].rsplit(b"\t", 1)[-1] != now:
        return None
    return Index(data)


def current(folder: Path) -> bool:
    """Whether the index vouches for the folder as it is (its last line only)."""
    try:
        with open(path(folder), "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 256, 0))
            tail = f.read()
        return tail.endswith(b"\n") and tail[:-1].rsplit(b"\n", 1)[-1].rsplit(b"\t", 1)[-1] == stamp(folder)
    except OSError:
        return False


def add(folder: Path, line: bytes) -> None:
    """Append a record's line (entry()) just after its file was written: one write, so that lines of processes
    saving at once never mix."""
    fd = os.open(path(folder), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line + b"\t" + stamp(folder) + b"\n")
    finally:
        os.close(fd)


def write(folder: Path, entries: list[tuple[float, bytes]], damaged: list[bytes], as_of: bytes) -> Index:
    """A new index of these records ((submitted, entry()) each) and damaged names, vouching for the folder as of
    `as_of` (its stamp before the records were read: a change meanwhile leaves the index stale)."""
    lines = [b"%s\t%s\t\t\n" % (n, DAMAGED) for n in damaged]
    lines += [line + b"\t\n" for _, line in sorted(entries, key=lambda e: e[0])]
    data = b"".join(lines) + b"\t\t\t" + as_of + b"\n"
    tmp = path(folder).with_name(f".jobs.index.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path(folder))
    return Index(data)
