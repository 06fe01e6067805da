"""Where a run is, from its log (every attempt's, in order): Megatron-Bridge's iteration, validation and checkpoint
lines for training, the shard counts of a data prep; the attempts split by the first node's `ultra3 attempt N:`
line. Stdlib only: `nemotron jobs status` reads it on every call."""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field

from .contract import ATTEMPT_MARK

ITERATION = re.compile(r"(?:\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\])?\s*iteration\s+(\d+)/\s*(\d+) \|(.*)")
FIELD = re.compile(r"\s*([^|:]+?):\s*([-+0-9.eE]+|nan|inf)\s*\|")
MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(GB\)(.*)")
SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+) to (\S+)")
LOADED = re.compile(r"successfully loaded checkpoint from (\S+) .*at iteration (\d+)")
VALIDATION = re.compile(r"validation loss at iteration (\d+)(?: on (\w+) set)? \|.*?lm loss value: ([-+0-9.eE]+)")
SHARDS = re.compile(r"^progress: .*shards (\d+)/(\d+)")  # written in this run / to write in it
SHARD_PLAN = re.compile(r" (\d+) shard\(s\) \((\d+) to write, (\d+) done\)")  # the plan: all, and kept from before
ATTEMPT = re.compile(rf"^{ATTEMPT_MARK} (\d+): ")
WARMUP = 3  # each attempt's first iterations compile kernels and autotune: left out of the step time
SPIKY_LOSS_FACTOR = 10.0  # rerun_state_machine.spiky_loss_factor's default
SPIKY_SAMPLES = 100  # Megatron-Core's is_unexpectedly_large: the largest of the first 100 losses is the reference


@dataclass
class Attempt:
    number: int
    iterations: list[dict] = field(default_factory=list)  # {"iteration", "of", "at" (epoch s or None), fields...}
    validation: list[dict] = field(default_factory=list)  # {"iteration", "set", "lm loss"}
    saved: list[int] = field(default_factory=list)
    loaded: list[int] = field(default_factory=list)
    memory_gb: dict = field(default_factory=dict)
    shards: tuple[int, int] | None = None  # a data prep's (done, total), its latest progress line


def parse(text: str) -> list[Attempt]:
    """The log's attempts, oldest first (one, numbered 1, for a log without attempt lines)."""
    attempts, marked = [Attempt(1)], False
    for line in text.splitlines():
        if match := ATTEMPT.match(line):
            if marked or _seen(attempts[0]):
                attempts.append(Attempt(int(match.group(1))))
            else:  # the first mark names the attempt the log starts with
                attempts[0] = Attempt(int(match.group(1)))
            marked = True
            continue
        a = attempts[-1]
        if match := ITERATION.search(line):
            fields = {k.strip(): float(v) for k, v in FIELD.findall(match.group(4) + "|")}
            at = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) if match.group(1) else None
            a.iterations.append({"iteration": int(match.group(2)), "of": int(match.group(3)), "at": at, **fields})
        elif match := MEMORY.search(line):
            a.memory_gb = {k.strip(): float(v) for k, v in FIELD.findall(match.group(2) + "|")}
        elif match := SAVED.search(line):
            a.saved.append(int(match.group(1)))
        elif match := LOADED.search(line):
            a.loaded.append(int(match.group(2)))
        elif match := VALIDATION.search(line):
            a.validation.append({"iteration": int(match.group(1)), "set": match.group(2) or "validation (in training)",
                                 "lm loss": float(match.group(3))})
        elif match := SHARD_PLAN.search(line):
            a.shards = (int(match.group(3)), int(match.group(1)))
        elif (match := SHARDS.match(line)) and a.shards:
            a.shards = (a.shards[1] - int(match.group(2)) + int(match.group(1)), a.shards[1])
    return attempts


def _seen(a: Attempt) -> bool:
    return bool(a.iterations or a.validation or a.saved or a.loaded or a.shards)


def spikes(attempts: list[Attempt], factor: float = SPIKY_LOSS_FACTOR) -> list[dict]:
    """Iterations whose lm loss is at least `factor` times the largest of the run's first SPIKY_SAMPLES losses, as
    Megatron-Core's check_for_spiky_loss judges them (is_unexpectedly_large)."""
    losses = [it for a in attempts for it in a.iterations if "lm loss" in it]
    if len(losses) <= SPIKY_SAMPLES:
        return []
    reference = max(abs(it["lm loss"]) for it in losses[:SPIKY_SAMPLES])
    return [it for it in losses[SPIKY_SAMPLES:] if abs(it["lm loss"]) >= factor * reference]


def step_seconds(attempts: list[Attempt]) -> float | None:
    """The median time per iteration, each attempt's first WARMUP iterations left out."""
    times = [it["elapsed time per iteration (ms)"] / 1000 for a in attempts
             for it in a.iterations[WARMUP:] if "elapsed time per iteration (ms)" in it]
    return statistics.median(times) if times else None


def status_lines(attempts: list[Attempt], seq_length: int | None, time_limit_s: int | None,
                 factor: float = SPIKY_LOSS_FACTOR) -> list[str]:
    """`nemotron jobs status`'s progress: iteration N of M, tokens, losses, speed, ETA (and the allocations still
    needed, given the time limit); a data prep's shards; loss spikes."""
    its = [it for a in attempts for it in a.iterations]
    if not its:
        shards = next((a.shards for a in reversed(attempts) if a.shards), None)
        return [f"progress:  shards {shards[0]} of {shards[1]}"] if shards else []
    last = its[-1]
    done, total = last["iteration"], last["of"]
    samples = last.get("consumed samples")
    tokens = f", {_count(samples * seq_length)} tokens" if samples and seq_length else \
        f", {samples:,.0f} samples" if samples else ""
    lines = [f"progress:  iteration {done:,} of {total:,} ({100 * done / total:.1f}%){tokens}"]
    loss = f"lm loss {last['lm loss']:.4g}" if "lm loss" in last else ""
    validation = [v for a in attempts for v in a.validation if v["set"] != "test"]
    if validation:
        v = validation[-1]
        loss += f"{', ' if loss else ''}validation {v['lm loss']:.4g} (iteration {v['iteration']})"
    if loss:
        lines.append(f"loss:      {loss}")
    if step := step_seconds(attempts):
        batch = last.get("global batch size")
        rate = f", {batch * seq_length / step:,.0f} tokens/s" if batch and seq_length else ""
        left = (total - done) * step
        allocations = f", ~{-(-left // time_limit_s):,.0f} allocation(s) of run.time" if time_limit_s and left else ""
        lines.append(f"speed:     {step:.2f} s/iteration{rate}; ETA {_span(left)} of steps{allocations}")
    for it in spikes(attempts, factor)[-3:]:
        lines.append(f"spike:     iteration {it['iteration']:,}: lm loss {it['lm loss']:.4g} (over {factor:g}x the "
                     "largest before it)")
    return lines


def _count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def _span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
