"""One writer per output directory: `<output_dir>/.ultra3-lock`, made with O_EXCL, names the run holding it (its
job id, host and pid). A second run refuses with that name; a lock whose process is gone (same host) is taken
over, so a killed run never blocks the next."""

from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator

from .errors import DataPrepError

LOCK = ".ultra3-lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextmanager
def holding(out: str, job: str | None, instead: str = "or choose another output_dir") -> Iterator[None]:
    """Hold `out`'s lock while the block writes there; the directories made for it go again if left empty.
    `instead`: what else the refused run may do."""
    from .files import missing_dirs

    made = missing_dirs(out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise DataPrepError(f"output_dir {out} cannot be created ({e.strerror}); choose a writable directory") from None
    try:
        with _locked(out, job, instead):
            yield
    finally:
        for path in made:  # deepest first
            try:
                os.rmdir(path)
            except OSError:
                break


@contextmanager
def _locked(out: str, job: str | None, instead: str) -> Iterator[None]:
    path = os.path.join(out, LOCK)
    me = {"job": job or "a run without a job id", "host": socket.gethostname(), "pid": os.getpid(),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = _holder(path) or {}
            stale = held.get("host") == me["host"] and isinstance(held.get("pid"), int) and not _alive(held["pid"])
            if stale or not held:  # its writer died (or never finished writing it): take it over
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                continue
            raise DataPrepError(f"{out} is being written by {held.get('job')} (pid {held.get('pid')} on "
                                f"{held.get('host')}, since {held.get('since')}); wait for it or cancel it "
                                f"(nemotron jobs cancel {held.get('job')}), {instead}; remove "
                                f"{path} only if that run is gone") from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        break
    else:
        raise DataPrepError(f"{path}: could not take the output dir's lock; remove it if no run writes there")
    try:
        yield
    finally:
        if (_holder(path) or {}).get("pid") == me["pid"]:
            os.unlink(path)
