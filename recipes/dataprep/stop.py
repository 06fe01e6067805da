"""The time-limit signal in a data prep: Slurm sends SIGUSR1 (contract.CONTINUE_SIGNAL) run.grace_s before the time
limit. Every data prep keeps the tasks it finishes by their receipts (pretrain's shards, SFT's tokenized partitions
and packed shards, RL's blends), so at the signal no task is started, the running ones are ended (the pool's
workers killed, Ray's tasks cancelled: what they wrote under temporary names goes, and a task without its receipt
is done again from scratch), nothing final is written, and the runtime exits CONTINUE_EXIT with one line (`K of N
shards done, M left for the next allocation`): the job requeues itself and the next allocation goes on from the
receipts. One that finished nothing in its allocation exits 1 instead: going on would get no further. A signal
after the last task has finished changes nothing: the run ends as usual.

The handler is installed as the runtime starts (`armed`), and the signal blocked in its thread: every thread and
process started from it (the pool's, Ray's) inherits the block, so the signal, which Slurm may send to every
process of the step, never ends one of them; in the runtime it is either handled by a thread started before (a
library's) or waits, pending, until `requested` sees it. The pool's workers also ignore it (pool.py)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ..contract import CONTINUE_EXIT, CONTINUE_SIGNAL

SIGNAL = getattr(signal, CONTINUE_SIGNAL)
_requested = threading.Event()
_armed = False


class TimeLimit(Exception):
    """The signal came while tasks were left: the running ones are ended as this unwinds."""


@dataclass
class Work:
    """What the run does now: `total` tasks of `unit`, `before` of them done when it began; `count()` is how many
    are done (their receipts), read once the workers are gone; `fix`: what gets more of them done in an allocation;
    `then`: what follows them."""

    unit: str
    total: int
    before: int
    count: Callable[[], int]
    fix: str
    then: str = ""


_work: Work | None = None
_gained = 0  # tasks of the run's earlier phases done in this allocation


def working(work: Work) -> None:
    """The run's work from here on (SFT: its partitions, then its shards)."""
    global _work, _gained
    if _work is not None:
        _gained += _work.count() - _work.before
    _work = work


@contextmanager
def armed() -> Iterator[None]:
    """The signal noted while the block runs (main thread only), as described above; as before after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _work, _gained, _armed
    _work, _gained, _armed = None, 0, True
    handler = signal.signal(SIGNAL, lambda signum, frame: _requested.set())
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(SIGNAL, handler)
        _armed = False
        _requested.clear()


def requested() -> bool:
    return _armed and (_requested.is_set() or SIGNAL in signal.sigpending())


def all_done() -> bool:
    """After a TimeLimit: whether the work's tasks are all done even so (the signal came as the last ones ended, and
    a Ray task writes its receipt before the driver hears of it): the run then ends as usual."""
    return _work is not None and _work.count() == _work.total


def stopped(prog: str) -> int:
    """The exit of a run that the signal stopped (TimeLimit), with its one line."""
    if _work is None:
        print(f"{prog}: error: the time limit came before the tasks began (reading the inputs, planning): the next "
              "allocation would get no further; give each allocation more time (run.time)", file=sys.stderr,
              flush=True)
        return 1
    done = _work.count()
    if _gained + done - _work.before <= 0:
        print(f"{prog}: error: the time limit came before any of the {_work.total} {_work.unit} finished in this "
              f"allocation ({done} done in earlier ones): the next would get no further; {_work.fix}",
              file=sys.stderr, flush=True)
        return 1
    print(f"{prog}: stopped for the time limit: {done} of {_work.total} {_work.unit} done, {_work.total - done} left "
          f"for the next allocation{_work.then}", flush=True)
    return CONTINUE_EXIT
