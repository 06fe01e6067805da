"""One writer per output directory: `<output_dir>/.ultra3-lock`, made with O_EXCL, names the run holding it (its
job id, host, pid and the process's start time). A second run refuses with that name; a lock whose process is
gone (same host: no such pid, a zombie not yet reaped, or another process that has its pid since) is taken over,
so a killed run never blocks the next. Files a failed run leaves under temporary names go with it."""

from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator

from .errors import DISK_FULL, DataPrepError

LOCK = ".ultra3-lock"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the state first, the start time 20th); None for
    no such process, [] where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].decode().split()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else []
    except OSError:
        return []


def _started(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None


def _alive(pid: int, started: str | None) -> bool:
    """Whether the process that took the lock still runs: not a zombie (killed, its parent yet to reap it), nor
    another process given its pid since (another start time)."""
    fields = _stat(pid)
    if fields == []:  # no /proc: whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return fields is not None and fields[0] not in ("Z", "X") and started in (None, fields[19])


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
    from .files import missing_dirs, remove_temporary

    made = missing_dirs(out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise DataPrepError(f"output_dir {out} cannot be created ({e.strerror}); choose a writable directory") from None
    try:
        with _locked(out, job, instead):
            try:
                yield
            except BaseException:
                remove_temporary(out)  # of tasks stopped halfway (their workers are gone by now)
                raise
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
          "started": _started(os.getpid()), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = _holder(path) or {}
            stale = held.get("host") == me["host"] and isinstance(held.get("pid"), int) and \
                not _alive(held["pid"], held.get("started"))
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
        except OSError as e:
            if e.errno in DISK_FULL:
                raise
            raise DataPrepError(f"output_dir {out} is not writable ({e.strerror}); choose a writable directory") \
                from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(me, f)
        except BaseException:  # a full disk: no half-written lock left behind
            os.unlink(path)
            raise
        break
    else:
        raise DataPrepError(f"{path}: could not take the output dir's lock; remove it if no run writes there")
    try:
        yield
    finally:
        if (_holder(path) or {}).get("pid") == me["pid"]:
            os.unlink(path)
