"""What the launchers of one job's nodes share: where they meet (files of this Slurm job in the shared job
dir), how long they wait for each other, the preflight on every node, how each runs its child process, and
a free port. Stdlib only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Callable

from . import preflight

WAIT_S = 600  # for the other nodes: their preflight, the Ray head's address, every Ray node


def run_child(argv: list[str], env: dict | None = None, started: Callable[[], None] | None = None) -> int:
    """Run `argv` (in this process group) until it ends, passing on the SIGTERM and SIGINT this process gets;
    its exit code, 128+N when signal N ended it (as a shell reports it). `started` is called once it runs."""
    print("+ " + " ".join(argv))
    child: list[subprocess.Popen] = []

    def forward(signum, frame) -> None:
        if not child:
            raise SystemExit(128 + signum)
        child[0].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        child.append(subprocess.Popen(argv, env=env))
        if started:
            started()
        code = child[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def job_file(cfg: dict, name: str) -> str:
    """A file of this Slurm job (this attempt) in the shared job dir, for the nodes to meet."""
    job = f"{os.environ.get('SLURM_JOB_ID', 'job')}-{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    return os.path.join(cfg["job"]["dir"], f"{name}-{job}")


def preflight_everywhere(cfg: dict, nodes: int) -> bool:
    """This node's preflight, then the others': all nodes go on or all stop, each reporting its own
    problems (the first node to exit non-zero ends the others: srun --kill-on-bad-exit)."""
    ok = preflight.report(cfg)
    mine = job_file(cfg, f"preflight-node{os.environ.get('SLURM_NODEID', '0')}")
    with open(mine + ".tmp", "w") as f:
        f.write("ok" if ok else "failed")
    os.replace(mine + ".tmp", mine)
    files = [job_file(cfg, f"preflight-node{rank}") for rank in range(nodes)]
    deadline = time.time() + WAIT_S
    while not all(os.path.exists(f) for f in files) and time.time() < deadline:
        time.sleep(1)
    failed = [rank for rank, f in enumerate(files) if read(f) != "ok"]
    if not failed:
        return True
    if ok:
        print(f"stopping: the preflight failed on node(s) {', '.join(map(str, failed))}")
    if os.environ.get("SLURM_NODEID", "0") != "0":
        raise SystemExit(0)
    # The first node exits 3 for the job once the others are gone (srun would end a node still running
    # then, and the job's exit code would be that node's 143).
    time.sleep(2)
    return False


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def free_port(ip: str | None) -> int:
    with socket.socket() as s:
        s.bind((ip or "", 0))
        return s.getsockname()[1]
