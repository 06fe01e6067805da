"""Submission to an existing Ray cluster through its Jobs API (`executor = "ray"` profiles).

The job's code dir is staged on this machine, like a local run's, and uploaded as the Ray job's
working_dir; its entry point is the same `python -m recipes.launch`. Secrets are not sent: the Ray
cluster's own environment must hold them."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ClusterError
from ..forms import RAY_ADDRESS
from ..jobprep.jobdir import write_code_dir
from ..jobprep.plan import job_command, task_name
from ..records import JobRecord, State
from .base import Executor, decode, home_artifacts, home_job_dir, profile_at

if TYPE_CHECKING:
    from ..job import Job
    from ..findings import Report
    from ..profile import Profile
    from ..stage import Stage

RAY_STATES = {"PENDING": "PENDING", "RUNNING": "RUNNING", "SUCCEEDED": "COMPLETED", "FAILED": "FAILED",
              "STOPPED": "CANCELLED"}


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


class Ray(Executor):
    name = "ray"
    keys = {**Executor.keys, "address": RAY_ADDRESS}  # the cluster's dashboard (Jobs API), e.g. http://head:8265
    chains = False
    shown_as = "Ray job (Jobs API)"
    # the cluster's Jobs API, and the job's id there (records of older launchers have none: the job id it was)
    handle_types = {"ray_address": str | None, "submission_id": str | None}

    def check(self, stage: Stage, run: dict[str, Any], profile: Profile | None, report: Report) -> None:
        if stage.launch != "ray":
            report.error("job.executor", f"the ray executor runs Ray stages (data prep); submit `{stage.name}` "
                                         "with a slurm profile or on this machine")
        if not run.get("address"):
            report.error("run.address", f"the ray executor needs the cluster's Jobs API address (e.g. "
                                        f"http://head:8265); set address in {profile_at(profile)}")

    def job_dir(self, job: Job, job_id: str) -> str:
        return str(home_job_dir(job, job_id))

    def artifacts_root(self, job: Job) -> str:
        return str(home_artifacts())

    def render(self, job: Job, job_id: str | None, after: Sequence[JobRecord] | Sequence[str] = ()) -> str:
        run = job.config["run"]
        return (f"address:     {run['address']}\n"
                f"entrypoint:  {' '.join(job_command())}\n"
                f"working_dir: {self.shown_dir(job, job_id)}/{task_name(job)}/code\n"
                f"env_vars:    {json.dumps(run.get('env') or {})}")

    def submit(self, job: Job, job_id: str, after: Sequence[JobRecord] = ()) -> JobRecord:
        self.refuse_chain(after)
        exp_dir = home_job_dir(job, job_id)
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
        return self.new_record(job, job_id, job_dir=str(exp_dir), task=task, log_glob="",
                               handle={"ray_address": run["address"], "submission_id": job_id})

    def where(self, record: JobRecord) -> str:
        return f"Ray job on {_address(record)}"

    def log_at(self, record: JobRecord) -> str:
        return "the Ray Jobs API (nemotron jobs logs)"

    def states(self, records: list[JobRecord]) -> dict[str, State]:
        return {r.id: _state(r) for r in records}

    def read_log(self, record: JobRecord, offset: int) -> tuple[str, int]:
        # The Jobs API returns the whole log on every call: only the part after `offset` is new.
        try:
            text = client(_address(record)).get_job_logs(_submission(record))
        except Exception:  # unreachable cluster or forgotten job: no log to show
            return "", offset
        return decode(text.encode()[offset:], offset)

    def cancel(self, record: JobRecord) -> None:
        client(_address(record)).stop_job(_submission(record))


def _state(record: JobRecord) -> State:
    try:
        info = client(_address(record)).get_job_info(_submission(record))
    except ClusterError as e:
        return State("UNKNOWN", None, str(e), "")
    except Exception as e:  # the cluster no longer knows the job
        return State("UNKNOWN", None, str(e).splitlines()[0], "")
    st = State(RAY_STATES.get(str(info.status).split(".")[-1], "UNKNOWN"), None, "", "ray")
    if st.done:
        st.exit_code = 0 if st.state == "COMPLETED" else getattr(info, "driver_exit_code", None)
    return st


def _address(record: JobRecord) -> str:
    return record.handle.get("ray_address")  # type: ignore[return-value]  # checked when the record was read


def _submission(record: JobRecord) -> str:
    return str(record.handle.get("submission_id") or record.id)
