"""The attempts of a run, from any shell: the job dir's ledger (recipes/attempts.py writes it on the job's first
node) joined with Slurm's accounting of each start of the job (`sacct -D`: one row per requeue), so an attempt
that died without a word still has its start, end and state."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .artifacts import read_files
from .contract import ATTEMPTS_FILE, ledger_entries, small_text
from .errors import ClusterError
from .executors import for_record
from .records import JobRecord
from .ssh import run

LEDGER_MAX = 16 << 20  # bytes: ~50,000 attempts


@dataclass
class Attempt:
    number: int
    start: float | None  # the allocation's start (Slurm), else the first node's
    end: float | None  # None while it runs
    outcome: str  # done | continue | failed | lost | stopped | running
    why: str
    exit: int | None
    slurm_state: str = ""  # COMPLETED, REQUEUED, NODE_FAIL, ... as accounting has it
    nodes: int = 1

    @property
    def seconds(self) -> float:
        return max(0.0, ((self.end or time.time()) - self.start)) if self.start else 0.0


def attempts(record: JobRecord) -> list[Attempt]:
    """Every attempt of the job, oldest first: [] for a job that never reached its first node, or whose job dir
    cannot be read from here."""
    where = for_record(record)
    try:
        found = read_files(f"{record.job_dir}/{ATTEMPTS_FILE}", ["-maxdepth", "0"], where.remote(record), LEDGER_MAX)
        entries = ledger_entries(small_text(found[0][1], LEDGER_MAX)) if found else []
    except (ClusterError, ValueError):
        return []
    slurm_id = where.scheduler_id(record) if record.executor == "slurm" else None
    rows = _accounting(slurm_id, where.remote(record)) if slurm_id else []
    starts = {e["attempt"]: e for e in entries if e.get("event") == "start"}
    ends = {e["attempt"]: e for e in entries if e.get("event") == "end"}
    result = []
    for number, start in sorted(starts.items()):
        row = rows[start["restart"]] if 0 <= start.get("restart", -1) < len(rows) else {}
        end = ends.get(number) or {}
        outcome = end.get("outcome") or ("running" if row.get("state") in (None, "RUNNING") else "lost")
        why = end.get("why") or ("" if outcome == "running" else f"ended {row.get('state')} without a word")
        result.append(Attempt(number, row.get("start") or start.get("at"), row.get("end") or end.get("at"),
                              outcome, why, end.get("exit"), row.get("state", ""), int(start.get("nodes") or 1)))
    return result


def _accounting(slurm_id: str, ssh: dict | None) -> list[dict]:
    """Slurm's rows for each start of the job, in order: state, start and end (epoch seconds)."""
    out = run(["sacct", "--parsable2", "--noheader", "-X", "-D", "-j", slurm_id, "--format=State,Start,End"], ssh)
    rows = []
    for line in out.stdout.splitlines():
        state, start, end = (line.split("|") + ["", ""])[:3]
        if start in ("", "Unknown", "None"):
            continue  # pending: not an attempt yet
        rows.append({"state": state.split()[0].rstrip("+"), "start": _epoch(start), "end": _epoch(end)})
    return rows


def _epoch(stamp: str) -> float | None:
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None  # Unknown: still running
