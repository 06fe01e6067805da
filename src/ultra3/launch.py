"""Submit a compiled job, record it, and follow it when attached."""

from __future__ import annotations

import sys
import time

from . import jobs, records
from .job import Job
from .contract import INPUT_ERROR, INPUT_ERROR_EXIT
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
    records.save(record)
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
        tail = "\n".join(lines[-20:])
        reason = final.reason or jobs.failure_reason(record)
        raise JobFailed(f"{record.id} {final.state}"
                        f"{f' (exit code {final.exit_code})' if final.exit_code is not None else ''}: {reason}"
                        f"\n--- last log lines ---\n{tail}")
    print(f"{record.id} COMPLETED")


def _next_commands(record: records.JobRecord) -> None:
    print("next:")
    for verb in ("status", "logs", "cancel"):
        print(f"  nemotron jobs {verb} {record.id}{' --follow' if verb == 'logs' else ''}")
