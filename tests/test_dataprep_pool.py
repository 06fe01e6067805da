"""The data preps' process pool (recipes/dataprep/pool.py, behind cluster.Cluster with backend `processes`): real
worker processes forked from a forkserver, the same task protocol as on Ray (a generator task's items stream to the
driver, its last item is its result; a DataPrepError comes back as an event; `run_ordered` gives the first error in
task order); and a worker that dies stops the run with one line instead of hanging it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from recipes.dataprep import cluster
from recipes.dataprep.errors import BadRecordError, DataPrepError


def counting(n: int, pause: float):
    """A generator task: its progress 1..n-1, then its result."""
    for i in range(1, n):
        time.sleep(pause)
        yield ("progress", i)
    yield {"n": n, "pid": os.getpid()}


def square_or_fail(x: int, fail_after: float | None):
    if fail_after is not None:
        time.sleep(fail_after)
        raise (BadRecordError if x % 2 else DataPrepError)(f"task {x} failed")
    return x * x


def die(_):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with cluster.Cluster() as c:
        yield c


def test_auto_is_processes_here_and_ray_with_an_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    here = cluster.Cluster()
    assert (here.backend, here.where()) == ("processes", "processes on this machine")
    assert cluster.Cluster("ray").where() == "embedded local Ray"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    there = cluster.Cluster()
    assert (there.backend, there.where()) == ("ray", "Ray cluster at 127.0.0.1:6379")
    assert cluster.Cluster("processes").backend == "processes"
    assert not there.started  # choosing starts nothing


def test_generator_tasks_stream_their_progress_then_their_result(pool):
    events = [e for e in pool.stream(counting, [(4, 0.05), (2, 0.0), (3, 0.05)], workers=2) if e is not None]
    by_task: dict = {}
    for i, item, last in events:
        by_task.setdefault(i, []).append((item, last))
    assert sorted(by_task) == [0, 1, 2]
    for i, n in enumerate((4, 2, 3)):
        *steps, (result, last) = by_task[i]
        assert last and result["n"] == n and result["pid"] != os.getpid()  # ran in a worker
        assert all(not is_last for _, is_last in steps)
        assert [s for s, _ in steps] == [("progress", k) for k in range(1, n)]  # in order, none lost
    assert pool.cpus == len(os.sched_getaffinity(0))


def test_run_ordered_gives_results_in_order_and_the_first_error_in_task_order(pool):
    assert pool.run_ordered(square_or_fail, [(x, None) for x in range(7)], 2, 60, "t", str) == \
        [x * x for x in range(7)]
    # task 1 fails after task 2 has failed: task 1's error is the one reported, with its own type
    with pytest.raises(BadRecordError, match="task 1 failed"):
        pool.run_ordered(square_or_fail, [(0, None), (1, 0.5), (2, 0.0), (3, None)], 3, 60, "t", str)


def test_a_worker_that_dies_ends_the_run_with_one_line(pool):
    started = time.time()
    with pytest.raises(cluster.ClusterError, match=r"^a worker process ended without finishing its task"):
        list(pool.stream(die, [(1,)], workers=1))
    assert time.time() - started < 30


def test_an_error_in_the_driver_kills_the_running_tasks(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(KeyError):
        with cluster.Cluster() as c:
            for event in c.stream(counting, [(1000, 0.01)], workers=1):
                if event is not None:
                    pids = [p.pid for p in c.pool.processes()]
                    raise KeyError("the driver's own error")
    deadline = time.time() + 10
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("processes", [1, 2])
def test_the_tasks_run_in_the_processes_started_and_no_others(monkeypatch, processes):
    """A pool started with fewer processes than CPUs (`workers: 1`, or `cpus_per_task` above 1) keeps to them:
    a task queued just as another ends must not start a cold process (its first shard took 0.8 s, against
    0.25 s in a warmed one, and the two then took turns)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("recipes.dataprep.pool.local_cpus", lambda: 4)
    with cluster.Cluster() as c:
        c.start(processes=processes)
        pids = {item["pid"] for _, item, last in
                filter(None, c.stream(counting, [(1, 0.0)] * 40, workers=processes)) if last}
        assert len(pids) == processes
        assert {p.pid for p in c.pool.processes()} == pids


def started_at(pause: float) -> float:
    started = time.time()
    time.sleep(pause)
    return started


def test_a_worker_that_ends_a_task_starts_the_next_without_waiting_for_the_driver(monkeypatch):
    """Every process busy: one task more waits in the executor's queue, so a worker starts it as soon as it
    ends one, even while the driver is busy with what came back (here it sleeps 1 s on each result)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started, received = {}, {}
    with cluster.Cluster() as c:
        c.start(processes=1)
        for event in c.stream(started_at, [(0.3,)] * 3, workers=1):
            if event is not None:
                i, started[i], _ = event
                received[i] = time.time()
                time.sleep(1.0)
    assert sorted(started) == [0, 1, 2]
    for i in (0, 1):
        assert started[i + 1] < received[i] + 0.5  # not after the driver's sleep
