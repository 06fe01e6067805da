"""Where a run is, from its log (every attempt's, in order): Megatron-Bridge's iteration, validation and checkpoint
lines for training, the shard counts of a data prep; the attempts split by the first node's `ultra3 attempt N:`
line. Stdlib only and one pass over the text: `nemotron jobs status` reads it on every call, and a long run's log
holds a line per iteration."""

from __future__ import annotations

import calendar
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from functools import lru_cache

from .contract import ATTEMPT_MARK

ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|(.*)")
STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d):(\d\d)\]\s*$")  # Megatron's time stamp before `iteration`
MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(GB\)(.*)")
SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+) to (\S+)")
LOADED = re.compile(r"successfully loaded checkpoint from (\S+) .*at iteration (\d+)")
VALIDATION = re.compile(r"validation loss at iteration (\d+)(?: on (\w+) set)? \|.*?lm loss value: ([-+0-9.eE]+)")
ATTEMPT = re.compile(rf"{ATTEMPT_MARK} (\d+): ")  # `ultra3 attempt N: Slurm job ID (restart R) on HOST at TIME`
ATTEMPT_AT = re.compile(r" at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)([+-])(\d\d)(\d\d)\s*$")
# a data prep: the plan (all shards, kept from before) and the progress lines of this attempt's shards
SHARD_PLAN = re.compile(r" (\d+) shard\(s\) \((\d+) to write, (\d+) done\)")  # pretrain
SHARDS = re.compile(r"^progress: .*shards (\d+)/(\d+)")
SFT_KEPT = re.compile(r"^write: (\d+) of (\d+) shard\(s\) kept")
SFT_SHARDS = re.compile(r"^write: (\d+)/(\d+) done")
KEPT = ("consumed samples", "elapsed time per iteration (ms)", "global batch size", "lm loss")  # of each iteration
WARMUP = 3  # each attempt's first iterations compile kernels and autotune: left out of the step time
RECENT = 100  # the step time is the median of the last RECENT iterations after the warm-up ones
SPIKY_LOSS_FACTOR = 10.0  # rerun_state_machine.spiky_loss_factor's default (Megatron-Bridge's RerunStateMachineConfig)
SPIKY_SAMPLES = 100  # Megatron-Core's is_unexpectedly_large: the largest of the first 100 losses is the reference


@dataclass
class Attempt:
    number: int
    started: float | None = None  # epoch s, from its mark
    utc_offset: int | None = None  # s, from its mark: its nodes' zone, in which Megatron stamps its lines
    iterations: list[dict] = field(default_factory=list)  # {"iteration", "of", KEPT fields..., "at": epoch s|None}
    validation: list[dict] = field(default_factory=list)  # {"iteration", "set", "lm loss"}
    saved: list[int] = field(default_factory=list)
    loaded: list[int] = field(default_factory=list)
    shards: tuple[int, int] | None = None  # a data prep's (done, total), its latest line
    shards_kept: int = 0  # done in earlier attempts, from its plan line


def fields(text: str, keep: tuple[str, ...] | None) -> dict:
    """The `key: number |` pairs of a Megatron line (`| key: value |`), those named in `keep` (None: all); a value
    that is not a number is left out."""
    pairs = _keys(keep).findall(f"|{text}") if keep else (part.partition(":")[::2] for part in text.split("|"))
    found = {}
    for key, value in pairs:
        try:
            found[key.strip()] = float(value)
        except ValueError:
            continue
    return found


@lru_cache(maxsize=8)
def _keys(keep: tuple[str, ...]) -> re.Pattern:
    return re.compile(rf"\|\s*({'|'.join(map(re.escape, keep))}):([^|]*)")


def iteration(line: str, keep: tuple[str, ...] | None = KEPT) -> tuple[dict, str | None] | None:
    """A Megatron iteration line's {"iteration", "of", fields...} and its time stamp (`YYYY-mm-dd HH:MM:SS`)."""
    match = ITERATION.search(line)
    if not match:
        return None
    stamp = STAMP.search(line, 0, match.start())
    return ({"iteration": int(match.group(1)), "of": int(match.group(2)), **fields(match.group(3), keep)},
            f"{stamp.group(1)}:{stamp.group(2)}" if stamp else None)


def event(line: str) -> tuple[str, dict] | None:
    """A Megatron line about memory, a checkpoint saved or loaded, or a validation loss, as (kind, values)."""
    if "iteration" not in line:
        return None
    if match := MEMORY.search(line):
        return "memory", fields(match.group(2), None)
    if match := SAVED.search(line):
        return "saved", {"iteration": int(match.group(1)), "dir": match.group(2)}
    if match := LOADED.search(line):
        return "loaded", {"dir": match.group(1), "iteration": int(match.group(2))}
    if match := VALIDATION.search(line):
        return "validation", {"iteration": int(match.group(1)), "set": match.group(2) or "validation (in training)",
                              "lm loss": float(match.group(3))}
    return None


def parse(text: str) -> list[Attempt]:
    """The log's attempts, oldest first (one, numbered 1, for a log without attempt lines). A last line without
    its newline is still being written: left for the next read."""
    attempts, marked = [Attempt(1)], False
    for line in text[:text.rfind("\n") + 1].splitlines():
        # anywhere in the line: a line the attempt before left unfinished is glued in front of it
        if ATTEMPT_MARK in line and (match := ATTEMPT.search(line)):
            a = _attempt(int(match.group(1)), line)
            if marked or _seen(attempts[0]):
                attempts.append(a)
            else:  # the first mark names the attempt the log starts with
                attempts[0] = a
            marked = True
            continue
        a = attempts[-1]
        if found := iteration(line):
            values, stamp = found
            values["at"] = _epoch(stamp, a.utc_offset) if stamp else None
            a.iterations.append(values)
        elif said := event(line):
            kind, values = said
            if kind in ("saved", "loaded"):
                getattr(a, kind).append(values["iteration"])
            elif kind == "validation":
                a.validation.append(values)
        elif match := SHARD_PLAN.search(line):
            a.shards_kept = int(match.group(3))
        elif match := SFT_KEPT.match(line):
            a.shards_kept = int(match.group(1))
        elif match := SHARDS.match(line) or SFT_SHARDS.match(line):
            a.shards = (a.shards_kept + int(match.group(1)), a.shards_kept + int(match.group(2)))
    return attempts


def _attempt(number: int, line: str) -> Attempt:
    if not (at := ATTEMPT_AT.search(line)):
        return Attempt(number)
    sign, hours, minutes = at.group(2), int(at.group(3)), int(at.group(4))
    offset = (1 if sign == "+" else -1) * (hours * 3600 + minutes * 60)
    return Attempt(number, calendar.timegm(time.strptime(at.group(1), "%Y-%m-%dT%H:%M:%S")) - offset, offset)


@lru_cache(maxsize=4096)
def _minute(stamp: str, utc_offset: int | None) -> float:
    """`YYYY-mm-dd HH:MM` in the zone of that offset (None: this machine's), as epoch seconds."""
    clock = time.strptime(stamp, "%Y-%m-%d %H:%M")
    return time.mktime(clock) if utc_offset is None else calendar.timegm(clock) - utc_offset


def _epoch(stamp: str, utc_offset: int | None) -> float:
    return _minute(stamp[:16], utc_offset) + int(stamp[17:19])


def _seen(a: Attempt) -> bool:
    return bool(a.iterations or a.validation or a.saved or a.loaded or a.shards)


def spikes(attempts: list[Attempt], factor: float = SPIKY_LOSS_FACTOR) -> list[dict]:
    """Iterations whose lm loss is at least `factor` times the largest of the run's first SPIKY_SAMPLES losses, as
    Megatron-Core's is_unexpectedly_large judges them (the check_for_spiky_loss of its rerun state machine, whose
    reference is kept in the checkpoint: one over the run's attempts); NaN and Inf are neither sampled nor flagged.
    Megatron judges each rank's microbatch loss; the log has the logged (batch-averaged) losses."""
    losses = [it for a in attempts for it in a.iterations if math.isfinite(it.get("lm loss", math.nan))]
    if len(losses) <= SPIKY_SAMPLES:
        return []
    reference = max(abs(it["lm loss"]) for it in losses[:SPIKY_SAMPLES])
    return [it for it in losses[SPIKY_SAMPLES:] if abs(it["lm loss"]) >= factor * reference]


def step_seconds(attempts: list[Attempt]) -> float | None:
    """The median time per iteration of the last RECENT iterations, each attempt's first WARMUP left out."""
    times = [it["elapsed time per iteration (ms)"] / 1000 for a in attempts
             for it in a.iterations[WARMUP:] if "elapsed time per iteration (ms)" in it]
    return statistics.median(times[-RECENT:]) if times else None


def startup_seconds(attempts: list[Attempt]) -> float | None:
    """The median time from an attempt's start (its mark) to the end of its warm-up iterations: what each
    allocation spends before it trains at speed (the job's start, the checkpoint's load, autotuning)."""
    ends = [(a.started, a.iterations[:WARMUP][-1]["at"]) for a in attempts if a.started and a.iterations]
    spent = [end - start for start, end in ends if end and end >= start]  # clocks that disagree: left out
    return statistics.median(spent) if spent else None


def status_lines(attempts: list[Attempt], seq_length: int | None, time_limit_s: int | None,
                 factor: float = SPIKY_LOSS_FACTOR, run: tuple[int | None, int | None] = (None, None)) -> list[str]:
    """`nemotron jobs status`'s progress: iteration N of M, tokens, losses, speed, ETA (and the allocations still
    needed, given the time limit); a data prep's shards; loss spikes. `run`: the config's train.train_iters and
    phase-2 switch (a run in phases logs each phase's own end as M)."""
    its = [it for a in attempts for it in a.iterations]
    if not its:
        shards = next((a.shards for a in reversed(attempts) if a.shards), None)
        return [f"progress:  shards {shards[0]:,} of {shards[1]:,}"] if shards else []
    last = its[-1]
    done, total = last["iteration"], max(last["of"], run[0] or 0)
    samples = last.get("consumed samples")
    tokens = f", {_count(samples * seq_length)} tokens" if samples and seq_length else \
        f", {samples:,.0f} samples" if samples else ""
    phase = f"; phase {1 if done < run[1] else 2} of 2 (phase 2 from iteration {run[1]:,})" if run[1] else ""
    lines = [f"progress:  iteration {done:,} of {total:,} ({100 * done / total:.1f}%){tokens}{phase}"]
    loss = f"lm loss {last['lm loss']:.4g}" if "lm loss" in last else ""
    validation = [v for a in attempts for v in a.validation if v["set"] != "test"]
    if validation:
        v = validation[-1]
        loss += f"{', ' if loss else ''}validation {v['lm loss']:.4g} (iteration {v['iteration']:,})"
    if loss:
        lines.append(f"loss:      {loss}")
    if step := step_seconds(attempts):
        batch = last.get("global batch size")
        rate = f", {batch * seq_length / step:,.0f} tokens/s" if batch and seq_length else ""
        left = (total - done) * step
        lines.append(f"speed:     {step:.2f} s/iteration{rate}; ETA {_span(left)} of steps"
                     f"{_allocations(left, time_limit_s, startup_seconds(attempts))}")
    found = spikes(attempts, factor)
    for it in found[-3:]:
        lines.append(f"spike:     iteration {it['iteration']:,}: lm loss {it['lm loss']:.4g} (at least {factor:g}x "
                     "the largest of the first 100)")
    if len(found) > 3:
        lines.append(f"spikes:    {len(found):,} in all, from iteration {found[0]['iteration']:,}")
    return lines


def _allocations(left: float, limit: int | None, startup: float | None) -> str:
    """The allocations of `limit` seconds the steps left need, each less the measured start-up."""
    if not limit or not left:
        return ""
    usable = limit - (startup or 0)
    if usable <= 0:
        return f"; the start-up ({_span(startup)}) takes all of run.time"
    spent = f", each less {_span(startup)} of start-up" if startup else ""
    return f", ~{math.ceil(left / usable):,} allocation(s) of run.time{spent}"


def _count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def _span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
