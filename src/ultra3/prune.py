"""`nemotron jobs prune`: the job dirs and records of old finished jobs, and what stays and why.

A job stays while it has not ended (or its state is not known), while its job dir is on another machine, and
while its job dir holds an artifact of the store or an output it declares (a checkpoint not published: a resume
or a fork starts from it). A pipe record goes with the last of its jobs."""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import jobs, pipe_records
from .artifacts import Store
from .errors import UserError
from .executors import for_record
from .lineage import job_config
from .records import JobRecord, State, registry_dir

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass
class Verdict:
    record: JobRecord
    state: State
    kept: str  # why it stays; "" when it goes
    size: int  # bytes of its job dir


def seconds(age: str) -> float:
    """`7d`, `12h`, `30m`, `90s` or `0` in seconds."""
    found = re.fullmatch(r"(\d+)([smhd]?)", age.strip())
    if not found or (found.group(1) != "0" and not found.group(2)):
        raise UserError(f"--older-than {age}: give a number and a unit, e.g. 7d, 12h, 30m (or 0 for every age)")
    return int(found.group(1)) * UNITS[found.group(2) or "s"]


def plan(older_than: float) -> tuple[list[Verdict], int]:
    """(a verdict for each job older than `older_than` seconds, newest first; how many newer jobs were left alone)."""
    every = jobs.all_records()
    old = [r for r in every if time.time() - r.submitted >= older_than]
    states = jobs.states(old)
    stores: dict[str, list[dict]] = {}
    verdicts = []
    for r in old:
        st = states.get(r.id, State("UNKNOWN"))
        kept = _kept(r, st, stores)
        verdicts.append(Verdict(r, st, kept, 0 if kept else _size(Path(r.job_dir))))
    return verdicts, len(every) - len(old)


def _kept(r: JobRecord, st: State, stores: dict[str, list[dict]]) -> str:
    if not st.done:
        return f"not ended ({st.state})"
    if remote := for_record(r).remote(r):
        return f"its job dir is on {remote['host']}; remove it there"
    if Path(r.job_dir).exists() and Path(r.job_dir).name != r.id:
        return f"its job dir {r.job_dir} is not named after the job; not removed"
    job = job_config(r).get("job") or {}
    inside = f"{r.job_dir.rstrip('/')}/"
    if root := job.get("artifacts_root"):
        if root not in stores:
            stores[root] = Store(root).manifests()
        published = [m for m in stores[root] if f"{m.get('path', '')}/".startswith(inside)]
        if published:
            return "holds published " + ", ".join(f"{m.get('name')}:v{m.get('version')}" for m in published)
    for out in job.get("produces") or []:
        path = Path(str(out.get("path", "")))
        if f"{path}/".startswith(inside) and path.exists() and (not path.is_dir() or any(path.iterdir())):
            return f"holds its {out.get('kind')} output {path} (not published; a resume or a fork starts from it)"
    return ""


def _size(folder: Path) -> int:
    total = 0
    for top, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def remove(verdicts: list[Verdict]) -> list[str]:
    """Remove the job dirs and records of the jobs that go, then the pipe records none of whose jobs is left; the
    pipe ids removed."""
    for v in verdicts:
        if not v.kept:
            shutil.rmtree(v.record.job_dir, ignore_errors=True)
            (registry_dir() / f"{v.record.id}.json").unlink(missing_ok=True)
    gone = {v.record.id for v in verdicts if not v.kept}
    left = {r.id for r in jobs.all_records()}
    removed = []
    for pipe in pipe_records.pipes():
        steps = {step["job"] for step in pipe["steps"] if step["job"]}
        if steps & gone and not steps & left:
            (pipe_records.pipes_dir() / f"{pipe['id']}.json").unlink(missing_ok=True)
            removed.append(pipe["id"])
    return removed
