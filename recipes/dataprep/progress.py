"""Progress: shard tasks stream their counts to the driver with their results (about once a second); the
driver prints one line every `progress_interval` seconds, and at the end a summary table."""

from __future__ import annotations

import math
import time


def duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def line(records: int, total: int, docs: int, tokens: int, nbytes: int, shards_done: int, shards: int,
         elapsed: float) -> str:
    rate = tokens / elapsed if elapsed > 0 else 0.0
    frac = records / total if total else 1.0
    eta = (elapsed / frac - elapsed) if frac > 0 else float("nan")
    eta_s = "?" if math.isnan(eta) else duration(eta)
    return (f"progress: {docs:,} docs ({100 * frac:.1f}% of {total:,} records), {si(tokens)} tokens, "
            f"{si(rate)} tokens/s, {nbytes / elapsed / 1e6 if elapsed > 0 else 0:.1f} MB/s, "
            f"shards {shards_done}/{shards}, elapsed {duration(elapsed)}, ETA {eta_s}")


class Clock:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.start = self.last = time.time()

    def due(self) -> bool:
        if time.time() - self.last >= self.interval:
            self.last = time.time()
            return True
        return False

    @property
    def elapsed(self) -> float:
        return time.time() - self.start


class Steady:
    """The steady-state rate of a run's shards: their tokens over the time from the first shard task starting
    in a worker to the last one done (its receipt written). Ray's start and the workers' (imports, tokenizer:
    the warm-up tasks) are before it; gaps between tasks, their overheads and an uneven end are inside."""

    def __init__(self) -> None:
        self.first = float("inf")
        self.last = 0.0
        self.tokens = 0
        self.shards = 0

    def done(self, tokens: int, started: float, ended: float) -> None:
        self.first, self.last = min(self.first, started), max(self.last, ended)
        self.tokens += tokens
        self.shards += 1

    def line(self) -> str:
        seconds = self.last - self.first
        rate = f"{si(self.tokens / seconds)} tokens/s" if seconds > 0 else "n/a"
        return (f"steady state: {rate} ({self.tokens:,} tokens of {self.shards} shard(s) in {max(seconds, 0):.2f} s, "
                "from the first shard task started to the last done)")


class Phases:
    """Wall time per phase of a run, for its closing line."""

    def __init__(self) -> None:
        self.last = time.time()
        self.seconds: dict = {}

    def mark(self, phase: str) -> None:
        """The time since the last mark was spent on `phase`."""
        now = time.time()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now

    def line(self) -> str:
        return "time: " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.seconds.items())


def table(rows: list[list], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [[f"{c:,}" if isinstance(c, int) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    out = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    out += [fmt(r) for r in cells[1:-1]]
    if len(cells) > 2:
        out += ["  ".join("-" * w for w in widths)]
    out += [fmt(cells[-1])] if len(cells) > 1 else []
    return "\n".join(out)
