"""Processes on this machine (the data preps' `backend: processes`): a pool of workers forked from a server
process (multiprocessing's `forkserver`) that imported the tasks' modules once, so a worker costs a fork, not
an interpreter and its imports. The workers start at once, from a background thread, since the first waits
for the server's imports. A task that is a generator streams its items (progress) to the driver through one
queue; its last item is its result. A worker that dies (out of memory) stops the run with one line."""

from __future__ import annotations

import concurrent.futures as futures
import inspect
import multiprocessing
import os
import signal
import threading

from ..contract import CONTINUE_SIGNAL
from .errors import DataPrepError


KILL_WAIT_S = 10  # for a killed worker to be gone


class ClusterError(Exception):
    """The workers could not be started or reached."""


def local_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Pool:
    def __init__(self, preload: tuple = (), processes: int | None = None) -> None:
        """`processes` workers (default and at most: one per CPU), started now, forked from a server that
        imported the modules `preload` first (one that fails to import is skipped). No other process is started
        later: the executor would start one, cold, for a task queued just as another ends."""
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["recipes.dataprep.errors", *preload])
        self.cpus = local_cpus()
        self.queue = context.SimpleQueue()  # the items of generator tasks, from every worker
        self.count = count = min(processes or self.cpus, self.cpus)
        self.executor = futures.ProcessPoolExecutor(count, mp_context=context, initializer=_worker_init,
                                                    initargs=(self.queue,))
        # a process per task submitted while none is idle
        self._starting: threading.Thread | None = threading.Thread(
            target=_start_workers, args=(self.executor, count),
            name="pool-start", daemon=True)
        self._starting.start()

    def submit(self, fn, *args) -> futures.Future:
        return self.executor.submit(fn, *args)

    def processes(self) -> list:
        return list(getattr(self.executor, "_processes", {}).values())

    def tasks(self, fn, todo, inflight: dict, workers: int):
        """Cluster.stream's loop on the pool: fn(*a) for (i, a) of `todo`, at most `workers` at a time, their
        futures in `inflight` (future -> i). Where every process is used, one task more waits in the executor's
        queue, so that a worker that ends a task starts the next at once, not after a trip to the driver."""
        generator = inspect.isgeneratorfunction(fn)
        queued = workers + 1 if workers >= self.count else workers
        while True:
            while len(inflight) < queued and (item := next(todo, None)) is not None:
                i, a = item
                inflight[self.submit(_call, i, fn, tuple(a), generator)] = i
            if not inflight:
                return
            done, _ = futures.wait(inflight, timeout=0.2, return_when=futures.FIRST_COMPLETED)
            live = set(inflight.values())
            while not self.queue.empty():
                i, step = self.queue.get()
                if i in live:
                    yield i, step, False
            for future in done:
                i = inflight.pop(future)
                try:
                    yield i, future.result(), True
                except DataPrepError as e:
                    yield i, e, True
                except futures.process.BrokenProcessPool:
                    raise ClusterError("a worker process ended without finishing its task (killed, or out of "
                                       "memory?)") from None
            if not done:
                yield None

    def _started_all(self) -> None:
        """Wait until every process is started: one still starting when the driver ends would fail to read its
        arguments (their semaphores gone) and print a traceback."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None

    def shutdown(self) -> None:
        """Once the tasks queued have run."""
        self._started_all()
        self.executor.shutdown(wait=True, cancel_futures=True)

    def kill(self) -> None:
        """Now: a running task cannot be stopped, so its worker goes (gone on return: nothing it writes after)."""
        self._started_all()
        processes = self.processes()
        for process in processes:  # Python 3.14 has kill_workers()
            process.kill()
        for process in processes:
            process.join(KILL_WAIT_S)
        # its workers gone, the executor's thread ends at once: waiting for it lets the queues' semaphores be
        # released here, not left to multiprocessing's resource tracker (which warns of them on stderr)
        self.executor.shutdown(wait=True, cancel_futures=True)


_queue = None  # in a worker: where generator tasks put their items


def _ready() -> None:
    """A task that only has a worker process started."""


def _start_workers(executor, count: int) -> None:
    try:
        for _ in range(count):
            executor.submit(_ready)
    except futures.BrokenExecutor:  # a worker died starting: the run's next submit reports it
        pass


def _worker_init(queue) -> None:
    global _queue
    _queue = queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(getattr(signal, CONTINUE_SIGNAL), signal.SIG_IGN)  # the time-limit signal too (dataprep/stop.py)


def _call(i: int, fn, args: tuple, generator: bool):
    """In a worker: fn(*args); a generator's items but the last go to the queue, the last is the result."""
    if not generator:
        return fn(*args)
    previous = none = object()
    for item in fn(*args):
        if previous is not none:
            _queue.put((i, previous))
        previous = item
    return None if previous is none else previous
