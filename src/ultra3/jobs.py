"""The job registry ($NEMOTRON_HOME/jobs/<id>.json) and job state from Slurm or the local process,
so status, logs and cancel work from any later shell."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from .errors import ClusterError, UserError
from .paths import state_home

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}
PREFLIGHT_MARK = "PREFLIGHT FAILED"


@dataclass
class JobRecord:
    id: str
    stage: str
    config: str
    executor: str  # local | slurm
    mode: str  # attached | detached | local
    submitted: float
    job_dir: str  # the experiment dir (on the cluster for SSH submissions)
    task: str
    log_glob: str  # the job's log file(s), relative to job_dir
    profile: str | None = None
    slurm_id: str | None = None
    pid: int | None = None  # local runs
    ssh: dict | None = None  # host, user, port, identity for SSH submissions
    ray_address: str | None = None  # the Ray cluster of an `executor = "ray"` job
    argv: list[str] = field(default_factory=list)

    @property
    def task_dir(self) -> str:
        return f"{self.job_dir}/{self.task}"


def registry_dir() -> Path:
    return state_home() / "jobs"


def save(record: JobRecord) -> None:
    registry_dir().mkdir(parents=True, exist_ok=True)
    path = registry_dir() / f"{record.id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2))
    tmp.replace(path)


def all_records() -> list[JobRecord]:
    records = []
    for path in registry_dir().glob("*.json"):
        try:
            records.append(JobRecord(**json.loads(path.read_text())))
        except (ValueError, TypeError):
            continue  # a record from another version, or half-written: skip it
    return sorted(records, key=lambda r: r.submitted, reverse=True)


def find(ref: str) -> JobRecord:
    """A job id, a Slurm job id, or a unique prefix of a job id."""
    records = all_records()
    exact = [r for r in records if ref in (r.id, r.slurm_id)]
    matches = exact or [r for r in records if r.id.startswith(ref) or r.id.split("_", 1)[-1].startswith(ref)]
    if not matches:
        raise UserError(f"no job '{ref}' in {registry_dir()}; see `nemotron jobs list`")
    if len(matches) > 1:
        raise UserError(f"'{ref}' matches {len(matches)} jobs ({', '.join(r.id for r in matches[:4])}...); "
                        "give more of the id")
    return matches[0]


# -- commands on the machine that holds the job (this one, or the cluster over SSH) -------------

def shell(record: JobRecord, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    argv = ssh_argv(record.ssh) + [command] if record.ssh else ["bash", "-c", command]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"'{command.split()[0]}' did not answer within {timeout:.0f}s") from None
    except FileNotFoundError as e:
        raise ClusterError(f"cannot run {argv[0]}: {e}") from None


def ssh_argv(ssh: dict) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
    if ssh.get("port"):
        argv += ["-p", str(ssh["port"])]
    if ssh.get("identity"):
        argv += ["-i", os.path.expanduser(ssh["identity"])]
    return argv + [f"{ssh['user']}@{ssh['host']}" if ssh.get("user") else ssh["host"]]


# -- state ---------------------------------------------------------------------------------------

@dataclass
class State:
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... or UNKNOWN
    exit_code: int | None = None
    reason: str = ""  # why it is pending, or why it failed
    source: str = ""  # sacct, squeue, job dir, process

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


def states(records: list[JobRecord]) -> dict[str, State]:
    """One sacct (and at most one squeue) call per cluster for all the given jobs."""
    result: dict[str, State] = {}
    by_host: dict[str, list[JobRecord]] = {}
    for r in records:
        if r.executor == "local":
            result[r.id] = _local_state(r)
        elif r.executor == "ray":
            result[r.id] = _ray_state(r)
        elif r.slurm_id:
            by_host.setdefault(json.dumps(r.ssh, sort_keys=True), []).append(r)
    for group in by_host.values():
        result.update(_slurm_states(group))
    return result


def state(record: JobRecord) -> State:
    return states([record]).get(record.id, State("UNKNOWN"))


def _slurm_states(records: list[JobRecord]) -> dict[str, State]:
    ids = ",".join(r.slurm_id for r in records if r.slurm_id)
    found: dict[str, State] = {}
    acct = shell(records[0], f"sacct --parsable2 --noheader -X -j {ids} --format=JobID,State,ExitCode,Reason")
    for line in acct.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4:
            st = parts[1].split()[0].rstrip("+")  # "CANCELLED by 0" -> CANCELLED
            code = parts[2].split(":")[0]
            found[parts[0]] = State(st, int(code) if st in TERMINAL and code.isdigit() else None,
                                    parts[3] if st == "PENDING" and parts[3] != "None" else "", "sacct")
    missing = [r for r in records if r.slurm_id not in found]
    if missing:  # accounting lags or forgot the job: ask the controller
        queue = shell(records[0], f"squeue -h -j {','.join(r.slurm_id for r in missing)} -o '%i|%T|%r'")
        for line in queue.stdout.splitlines():
            jid, st, reason = (line.split("|") + ["", ""])[:3]
            found[jid] = State(st, None, "" if reason == "None" else reason, "squeue")
    result = {}
    for r in records:
        st = found.get(r.slurm_id) or _job_dir_state(r)
        if st.done and st.state != "COMPLETED" and not st.reason:
            st.reason = failure_reason(r)
        result[r.id] = st
    return result


def _job_dir_state(record: JobRecord) -> State:
    """Neither sacct nor squeue knows the job: read the end marker NeMo-Run's script writes."""
    out = shell(record, f"cat {shlex.quote(record.task_dir)}/sbatch_*_{record.slurm_id}.out 2>/dev/null | "
                        "grep -a '^job exited with code' | tail -n 1").stdout.strip()
    if out:
        code = int(out.rsplit(" ", 1)[-1])
        return State("COMPLETED" if code == 0 else "FAILED", code, "", "job dir")
    return State("UNKNOWN", None, "neither sacct nor squeue knows the job", "")


def _local_state(record: JobRecord) -> State:
    exit_file = Path(record.task_dir) / "exit_code"
    if exit_file.is_file() and exit_file.read_text().strip():
        code = int(exit_file.read_text().strip())
        if code == 0:
            return State("COMPLETED", 0, "", "job dir")
        st = State("CANCELLED" if code in (-15, 143, 130) else "FAILED", code, "", "job dir")
        st.reason = failure_reason(record) if st.state == "FAILED" else ""
        return st
    if record.pid and _alive(record.pid):
        return State("RUNNING", None, "", "process")
    return State("UNKNOWN", None, "the process is gone and left no exit code", "")


RAY_STATES = {"PENDING": "PENDING", "RUNNING": "RUNNING", "SUCCEEDED": "COMPLETED", "FAILED": "FAILED",
              "STOPPED": "CANCELLED"}


def _ray_state(record: JobRecord) -> State:
    from .launch.ray_jobs import client

    try:
        info = client(record.ray_address).get_job_info(record.id)
    except ClusterError as e:
        return State("UNKNOWN", None, str(e), "")
    except Exception as e:  # the cluster no longer knows the job
        return State("UNKNOWN", None, str(e).splitlines()[0], "")
    st = State(RAY_STATES.get(str(info.status).split(".")[-1], "UNKNOWN"), None, "", "ray")
    if st.done:
        st.exit_code = 0 if st.state == "COMPLETED" else getattr(info, "driver_exit_code", None)
        st.reason = failure_reason(record) if st.state == "FAILED" else ""
    return st


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


# -- logs ----------------------------------------------------------------------------------------

def log_text(record: JobRecord) -> str:
    if record.executor == "ray":
        from .launch.ray_jobs import client

        try:
            return client(record.ray_address).get_job_logs(record.id)
        except Exception:  # unreachable cluster or forgotten job: no log to show
            return ""
    return shell(record, f"cat {shlex.quote(record.job_dir)}/{record.log_glob} 2>/dev/null").stdout


def failure_reason(record: JobRecord) -> str:
    """The preflight's one-line reason if it stopped the job, else the log's last line."""
    lines = [l for l in log_text(record).splitlines() if l.strip()]
    marked = [l for l in lines if PREFLIGHT_MARK in l]
    if marked:
        return marked[-1][marked[-1].index(PREFLIGHT_MARK):].strip()
    return lines[-1].strip() if lines else ""


def follow(record: JobRecord, out, poll: float = 1.0) -> State:
    """Print the log as it grows until the job ends; return the final state."""
    printed = 0
    while True:
        st = state(record)
        text = log_text(record)
        if len(text) > printed:
            out.write(text[printed:])
            out.flush()
            printed = len(text)
        if st.done or (record.executor == "local" and st.state == "UNKNOWN"):
            time.sleep(poll)  # the last lines land after the state flips
            rest = log_text(record)[printed:]
            out.write(rest)
            out.flush()
            return st
        time.sleep(poll)


def cancel(record: JobRecord) -> None:
    if record.executor == "ray":
        from .launch.ray_jobs import client

        client(record.ray_address).stop_job(record.id)
        return
    if record.executor == "local":
        if record.pid and _alive(record.pid):
            os.killpg(record.pid, signal.SIGTERM)
        return
    result = shell(record, f"scancel {record.slurm_id}")
    if result.returncode != 0:
        raise ClusterError(f"scancel {record.slurm_id} failed: {result.stderr.strip()}")
