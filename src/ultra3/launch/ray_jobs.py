"""Submission to an existing Ray cluster through its Jobs API (`executor = "ray"` profiles).

The job's code dir is staged on this machine, like a local run's, and uploaded as the Ray job's
working_dir; its entry point is the same recipes/launch.py. Secrets are not sent: the Ray cluster's
own environment must hold them."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ..compile import Job
from ..errors import ClusterError
from ..jobs import JobRecord
from ..paths import nemorun_home
from .jobdir import write_code_dir
from .plan import job_command, task_name


def client(address: str):
    # Ray clusters use token authentication by default; the client sends the token only in "token"
    # mode, so turn it on when a token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)
    if any(os.environ.get(v) for v in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")) or \
            Path("~/.ray/auth_token").expanduser().is_file():
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    from ray.job_submission import JobSubmissionClient

    logging.getLogger("ray").setLevel(logging.WARNING)  # no per-upload chatter
    try:
        return JobSubmissionClient(address)
    except Exception as e:  # connection refused, wrong URL, version mismatch
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0]}") from None


def submit(job: Job, job_id: str) -> JobRecord:
    exp_dir = nemorun_home() / "experiments" / job.stage.slug / job_id
    task = task_name(job)
    code = exp_dir / task / "code"
    write_code_dir(job, job_id, str(exp_dir), code)
    run = job.config["run"]
    env = {k: str(v) for k, v in (run.get("env") or {}).items()}
    jobs_api = client(run["address"])
    deadline = time.monotonic() + 90  # a cluster that just started has no job agent for a while
    while True:
        try:
            jobs_api.submit_job(entrypoint=" ".join(job_command()), submission_id=job_id,
                                runtime_env={"working_dir": str(code), "env_vars": env})
            break
        except Exception as e:
            message = str(e).splitlines()[0]
            if "try again later" not in message or time.monotonic() > deadline:
                raise ClusterError(f"the Ray cluster at {run['address']} refused the job: {message}") from None
            time.sleep(2)
    return JobRecord(id=job_id, stage=job.stage.name, config=job.options.config, executor="ray", mode=job.mode,
                     submitted=0, job_dir=str(exp_dir), task=task, log_glob="", ray_address=run["address"],
                     profile=job.profile.name if job.profile else None)
