"""The state of Slurm jobs: one sacct (and at most one squeue) call per cluster, the end marker in the
job dir when accounting forgot a job, and what the jobs a job waits for (its `after`) did to it."""

from __future__ import annotations

import json
from pathlib import Path

from ..records import TERMINAL, JobRecord, State, load
from ..ssh import run

END_MARK = "job exited with code"  # the last line NeMo-Run's batch script writes


def slurm_id(record: JobRecord) -> str | None:
    """The job's id in Slurm, from its handle (a Slurm record's: Slurm.handle_types)."""
    return record.handle.get("slurm_id")  # type: ignore[return-value]


def ssh(record: JobRecord) -> dict | None:
    """The SSH settings of the cluster's login node; None: submitted from it."""
    return record.handle.get("ssh")  # type: ignore[return-value]


def states(records: list[JobRecord]) -> dict[str, State]:
    by_cluster: dict[str, list[JobRecord]] = {}
    for r in records:
        if slurm_id(r):
            by_cluster.setdefault(json.dumps(ssh(r), sort_keys=True), []).append(r)
    result: dict[str, State] = {}
    for group in by_cluster.values():
        result.update(_cluster_states(group))
    return result


def _cluster_states(records: list[JobRecord]) -> dict[str, State]:
    """These jobs' states, and their upstream jobs' in the same calls."""
    known = {r.id: r for r in records}
    for r in records:
        for job_id in r.after:
            upstream = known.get(job_id) or load(job_id)
            if upstream and slurm_id(upstream):
                known[job_id] = upstream
    found = _scheduler_states(list(known.values()))
    by_id = {r.id: found.get(slurm_id(r)) or _job_dir_state(r) for r in known.values()}
    for r in records:
        _upstream_reason(r, by_id)
    return {r.id: by_id[r.id] for r in records}


# why the scheduler ended a job, where the job's own log cannot say it
ENDED_BY_SLURM = {
    "TIMEOUT": "reached its time limit (run.time) before its stage stopped and requeued the job; submit it again to "
               "go on from its last checkpoint, or give it more time (run.time) or more warning (run.grace_s)",
    "NODE_FAIL": "a node of the job failed; submit it again (it goes on from its last checkpoint)",
    "OUT_OF_MEMORY": "a process ran out of host memory (Slurm's memory limit, run.mem)",
    "PREEMPTED": "preempted by a job of higher priority",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "reached its deadline before it could end",
}


def _scheduler_states(records: list[JobRecord]) -> dict[str, State]:
    """Slurm id -> state, from sacct, else (accounting lags or forgot the job) from the controller. sacct
    lists every attempt of a job (-D): a job Slurm requeued (after a node failure) says so. A command that
    fails leaves its cause in the reason of a job no one could place."""
    login = ssh(records[0])
    found: dict[str, State] = {}
    attempts: dict[str, list[str]] = {}
    acct = run(["sacct", "--parsable2", "--noheader", "-X", "-D", "-j", ",".join(slurm_id(r) for r in records),
                "--format=JobID,State,ExitCode,Reason"], login)
    for line in acct.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 4:
            st = parts[1].split()[0].rstrip("+")  # "CANCELLED by 0" -> CANCELLED
            code, _, signal = parts[2].partition(":")  # "0:53": ended by signal 53, not exit code 0
            signalled = st in TERMINAL and st != "CANCELLED" and signal not in ("", "0")
            exit_code = int(code) if st in TERMINAL and st != "CANCELLED" and code.isdigit() and not signalled else None
            reason = parts[3] if st == "PENDING" and parts[3] != "None" else f"ended by signal {signal}" if signalled \
                else ENDED_BY_SLURM.get(st, "")
            if parts[0] in found:  # an earlier attempt
                attempts.setdefault(parts[0], []).append(found[parts[0]].state)
            found[parts[0]] = State(st, exit_code, reason, "sacct")
    for jid, earlier in attempts.items():
        st = found[jid]
        by_slurm = [s for s in earlier if s != "REQUEUED"]  # REQUEUED: by the job itself (recipes/attempts.py)
        again = f"requeued by Slurm after {', '.join(by_slurm)} (attempt {len(earlier) + 1})" if by_slurm else \
            f"attempt {len(earlier) + 1}, the job requeued itself after each earlier one"
        st.reason = f"{again}; {st.reason}" if st.reason else again
    causes = [] if acct.returncode == 0 else [_failed("sacct", acct)]
    missing = [slurm_id(r) for r in records if slurm_id(r) not in found]
    # accounting lags the controller: a job pending there without a reason yet (its dependency, its
    # priority) is asked about in the controller's live queue too
    unexplained = [slurm_id(r) for r in records if slurm_id(r) in found and found[slurm_id(r)].state == "PENDING"
                   and not found[slurm_id(r)].reason]
    if missing or unexplained:
        queue = run(["squeue", "-h", "-j", ",".join(missing + unexplained), "-o", "%i|%T|%r"], login)
        for line in queue.stdout.splitlines():
            jid, st, reason = (line.split("|") + ["", ""])[:3]
            found[jid] = State(st, None, "" if reason == "None" else reason, "squeue")
        if queue.returncode != 0 and "Invalid job id" not in queue.stderr:
            causes.append(_failed("squeue", queue))
    for r in records:
        if slurm_id(r) not in found and causes:
            found[slurm_id(r)] = _job_dir_state(r, "; ".join(causes))
    return found


def _failed(command: str, proc) -> str:
    said = " ".join(proc.stderr.split())[:200] or "no message"
    return f"{command} failed (exit {proc.returncode}: {said})"


def _job_dir_state(record: JobRecord, causes: str = "") -> State:
    """Neither sacct nor squeue knows the job (`causes`: why they could not say): read the end marker
    NeMo-Run's script writes."""
    marks = run(["find", record.task_dir, "-maxdepth", "1", "-name", f"sbatch_*_{slurm_id(record)}.out",
                 "-exec", "grep", "-a", "-h", f"^{END_MARK}", "{}", "+"], ssh(record)).stdout.split("\n")
    last = [line for line in marks if line.strip()][-1:]
    if last:
        code = int(last[0].rsplit(" ", 1)[-1])
        return State("COMPLETED" if code == 0 else "FAILED", code, "", "job dir")
    return State("UNKNOWN", None, causes or "neither sacct nor squeue knows the job", "")


class EndMarks:
    """The exit codes of the batch script's last line (END_MARK), attempt by attempt, read on this machine from
    its output file (one for all of the job's attempts) as the file grows."""

    def __init__(self, record: JobRecord):
        self.folder, self.name = Path(record.task_dir), f"sbatch_*_{slurm_id(record)}.out"
        self.offset = 0
        self.codes: list[int] = []
        self.read()

    def read(self) -> list[int]:
        path = next(self.folder.glob(self.name), None)
        if path is None or not path.is_file():  # not started yet; a fifo or a device is never opened
            return self.codes
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self.offset += len(whole)
        mark = END_MARK.encode() + b" "
        self.codes += [int(line[len(mark):]) for line in whole.splitlines()
                       if line.startswith(mark) and line[len(mark):].isdigit()]
        return self.codes


def _upstream_reason(record: JobRecord, by_id: dict[str, State]) -> None:
    """A job cancelled because a job of its `after` did not complete (--kill-on-invalid-dep) says which;
    a job pending on its dependency says which job it waits for."""
    st = by_id[record.id]
    if st.state not in ("CANCELLED", "PENDING") or (st.state == "PENDING" and not st.reason.startswith("Dependency")):
        return
    # a failed upstream before a cancelled one: the reason, not another victim of it
    for job_id in sorted(record.after, key=lambda j: (by_id.get(j) or State("")).state == "CANCELLED"):
        up = by_id.get(job_id)
        if up is None or up.state == "COMPLETED" or (st.state == "CANCELLED" and not up.done):
            continue
        st.upstream = job_id
        st.reason = f"upstream {job_id} {up.state}" if up.done else f"waiting for upstream {job_id} {up.state}"
        if st.state == "CANCELLED":
            st.exit_code = None  # it never ran
        return

