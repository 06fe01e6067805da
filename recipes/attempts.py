"""One run, many allocations: the first node's ledger of a job's attempts, and what follows each one.

An attempt is one start of the job: its submission, or a requeue (by this module at the time limit or after a
failure, or by Slurm after a node failure: the job keeps its id and its job dir). The ledger is
`<job dir>/attempts.jsonl`, one JSON line as each attempt starts and one as it ends. After an attempt:
- exit 0: the run is done; `finished.json` marks it, and an attempt started after that runs nothing;
- CONTINUE_EXIT: the stage saved its work and stopped (the time-limit signal): requeued, whatever failed before;
- a config or input error (the preflight's, the runtime's exit 2) and Megatron's exit 17: stopped, never retried;
- any other end (Megatron's exit 16 too): requeued while the failures in a row stay within run.max_retries.
An attempt that left no end line (a node failure, a kill) is closed by the next one as a failure.
Stdlib only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

from .contract import (ATTEMPT_ENDED, ATTEMPT_MARK, ATTEMPTS_FILE, CONTINUE_EXIT, CONTINUE_SIGNAL, FINISHED_FILE,
                       INPUT_ERROR_EXIT, PREFLIGHT_EXIT, RERUN_EXIT, VALIDATION_EXIT, ledger_entries, write_atomic)

FAILED = ("failed", "lost")  # the outcomes that count against run.max_retries
STOP_MARGIN_S = 10  # the watchdog requeues this long before the end it expects after the signal
SIGNALS = {137: "SIGKILL: out of host memory, or killed", 139: "SIGSEGV", 134: "SIGABRT", 143: "SIGTERM"}


def _path(cfg: dict, name: str) -> str:
    return os.path.join(cfg["job"]["dir"], name)


def read(cfg: dict) -> list[dict]:
    try:
        with open(_path(cfg, ATTEMPTS_FILE), encoding="utf-8") as f:
            return ledger_entries(f.read())
    except FileNotFoundError:
        return []


def _append(cfg: dict, entry: dict) -> None:
    """One line, on a line of its own: after a torn last line (its writer died) too."""
    with open(_path(cfg, ATTEMPTS_FILE), "a+b") as f:
        torn = False
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        f.write((b"\n" if torn else b"") + json.dumps(entry).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def finished(cfg: dict) -> dict | None:
    """The finished marker of this run: in the job dir, or in job.outputs when the run's outputs live there
    (shared by every submission of the config: a finished run leaves nothing for a new submission to do)."""
    for folder in _marker_dirs(cfg):
        try:
            with open(os.path.join(folder, FINISHED_FILE), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            continue
    return None


def _marker_dirs(cfg: dict) -> list[str]:
    job = cfg["job"]
    shared = job.get("outputs")
    under = shared and any(str(out.get("path", "")).startswith(shared + "/") for out in job.get("produces") or [])
    return [job["dir"], shared] if under else [job["dir"]]


def failures_in_a_row(entries: list[dict]) -> int:
    count = 0
    for entry in entries:
        if entry.get("event") == "end":
            count = count + 1 if entry.get("outcome") in FAILED else 0
    return count


def begin(cfg: dict) -> dict | int:
    """The first node, before the preflight: this attempt's start entry, or the exit code when nothing may run
    (the run finished; the failures in a row spent run.max_retries)."""
    if done := finished(cfg):
        print(f"ultra3: this run finished at {done.get('at')} (attempt {done.get('attempt')}); nothing to run",
              flush=True)
        return 0
    entries = read(cfg)
    ended = {e["attempt"] for e in entries if e.get("event") == "end"}
    for start in [e for e in entries if e.get("event") == "start" and e["attempt"] not in ended]:
        entries.append({"event": "end", "attempt": start["attempt"], "at": None, "outcome": "lost", "exit": None,
                        "why": "ended without a word: a node failure, preemption or a kill"})
        _append(cfg, entries[-1])
    number = 1 + max((e["attempt"] for e in entries), default=0)
    attempt = {"event": "start", "attempt": number, "at": time.time(), "host": socket.gethostname(),
               "slurm_job": os.environ.get("SLURM_JOB_ID"), "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
               "nodes": int(os.environ.get("SLURM_NNODES", 1))}
    _append(cfg, attempt)
    _say(f"{ATTEMPT_MARK} {number}: Slurm job {attempt['slurm_job']} (restart {attempt['restart']}) on "
         f"{attempt['host']} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    spent = failures_in_a_row(entries)
    limit = _max_retries(cfg)
    if spent > limit:
        _stop(cfg, attempt, None, f"{spent} failed attempts in a row, over run.max_retries={limit}: stopped")
        return 1
    return attempt


def _max_retries(cfg: dict) -> int:
    value = (cfg.get("run") or {}).get("max_retries")
    return value if isinstance(value, int) and value >= 0 else 0


class Watch:
    """The time-limit signal on this node: noted when it comes, never fatal here, and ignored by the children
    started while it is armed (a runtime that stops on it installs its own handler). On the first node, a stage
    still running STOP_MARGIN_S before the end the signal announced is given up for lost and the job requeued,
    so the run goes on from its last save instead of ending TIMEOUT."""

    def __init__(self, cfg: dict, attempt: dict | None) -> None:
        self.cfg, self.attempt = cfg, attempt
        self.signalled: float | None = None
        self.sig = getattr(signal, CONTINUE_SIGNAL)
        signal.signal(self.sig, signal.SIG_IGN)  # inherited by the children as ignored

    def armed(self) -> None:
        """Once the child is started: note the signal from now on."""
        signal.signal(self.sig, self._noted)

    def _noted(self, signum, frame) -> None:
        if self.signalled is None:
            self.signalled = time.time()
            print(f"ultra3: {CONTINUE_SIGNAL} from Slurm: the time limit is near; the stage saves and stops",
                  flush=True)
            grace = (self.cfg.get("job") or {}).get("grace_s")
            if self.attempt and isinstance(grace, int) and grace > STOP_MARGIN_S:
                timer = threading.Timer(grace - STOP_MARGIN_S, self._overdue)
                timer.daemon = True  # a stage that stops in time ends the job now, not when the timer would fire
                timer.start()

    def _overdue(self) -> None:
        waited = round(time.time() - (self.signalled or time.time()))
        end(self.cfg, self.attempt, None, self, f"did not stop within {waited} s of the time-limit signal "
                                                "(run.grace_s); its last save is kept")


_ENDED: set[tuple[str, int]] = set()  # an attempt ends once: by its stage's exit, or by the watchdog
_ENDING = threading.Lock()


def _first_end(cfg: dict, attempt: dict) -> bool:
    with _ENDING:
        key = (cfg["job"]["dir"], attempt["attempt"])
        if key in _ENDED:
            return False
        _ENDED.add(key)
        return True


def end(cfg: dict, attempt: dict, code: int | None, watch: Watch | None, why: str = "") -> int:
    """Record how the attempt ended and act on it: mark the run finished, requeue it, or stop. Returns the
    exit code for the job step (a requeued job is ended by Slurm first)."""
    if not _first_end(cfg, attempt):
        return CONTINUE_EXIT if code is None else code
    if code == 0:
        at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        _record(cfg, attempt, code, "done", "completed")
        for folder in _marker_dirs(cfg):
            write_atomic(os.path.join(folder, FINISHED_FILE),
                         json.dumps({"at": at, "attempt": attempt["attempt"], "job": cfg["job"].get("id")}) + "\n")
        return 0
    if code in (PREFLIGHT_EXIT, INPUT_ERROR_EXIT):  # its one line, the log's last, says why
        _record(cfg, attempt, code, "stopped", "a config or input error: never retried")
        return code
    if code == VALIDATION_EXIT:
        return _stop(cfg, attempt, code, "Megatron's re-run state machine: a result failed validation again (exit "
                                         "17); never retried: roll back to an earlier iteration (--from RUN@N)")
    if code == CONTINUE_EXIT:
        outcome = "continue"
        why = "stopped for the time limit with its work saved" if watch and watch.signalled else \
            "stopped early with its work saved"
    else:
        outcome = "failed"
        why = why or _failure(code)
    if not os.environ.get("SLURM_JOB_ID"):  # nothing requeues it
        return _stop(cfg, attempt, code, why, outcome)
    if code is not None and (state := _slurm_state()) not in (None, "RUNNING"):
        return _stop(cfg, attempt, code, f"{why}; ended by Slurm ({state})", outcome)
    if outcome == "failed":
        spent, limit = failures_in_a_row(read(cfg)) + 1, _max_retries(cfg)
        if spent > limit:
            return _stop(cfg, attempt, code, f"{why}; {spent} failed attempts in a row, over run.max_retries={limit}",
                         outcome)
        why = f"{why}; retry {spent} of run.max_retries={limit}"
    return _requeue(cfg, attempt, code, outcome, why)


def _say(line: str) -> None:
    """A Slurm job's log spans its attempts and says where each starts and ends; elsewhere a job is one attempt,
    and its log ends with the stage's own last line."""
    if os.environ.get("SLURM_JOB_ID"):
        print(line, flush=True)


def _failure(code: int | None) -> str:
    if code == RERUN_EXIT:
        return "Megatron's re-run state machine asks to resume from its checkpoint (exit 16)"
    return f"exit code {code}" + (f" ({SIGNALS[code]})" if code in SIGNALS else "")


def _record(cfg: dict, attempt: dict, code: int | None, outcome: str, why: str) -> None:
    _append(cfg, {"event": "end", "attempt": attempt["attempt"], "at": time.time(), "outcome": outcome,
                  "exit": code, "why": why})


def _stop(cfg: dict, attempt: dict, code: int | None, why: str, outcome: str = "stopped") -> int:
    _record(cfg, attempt, code, outcome, why)
    _say(f"{ATTEMPT_ENDED} {attempt['attempt']} {outcome}: {why}; the run stops")
    return code or 1


def _requeue(cfg: dict, attempt: dict, code: int | None, outcome: str, why: str) -> int:
    """Requeue the Slurm job (same id, same job dir): its next attempt goes on from what this one saved."""
    job_id = os.environ["SLURM_JOB_ID"]
    _record(cfg, attempt, code, outcome, why)
    print(f"{ATTEMPT_ENDED} {attempt['attempt']} {outcome}: {why}; requeueing Slurm job {job_id}", flush=True)
    done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"ultra3: error: scontrol requeue {job_id} failed: {done.stderr.strip() or done.returncode}; submit "
              "the job again to go on", flush=True)
    return code or 1


def _slurm_state() -> str | None:
    """The job's state in the controller: RUNNING unless Slurm itself is ending it (cancelled, timed out)."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None
