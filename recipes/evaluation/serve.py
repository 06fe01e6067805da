"""The checkpoint behind an OpenAI-compatible endpoint in the job: `vllm serve` (serve.command) on this node at the
layout's tensor/pipeline parallel sizes, its log in the job dir, waited for with a bounded timeout. A server that
exits or does not answer in time is one line naming the wait, the log and its last line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from contextlib import contextmanager

from .errors import EvalFailed

SERVED_NAME = "checkpoint"  # the model name the endpoint serves (the completions' `model`)


def argv(serve: dict, checkpoint: str, port: int) -> list[str]:
    command = serve.get("command") or ["vllm", "serve"]
    args = [*command, checkpoint, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
            "--tensor-parallel-size", str(serve.get("tensor_parallel_size") or 1),
            "--pipeline-parallel-size", str(serve.get("pipeline_parallel_size") or 1)]
    if serve.get("max_model_len"):
        args += ["--max-model-len", str(serve["max_model_len"])]
    return [*args, *(serve.get("extra_args") or [])]


def last_line(log: str) -> str:
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in deque(f, maxlen=20) if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "the log is empty"


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log: str, poll_s: float = 2.0) -> float:
    """Seconds until GET <url>/models answers; EvalFailed when the server exits or the wait runs out."""
    started = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise EvalFailed(f"the model server exited with code {proc.returncode} before it answered at {url}; "
                             f"see {log} (last line: {last_line(log)})")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as answer:
                json.load(answer)
            return time.monotonic() - started
        except (OSError, ValueError, urllib.error.URLError):
            pass
        if time.monotonic() - started > timeout_s:
            raise EvalFailed(f"the model server did not answer at {url} within {timeout_s:g} s (serve.start_timeout_s)"
                             f"; see {log} (last line: {last_line(log)})")
        time.sleep(poll_s)


@contextmanager
def served(serve: dict, checkpoint: str, port: int, log: str, say):
    """The endpoint's base URL while the server runs; the server is stopped on the way out."""
    args = argv(serve, checkpoint, port)
    say(f"serving {checkpoint}: {' '.join(args)} (log {log})")
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        seconds = wait_ready(proc, url, float(serve.get("start_timeout_s") or 1800), log)
        say(f"the model server answers at {url} after {seconds:.0f} s")
        yield url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """The server and the workers it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
