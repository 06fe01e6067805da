"""The pipe record, `$NEMOTRON_HOME/pipes/<pipe id>.json`: the steps of one `ultra3 pipe` submission and their
jobs, what `nemotron jobs status|cancel PIPE_ID` read."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Iterator

from .contract import read_json
from .findings import skipped
from .paths import state_home


def pipes_dir() -> Path:
    return state_home() / "pipes"


def save(pipe_id: str, config: Path, steps: list[dict]) -> None:
    """`steps`: {id, stage, job, after} of every step of the pipe, `after` the ids of the steps it waits for; a step
    with no job (`job` "") has its `state` (SKIPPED, WAITING, NOT RUN) and the `reason`."""
    pipes_dir().mkdir(parents=True, exist_ok=True)
    body = {"id": pipe_id, "config": str(config), "submitted": time.time(), "steps": steps}
    target = pipes_dir() / f"{pipe_id}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2))
    tmp.replace(target)


def find_pipe(ref: str) -> dict | None:
    """The newest pipe record whose id `ref` is or begins; a damaged one is named and passed over."""
    return next(pipes(ref), None)


def pipes(prefix: str = "pipe-") -> Iterator[dict]:
    """The readable pipe records whose id begins with `prefix`, newest first; a damaged one is named and passed
    over."""
    for path in sorted(pipes_dir().glob("*.json"), key=_when, reverse=True):
        if path.stem.startswith(prefix):
            try:
                pipe = read_json(str(path))
            except (OSError, ValueError) as e:
                skipped(str(path), "pipe record", str(e))
                continue
            if why := _damage(pipe):
                skipped(str(path), "pipe record", why)
                continue
            yield pipe


def _when(path: Path) -> str:
    """A pipe id's time (`pipe-<config>_<YYYYmmdd-HHMMSS>-<hex>`), then the id: newest first across configs."""
    return f"{path.stem.rsplit('_', 1)[-1]} {path.stem}"


def _damage(pipe: object) -> str | None:
    """What keeps a pipe record's JSON from being one `nemotron jobs` can read; None when nothing does."""
    if not isinstance(pipe, dict) or not all(isinstance(pipe.get(k), str) for k in ("id", "config")):
        return "not an object with the pipe's id and config"
    when = pipe.get("submitted")
    if not isinstance(when, (int, float)) or isinstance(when, bool) or not math.isfinite(when):
        return "submitted is not a time"
    steps = pipe.get("steps")
    if not isinstance(steps, list) or not all(
            isinstance(s, dict) and all(isinstance(s.get(k), str) for k in ("id", "stage", "job")) for s in steps):
        return "steps is not a list of {id, stage, job}"
    if not all(isinstance(s.get("state"), str) and isinstance(s.get("reason"), str) for s in steps if not s["job"]):
        return "a step without a job has no state and reason"
    after = [s.get("after", []) for s in steps]  # absent in the records of pipes submitted as chains
    if not all(isinstance(a, list) and all(isinstance(v, str) for v in a) for a in after):
        return "a step's after is not a list of step ids"
    return None
