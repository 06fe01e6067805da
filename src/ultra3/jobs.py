"""What the launcher does with submitted jobs, whatever executor runs them: their states (with a failed
job's reason), their logs, following one until it ends, and cancelling it."""

from __future__ import annotations

import re
import time

from . import records
from .contract import PREFLIGHT_MARK
from .errors import UserError
from .executors import NAMES, executor, for_record
from .records import JobRecord, State, handle_problem


def all_records() -> list[JobRecord]:
    """The registry, newest first; a record whose handle its executor cannot read is named on stderr and skipped."""
    return records.all_records(_handle_problem)


def newest(n: int) -> list[JobRecord]:
    """The n newest jobs, newest first, read through the registry's index (record_index)."""
    return records.newest(n, _handle_problem, _scheduler_id)


def save(record: JobRecord) -> None:
    records.save(record, _scheduler_id(record))


def _scheduler_id(record: JobRecord) -> str | None:
    return for_record(record).scheduler_id(record)


def _handle_problem(record: JobRecord) -> str | None:
    if record.executor not in NAMES:
        return f"executor {record.executor!r} is none of {', '.join(NAMES)}"
    return handle_problem(record.handle, executor(record.executor).handle_types)


def find(ref: str) -> JobRecord:
    """A job id, its scheduler's id (a Slurm job id), or a unique prefix of a job id."""
    exact, prefixed = records.matching(ref, _handle_problem, _scheduler_id)
    matches = exact or prefixed
    if not matches:
        raise UserError(f"no job '{ref}' in {records.registry_dir()}; see `nemotron jobs list`")
    if len(matches) > 1:
        raise UserError(f"'{ref}' matches {len(matches)} jobs ({', '.join(r.id for r in matches[:4])}...); "
                        "give more of the id")
    return matches[0]


def states(records: list[JobRecord]) -> dict[str, State]:
    """One call per executor for all the given jobs (for Slurm: one sacct per cluster)."""
    by_executor: dict[str, list[JobRecord]] = {}
    for r in records:
        by_executor.setdefault(r.executor, []).append(r)
    result: dict[str, State] = {}
    for name, group in by_executor.items():
        result.update(executor(name).states(group))
    for r in records:
        st = result.get(r.id)
        if st and st.done and st.state != "COMPLETED" and not st.reason:
            st.reason = "cancelled (scancel or `nemotron jobs cancel`)" if st.state == "CANCELLED" and not st.upstream \
                else failure_reason(r)
    return result


def state(record: JobRecord) -> State:
    return states([record]).get(record.id, State("UNKNOWN"))


def log_text(record: JobRecord) -> str:
    return plain(for_record(record).read_log(record, 0)[0])


def failure_reason(record: JobRecord) -> str:
    """The preflight's one-line reason if it stopped the job, else the log's last line."""
    lines = [line for line in log_text(record).splitlines() if line.strip()]
    marked = [line for line in lines if PREFLIGHT_MARK in line]
    if marked:
        return marked[-1][marked[-1].index(PREFLIGHT_MARK):].strip()
    return lines[-1].strip() if lines else ""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray's colours: noise in a log file and in a pipe


def plain(text: str) -> str:
    return _ANSI.sub("", text)


def follow(record: JobRecord, out) -> State:
    """Print the log as it grows (reading only the new bytes) until the job ends, or its state can no
    longer be known; return the final state."""
    reader = for_record(record)
    offset = 0
    st = state(record)
    while True:
        text, offset = reader.read_log(record, offset)
        out.write(plain(text))
        out.flush()
        if st.done or st.state == "UNKNOWN":
            if reader.settle_s:  # the last lines land after the state flips
                time.sleep(reader.settle_s)
                out.write(plain(reader.read_log(record, offset)[0]))
                out.flush()
            return st
        st = reader.wait(record, reader.poll_s) or state(record)


def cancel(record: JobRecord) -> None:
    for_record(record).cancel(record)
