"""Commands on the machine that holds a job or an artifact store: this one, or a cluster's login node over SSH
(the executors, the artifact store and image lookups run them). Always an argv list; over SSH the remote shell
parses one string, so the argv is quoted with shlex.join."""

from __future__ import annotations

import os
import shlex
import subprocess

from .errors import ClusterError, UserError

TIMEOUT_VAR = "ULTRA3_SCHEDULER_TIMEOUT"


def scheduler_timeout() -> float:
    """How long one scheduler command (sbatch, sacct, squeue, scancel, over SSH or not) may take: 60 s, or
    $ULTRA3_SCHEDULER_TIMEOUT seconds (a busy controller, a slow job_submit plugin)."""
    value = os.environ.get(TIMEOUT_VAR, "60")
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 1 <= seconds <= 86400:
        raise UserError(f"${TIMEOUT_VAR}={value!r}: must be a number of seconds from 1 to 86400; unset it for 60")
    return seconds


def run(argv: list[str], ssh: dict | None = None, timeout: float | None = None,
        text: bool = True) -> subprocess.CompletedProcess:
    timeout = timeout or scheduler_timeout()
    full = ssh_argv(ssh) + [shlex.join(argv)] if ssh else argv
    try:
        return subprocess.run(full, capture_output=True, text=text, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"'{argv[0]}' did not answer within {timeout:.0f}s") from None
    except FileNotFoundError as e:
        raise ClusterError(f"cannot run {full[0]}: {e}") from None


def ssh_argv(ssh: dict) -> list[str]:
    """Each setting an option's argument and the host after `--`: no value is read as an option of ssh."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
    if ssh.get("port"):
        argv += ["-p", str(ssh["port"])]
    if ssh.get("identity"):
        argv += ["-i", os.path.expanduser(ssh["identity"])]
    if ssh.get("user"):
        argv += ["-l", ssh["user"]]
    return argv + ["--", ssh["host"]]


def ssh_of(run: dict) -> dict | None:
    """The SSH settings of a job's `run` table, None for the login node itself."""
    return {k: run.get(k) for k in ("host", "user", "port", "identity")} if run.get("host") else None
