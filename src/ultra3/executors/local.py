"""The embedded default: run the job on this machine, in a job dir laid out like a Slurm one."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..contract import read_small, write_atomic
from ..errors import ClusterError
from ..findings import skipped
from ..jobprep.jobdir import write_code_dir
from ..jobprep.plan import local_command, task_name
from ..records import JobRecord, State
from .base import NODE_KEYS, Executor, check_fault_tolerance, home_artifacts, home_job_dir, local_files, read_from

if TYPE_CHECKING:
    from ..job import Job
    from ..findings import Report
    from ..profile import Profile
    from ..stage import Stage

LOG = "log-local.out"
SCRIPT = "job.sh"
CANCEL_CODES = (-15, 143, 130)  # SIGTERM as Python and bash report it, and Ctrl-C
CANCEL_GRACE_S = 5.0  # how long a cancelled job has to stop on SIGTERM


class Local(Executor):
    name = "local"
    keys = {**Executor.keys, **NODE_KEYS}
    chains = False
    runs_here = True
    poll_s = 0.1  # a file and a pid to look at
    settle_s = 0.0  # the exit code is written after the job's output is closed
    shown_as = "local command"
    # pid: the job's process (its group's leader); started: that process's `<boot id>/<start time>`, so a later
    # process given the same pid is not taken for it (records of older launchers have none)
    handle_types = {"pid": int | None, "started": str | None}

    def check(self, stage: Stage, run: dict[str, Any], profile: Profile | None, report: Report) -> None:
        check_fault_tolerance(stage, run, report)
        nodes = run.get("nodes") or 1
        if nodes > 1:  # every stage's: a stage that sizes its own nodes (RL's layout) says so in the quoted source
            report.error("run.nodes", f"{nodes} nodes, but the local executor runs on this machine only; submit "
                                      "with --run/--batch PROFILE, or bring it to 1 where it is set",
                         quoting=("run.nodes",))

    def job_dir(self, job: Job, job_id: str) -> str:
        return str(home_job_dir(job, job_id))

    def artifacts_root(self, job: Job) -> str:
        return str(home_artifacts())

    def render(self, job: Job, job_id: str | None, after: Sequence[JobRecord] | Sequence[str] = ()) -> str:
        return " ".join(local_command(job))

    def submit(self, job: Job, job_id: str, after: Sequence[JobRecord] = ()) -> JobRecord:
        self.refuse_chain(after)
        exp_dir = home_job_dir(job, job_id)
        task = task_name(job)
        code = exp_dir / task / "code"
        code.mkdir(parents=True)
        write_code_dir(job, job_id, str(exp_dir), code)
        run = job.config["run"]
        env = {**os.environ, **{k: str(v) for k, v in (run.get("env") or {}).items()}, "PYTHONUNBUFFERED": "1"}
        script = exp_dir / task / SCRIPT
        script.write_text(job_script(job, exp_dir / task))
        script.chmod(0o755)
        # The job's own process group, so cancel stops everything it started.
        proc = subprocess.Popen(["bash", str(script)], cwd=code, env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self.new_record(job, job_id, job_dir=str(exp_dir), task=task, log_glob=f"{task}/{LOG}",
                               handle={"pid": proc.pid, "started": _started(proc.pid)})  # not reaped: still its pid

    def where(self, record: JobRecord) -> str:
        return f"pid {_pid(record)}"

    def states(self, records: list[JobRecord]) -> dict[str, State]:
        return {r.id: _state(r) for r in records}

    def read_log(self, record: JobRecord, offset: int) -> tuple[str, int]:
        return read_from(local_files([Path(record.job_dir, record.log_glob)]), offset)

    def cancel(self, record: JobRecord) -> None:
        """SIGTERM to the job's process group; what still runs after CANCEL_GRACE_S (a Ray start that holds the
        signal back) is killed, and the cancellation recorded as its exit code. Only while the record's pid is
        still the job's own process (_is_job): never the group of a later process given the same pid."""
        if not _is_job(record):
            st = _state(record)
            raise ClusterError(f"{record.id} not cancelled: {f'it ended {st.state}' if st.done else st.reason}")
        os.killpg(_pid(record), signal.SIGTERM)
        deadline = time.time() + CANCEL_GRACE_S
        while _is_job(record) and time.time() < deadline:
            time.sleep(0.2)
        if _is_job(record):
            try:
                os.killpg(_pid(record), signal.SIGKILL)
            except ProcessLookupError:
                return
            exit_file = Path(record.task_dir) / "exit_code"
            if not exit_file.is_file():
                write_atomic(str(exit_file), "143\n")


def job_script(job: Job, task_dir: Path) -> str:
    """Run from the code dir. The exit code lands in the task dir, where `jobs status` reads it from any
    later shell: also when a setup line exits, or cancel's SIGTERM stops the script (143, as bash reports it)."""
    record_exit = f"echo $? > {shlex.quote(str(task_dir / 'exit_code'))}"
    setup = "".join(f"{line}\n" for line in job.config["run"].get("setup") or [])
    return (f"#!/bin/bash\n"
            f"trap {shlex.quote(record_exit)} EXIT\n"
            "trap 'exit 143' TERM\n"
            f"{setup}{shlex.join(local_command(job))} > ../{LOG} 2>&1\n")


def _state(record: JobRecord) -> State:
    alive = _is_job(record)  # first: a process gone has written its whole exit code
    code = _exit_code(record)
    if code is not None:
        if code == 0:
            return State("COMPLETED", 0, "", "job dir")
        return State("CANCELLED" if code in CANCEL_CODES else "FAILED", code, "", "job dir")
    if alive:
        return State("RUNNING", None, "", "process")
    return State("UNKNOWN", None, f"its process (pid {_pid(record)}) is gone and left no exit code: killed (SIGKILL, "
                                  "out of memory) or the machine restarted", "")


def _exit_code(record: JobRecord) -> int | None:
    path = f"{record.task_dir}/exit_code"
    try:
        text = read_small(path, 64).strip()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        skipped(path, "exit code file", str(e))
        return None
    try:
        return int(text) if text else None  # empty: being written
    except ValueError:
        skipped(path, "exit code file", f"{text[:20]!r} is not an exit code")
        return None


def _is_job(record: JobRecord) -> bool:
    """Whether the record's pid is still the job's process: alive, the leader of its own session, and started
    when the job was. A record of an older launcher has no start time: the process must run the job's script
    (`bash <task dir>/job.sh`, a path that holds the job id)."""
    pid, started = _pid(record), record.handle.get("started")
    stat = _stat(pid) if pid else None
    if stat is None or stat[0] == "Z" or not stat[2] == stat[3] == str(pid):
        return False
    if started:
        return started == _started(pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(64 * 1024) == f"bash\0{Path(record.task_dir, SCRIPT)}\0".encode()
    except OSError:
        return False


def _pid(record: JobRecord) -> int | None:
    return record.handle.get("pid")  # type: ignore[return-value]  # an int: checked when the record was read


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read(4096).rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """`<boot id>/<start time in clock ticks since boot>` of a process: no two processes of a pid share it."""
    stat = _stat(pid)
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read(64).strip()
    except OSError:
        return None
    return f"{boot}/{stat[19]}" if stat else None
