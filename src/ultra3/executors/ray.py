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

from ..contract import ATTEMPTS_FILE, ledger_entries, read_small, write_atomic
from ..errors import ClusterError
from ..findings import skipped
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
FINAL_STATE = "final_state.json"  # in the task dir: the final state the cluster gave, kept for when it is gone


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
    """The final state once recorded; else the cluster's (a final one recorded as it is seen); else, with the
    cluster gone or restarted, the end the job wrote in its job dir (its attempts ledger)."""
    if final := _recorded(record):
        return final
    try:
        info = client(_address(record)).get_job_info(_submission(record))
    except Exception as e:  # unreachable (ClusterError), or the cluster no longer knows the job
        why = str(e) if isinstance(e, ClusterError) else str(e).splitlines()[0]
        return _ledger_end(record) or State("UNKNOWN", None, f"{why}; its job dir holds no end of it either", "")
    st = State(RAY_STATES.get(str(info.status).split(".")[-1], "UNKNOWN"), None, "", "ray")
    if st.done:
        st.exit_code = 0 if st.state == "COMPLETED" else getattr(info, "driver_exit_code", None)
        if st.state == "FAILED":  # its log's reason, kept with the state: the log goes with the cluster
            from ..jobs import failure_reason

            st.reason = failure_reason(record)
        _keep(record, st)
    return st


def _final_path(record: JobRecord) -> str:
    return f"{record.task_dir}/{FINAL_STATE}"


def _keep(record: JobRecord, st: State) -> None:
    try:
        write_atomic(_final_path(record), json.dumps({"state": st.state, "exit_code": st.exit_code,
                                                      "reason": st.reason}) + "\n")
    except OSError:  # its job dir removed (`nemotron jobs prune`): the cluster still says it, while it is up
        pass


def _recorded(record: JobRecord) -> State | None:
    path = _final_path(record)
    try:
        final = json.loads(read_small(path, 4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        skipped(path, "final state file", str(e))
        return None
    if not (isinstance(final, dict) and final.get("state") in RAY_STATES.values()
            and isinstance(final.get("exit_code"), int | None) and isinstance(final.get("reason"), str)):
        skipped(path, "final state file", "not a state, an exit code and a reason")
        return None
    return State(final["state"], final["exit_code"], final["reason"], "job dir")


def _ledger_end(record: JobRecord) -> State | None:
    """The end of the job's last attempt, as its launcher (recipes/attempts.py) wrote it in the job dir on the
    cluster's node (this machine's job dir where the cluster runs here or shares the filesystem); None without one."""
    path = f"{record.job_dir}/{ATTEMPTS_FILE}"
    try:
        entries = ledger_entries(read_small(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        skipped(path, "attempts ledger", str(e))
        return None
    last = max((e["attempt"] for e in entries if e.get("event") == "start"), default=None)
    end = next((e for e in reversed(entries) if e.get("event") == "end" and e["attempt"] == last), None)
    if end is None:
        return None
    if end.get("outcome") == "done":
        return State("COMPLETED", 0, "", "job dir")
    code = end.get("exit")
    return State("FAILED", code if isinstance(code, int) else None, str(end.get("why") or ""), "job dir")


def _address(record: JobRecord) -> str:
    return record.handle.get("ray_address")  # type: ignore[return-value]  # checked when the record was read


def _submission(record: JobRecord) -> str:
    return str(record.handle.get("submission_id") or record.id)
