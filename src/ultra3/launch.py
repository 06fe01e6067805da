"""Submit a compiled job, record it, and follow it when attached."""

from __future__ import annotations

import io
import os
import sys
import time

from . import jobs, records
from .job import Job
from .contract import INPUT_ERROR, INPUT_ERROR_EXIT, PREFLIGHT_MARK
from .errors import JobFailed, JobInputError
from .executors import executor


def launch(job: Job) -> None:
    from .jobprep.jobdir import new_job_id

    for finding in job.report.findings:
        print(finding.line(), file=sys.stderr)
    where = executor(job.executor)
    record = where.submit(job, new_job_id(job))
    record.submitted = time.time()
    record.argv = sys.argv
    jobs.save(record)
    print(f"submitted {record.id} ({where.where(record)})\njob dir: {record.job_dir}", flush=True)
    if job.mode == "detached":
        _next_commands(record)
        return
    try:
        final = jobs.follow(record, sys.stdout)
    except KeyboardInterrupt:
        print(f"\ndetached; {record.id} keeps running", file=sys.stderr)
        _next_commands(record)
        raise SystemExit(130) from None
    if final.state != "COMPLETED":
        lines = jobs.log_text(record).splitlines()
        said = [line for line in lines if INPUT_ERROR.match(line)]
        if final.exit_code == INPUT_ERROR_EXIT and said:
            raise JobInputError(f"{record.id} stopped on its input: {said[-1]}")
        ended = f"{record.id} {final.state}{f' (exit code {final.exit_code})' if final.exit_code is not None else ''}"
        reason = final.reason or jobs.failure_reason(record)
        if one_stream():  # the log streamed just above: its reason line and tail are not repeated
            said = "its preflight stopped it (the line above)" if reason.startswith(PREFLIGHT_MARK) else \
                "its log above says why" if reason in lines[-20:] else reason
            raise JobFailed(f"{ended}: {said}")
        tail = "" if reason.startswith(PREFLIGHT_MARK) else "\n--- last log lines ---\n" + "\n".join(lines[-20:])
        raise JobFailed(f"{ended}: {reason}{tail}")  # the preflight's line is the whole story
    print(f"{record.id} COMPLETED")


def one_stream() -> bool:
    """Whether stdout and stderr reach the same place (one terminal, one file, one pipe), where what the log said
    on stdout is right above an error."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # a stream with no file (captured in-process)
        return False
    return (out.st_dev, out.st_ino, out.st_rdev) == (err.st_dev, err.st_ino, err.st_rdev)


def _next_commands(record: records.JobRecord) -> None:
    print("next:")
    for verb in ("status", "logs", "cancel"):
        print(f"  nemotron jobs {verb} {record.id}{' --follow' if verb == 'logs' else ''}")
