"""The embedded default: run the job on this machine, in a job dir laid out like a Slurm one."""

from __future__ import annotations

import os
import shlex
import subprocess

from ..compile import Job
from ..jobs import JobRecord
from ..paths import nemorun_home
from .jobdir import write_code_dir
from .plan import local_command, task_name

LOG = "log-local.out"


def submit(job: Job, job_id: str) -> JobRecord:
    exp_dir = nemorun_home() / "experiments" / job.stage.slug / job_id
    task = task_name(job)
    code = exp_dir / task / "code"
    code.mkdir(parents=True)
    write_code_dir(job, job_id, str(exp_dir), code)
    run = job.config["run"]
    env = {**os.environ, **{k: str(v) for k, v in (run.get("env") or {}).items()}, "PYTHONUNBUFFERED": "1"}
    setup = "".join(f"{line}\n" for line in run.get("setup") or [])
    # The job's own process group, so cancel stops everything it started; the exit code lands in the
    # task dir, where `jobs status` reads it from any later shell: also when a setup line exits, or
    # cancel's SIGTERM stops the script (143, as a shell reports it).
    record_exit = f"echo $? > {shlex.quote(str(exp_dir / task / 'exit_code'))}"
    script = (f"trap {shlex.quote(record_exit)} EXIT\n"
              "trap 'exit 143' TERM\n"
              f"{setup}{shlex.join(local_command(job))} > ../{LOG} 2>&1\n")
    proc = subprocess.Popen(["bash", "-c", script], cwd=code, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return JobRecord(id=job_id, stage=job.stage.name, config=job.options.config, executor="local", mode=job.mode,
                     submitted=0, job_dir=str(exp_dir), task=task, log_glob=f"{task}/{LOG}", pid=proc.pid,
                     profile=job.profile.name if job.profile else None)
