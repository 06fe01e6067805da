"""Submit a compiled job, record it, and follow it when attached."""

from __future__ import annotations

import re
import sys
import time

from .. import jobs
from ..compile import Job
from ..errors import JobFailed, JobInputError

# how a runtime reports bad input before it exits with code 2 (recipes/dataprep/settings.py, recipes/quantize.py)
RUNTIME_INPUT_ERROR = re.compile(r"^[\w. -]+: error: ")


def launch(job: Job) -> None:
    from .jobdir import new_job_id

    for finding in job.report.findings:
        print(finding.line(), file=sys.stderr)
    job_id = new_job_id(job)
    if job.executor == "slurm":
        from .slurm import submit
    elif job.executor == "ray":
        from .ray_jobs import submit
    else:
        from .local import submit
    record = submit(job, job_id)
    record.submitted = time.time()
    record.argv = sys.argv
    jobs.save(record)
    where = (f"Slurm job {record.slurm_id}" if record.slurm_id else f"Ray job on {record.ray_address}"
             if record.ray_address else f"pid {record.pid}")
    print(f"submitted {record.id} ({where})\njob dir: {record.job_dir}", flush=True)
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
        said = [line for line in lines if RUNTIME_INPUT_ERROR.match(line)]
        if final.exit_code == 2 and said:
            raise JobInputError(f"{record.id} stopped on its input: {said[-1]}")
        tail = "\n".join(lines[-20:])
        reason = final.reason or jobs.failure_reason(record)
        raise JobFailed(f"{record.id} {final.state}"
                        f"{f' (exit code {final.exit_code})' if final.exit_code is not None else ''}: {reason}"
                        f"\n--- last log lines ---\n{tail}")
    print(f"{record.id} COMPLETED")


def _next_commands(record: jobs.JobRecord) -> None:
    print("next:")
    for verb in ("status", "logs", "cancel"):
        print(f"  nemotron jobs {verb} {record.id}{' --follow' if verb == 'logs' else ''}")
