"""The time-limit signal in a data prep whose finished work is kept (pretrain's shards by their receipts, RL's
blends): Slurm sends SIGUSR1 run.grace_s before the limit; no task is started after it, the running ones are ended
(a shard or blend counts only once its receipt is written, so nothing half-written is taken), what finished is
kept, and the runtime exits CONTINUE_EXIT: the job requeues itself and the next allocation goes on from there.

The handler is installed once the workers exist (the first `Cluster.stream`): the job's launcher ignores the
signal for its children, and the pool's and Ray's processes, started before it, keep ignoring it."""

from __future__ import annotations

import signal
import threading

from ..contract import CONTINUE_SIGNAL

_enabled = False
_requested = threading.Event()


class TimeLimit(Exception):
    """The signal came: `finished` tasks ended in this attempt before it."""

    def __init__(self, finished: int) -> None:
        super().__init__(finished)
        self.finished = finished


def enable() -> None:
    """This runtime keeps its finished work across attempts, so it may stop at the signal."""
    global _enabled
    _enabled = True


def arm() -> None:
    if _enabled and threading.current_thread() is threading.main_thread():
        signal.signal(getattr(signal, CONTINUE_SIGNAL), lambda signum, frame: _requested.set())


def check(finished: int) -> None:
    if _requested.is_set():
        raise TimeLimit(finished)
