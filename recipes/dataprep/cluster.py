"""Where the data-prep runtimes run their tasks: processes on this machine, or a Ray cluster.

`backend: auto` (the default) is Ray when `$RAY_ADDRESS` names a cluster (Ray on Slurm across a job's nodes,
or a Ray job), else processes on this machine; `processes` and `ray` choose one (`ray` without an address
starts an embedded local Ray). Both run the same task functions and report the same way: the task code never
knows which ran it.

Processes: pool.Pool, workers forked from a server process that imported the tasks' modules once.

Ray: `ray.init` on this machine's CPUs (those this process may run on), loopback only
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` makes Ray bind 127.0.0.1 instead of the routable address), no
dashboard, usage stats off, a small object store (only task arguments and receipts travel through it);
the workers find the `recipes` package through PYTHONPATH, which they inherit. `ray.shutdown()` at the end
stops every process it started, all at once with SIGKILL once the driver has disconnected; a SIGTERM
(Slurm's scancel) ends the run through the same path. With `$RAY_ADDRESS` it connects instead, and ships
the `recipes` package to the workers as a runtime-env `py_modules` entry. A generator task is a Ray
streaming generator.

Started when needed: a run whose work is all done starts neither. The pretraining prep starts the pool as
soon as it has read its config and found no earlier plan (its server imports the workers' modules while the
driver reads the tokenizer; a config error found after that stops it, leaving nothing), and queues a warm-up
task per worker (imports, tokenizer, the encoder check) while the driver counts the inputs and plans
(`start_while`), before the first shard is queued; Ray starts in `start_while`.

`stream` runs tasks a few at a time and gives their items as they come; `run_ordered` gives their results,
and the first error, in the order of the tasks (the SFT and RL data preps).
"""

from __future__ import annotations

import concurrent.futures as futures
import inspect
import os
import signal
import sys
import threading
import time

from .. import quiet
from . import stop
from .errors import BadRecordError, DataPrepError
from .pool import ClusterError, Pool, local_cpus

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # recipes/
BACKENDS = ("auto", "processes", "ray")
WARM_WAIT_S = 10
STARTS = 2  # an embedded Ray whose raylet misses Ray's fixed 30 s registration limit is started once more
SLOW_START = "timed out during startup"  # ray._private.node's message for that
TICK_S = 1.0  # the longest `stream` waits before giving the caller a turn (None)


class Cluster:
    def __init__(self, backend: str = "auto", object_store_mb: int = 256) -> None:
        self.address = os.environ.get("RAY_ADDRESS") or None
        self.backend = ("ray" if self.address else "processes") if backend == "auto" else backend
        self.object_store_mb = object_store_mb
        self.ray = None  # Ray's module, once started
        self.pool: Pool | None = None  # the process pool, once started
        self.cpus = 0
        self._warming: list = []  # the warm-up tasks

    @property
    def started(self) -> bool:
        return self.ray is not None or self.pool is not None

    @property
    def warming(self) -> bool:
        return bool(self._warming)

    def where(self) -> str:
        if self.backend == "processes":
            return "processes on this machine"
        return f"Ray cluster at {self.address}" if self.address else "embedded local Ray"

    def start_while(self, work, warm=None, args: tuple = (), slots: int | None = None, cpus_per_task: int = 1):
        """Start the workers while `work()` runs, then queue `warm(*args)` as `slots` tasks (default: the CPUs
        / cpus_per_task), so that each starts a worker (the process pool has that many). Returns what `work()`
        returns, or raises what it raised."""
        if self.backend == "processes":  # the pool starts in the background: `work` runs here meanwhile
            count = slots or max(1, local_cpus() // cpus_per_task)
            self.start(*([warm.__module__] if warm else []), processes=count)
            if warm is not None:
                self._warming = [self.pool.submit(warm, *args) for _ in range(count)]
            return work()
        result: dict = {}

        def run_work() -> None:
            try:
                result["value"] = work()
            except BaseException as e:
                result["error"] = e

        thread = threading.Thread(target=run_work, name="while-ray-starts", daemon=True)
        thread.start()
        ray = self.start()  # ray.init wants the main thread
        if warm is not None:
            remote = ray.remote(num_cpus=cpus_per_task)(warm)
            self._warming = [remote.remote(*args) for _ in range(slots or max(1, self.cpus // cpus_per_task))]
        thread.join()
        if "error" in result:
            raise result["error"]
        if self._warming and sum(1 for node in ray.nodes() if node.get("Alive")) > 1:
            # on several nodes, have every node's workers up before the first shard is queued: else the
            # node that starts first takes all the work
            ray.wait(self._warming, num_returns=len(self._warming), timeout=WARM_WAIT_S)
        return result["value"]

    def start(self, *preload: str, processes: int | None = None):
        """The workers, started (or Ray connected to) on the first call: Ray's module, or the pool, whose
        processes (`processes` of them, default one per CPU) start at once, forked from a server that imported
        the modules `preload` first."""
        if self.started:
            return self.ray or self.pool
        if self.backend == "processes":
            self.pool = Pool(preload, processes)
            self.cpus = self.pool.cpus
            return self.pool
        return self._start_ray()

    def _start_ray(self):
        for key, value in (("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"), ("RAY_USAGE_STATS_ENABLED", "0"),
                           ("RAY_DEDUP_LOGS", "0")):
            os.environ.setdefault(key, value)
        # `ray start --head` turns token authentication on when a token exists (~/.ray/auth_token, which
        # any local ray.init() creates), but a driver given an explicit address never does: it would be
        # refused. Use the token when there is one, as `ray start` does (RAY_AUTH_MODE, if set, wins).
        # Ray reads the mode when it is imported.
        if self.address and "RAY_AUTH_MODE" not in os.environ and (
                os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                or os.path.exists(os.path.expanduser("~/.ray/auth_token"))):
            os.environ["RAY_AUTH_MODE"] = "token"
        import ray

        for attempt in range(1, STARTS + 1):
            self.ray = ray  # from here on, stop() shuts Ray down, also when ray.init is interrupted
            try:
                self._init(ray)
                break
            except BaseException as e:
                # Ray half started (a failure, or SIGTERM: ray.init installs a handler that exits with 15):
                # shutdown() cannot reach what it had not registered yet, so its processes are ended here
                try:
                    self.stop()
                finally:
                    kill_descendants()
                if isinstance(e, SystemExit):
                    raise SystemExit(128 + signal.SIGTERM if e.code == signal.SIGTERM else e.code) from None
                if not isinstance(e, Exception):
                    raise
                if attempt < STARTS and not self.address and SLOW_START in str(e):
                    print(f"data prep: the local Ray did not register its node within Ray's own limit (a busy "
                          f"machine?); starting it again ({attempt + 1}/{STARTS})", file=sys.stderr, flush=True)
                    continue
                what = f"connect to the Ray cluster at {self.address}" if self.address else "start a local Ray"
                hint = (" (is RAY_AUTH_MODE/RAY_AUTH_TOKEN the cluster's?)"
                        if "auth" in repr(e.__cause__ or e).lower() else "")
                raise ClusterError(f"cannot {what}: {type(e).__name__}: {str(e).splitlines()[0]}{hint}") from None
        signal.signal(signal.SIGTERM, _terminate)  # ray.init installs its own
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        return ray

    def _init(self, ray) -> None:
        if self.address:
            ray.init(address=self.address, runtime_env={"py_modules": [PACKAGE]}, logging_level=quiet.RAY_LEVEL)
            return
        parent = os.path.dirname(PACKAGE)
        paths = [parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != parent]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        ray.init(num_cpus=local_cpus(), num_gpus=0, include_dashboard=False,
                 object_store_memory=self.object_store_mb << 20, logging_level=quiet.RAY_LEVEL)

    def put(self, value):
        """A large task argument, sent once (Ray's object store) or with each task (processes)."""
        return self.ray.put(value) if self.backend == "ray" else value

    def warmed(self):
        """What the first of the warm-up tasks (start_while) to end returned: a check made where the tasks run."""
        if self.backend == "ray":
            ready, _ = self.ray.wait(self._warming, num_returns=1)
            return self.ray.get(ready[0])
        done, _ = futures.wait(self._warming, return_when=futures.FIRST_COMPLETED)
        return next(iter(done)).result()

    def stream(self, fn, args, workers: int, cpus_per_task: int = 1, name: str | None = None):
        """Run fn(*a) for each a of the iterable `args` (read as slots free up, so it may depend on what came
        back before), at most `workers` at a time. Yields (i, item, last) as they come: a generator task's
        items, its last one with last=True; a plain task's result; (i, error, True) for a task that raised a
        DataPrepError; and None when nothing came within TICK_S. Any other error is raised. `name`: the tasks'
        name on Ray (default: the function's). At the time-limit signal while tasks are left, stop.TimeLimit, the
        running tasks ended (stop.py)."""
        self.start(fn.__module__)
        todo = _Peekable(enumerate(args))
        inflight: dict = {}
        try:
            if self.backend == "ray":
                events = self._ray_tasks(fn, todo, inflight, workers, cpus_per_task, name or fn.__name__)
            else:
                events = self.pool.tasks(fn, todo, inflight, workers)
            if stop.requested() and todo.more():  # the time-limit signal: no task starts
                raise stop.TimeLimit
            for event in events:
                yield event
                if stop.requested() and (inflight or todo.more()):  # no task more, the running ones ended (finally)
                    raise stop.TimeLimit
        finally:
            self._cancel(inflight)

    def _ray_tasks(self, fn, todo, inflight: dict, workers: int, cpus_per_task: int, name: str):
        ray = self.ray
        generator = inspect.isgeneratorfunction(fn)
        options = {"num_returns": "streaming"} if generator else {"max_retries": 2}
        remote = ray.remote(num_cpus=cpus_per_task, **options)(fn).options(name=name)
        last: dict = {}  # a generator task's latest item: its result once the generator ends
        while True:
            while len(inflight) < workers and (item := next(todo, None)) is not None:
                i, a = item
                inflight[remote.remote(*a)] = i
            if not inflight:
                return
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=TICK_S)
            if not ready:
                yield None
            for ref in ready:
                i = inflight[ref]
                try:
                    if not generator:
                        del inflight[ref]
                        yield i, ray.get(ref), True
                        continue
                    try:
                        step = ray.get(next(ref))
                    except StopIteration:
                        del inflight[ref]
                        yield i, last.pop(i, None), True
                        continue
                    if i in last:
                        yield i, last[i], False
                    last[i] = step
                except Exception as e:  # a RayTaskError: a config or input problem is its cause
                    cause = getattr(e, "cause", None) or e
                    if not isinstance(cause, DataPrepError):
                        raise
                    inflight.pop(ref, None)
                    yield i, type(cause)(str(cause).splitlines()[-1]), True

    def _cancel(self, inflight: dict) -> None:
        if self.backend == "ray":
            for ref in inflight:
                self.ray.cancel(ref, force=True)
        elif inflight:  # the pool cannot stop a running task: its workers go
            self._kill_pool()

    def run_ordered(self, fn, args: list, workers: int, interval: float, label: str, unit,
                    cpus_per_task: int = 1) -> list:
        """Run fn(*a) for each a in `args`, at most `workers` at a time; results in argument order. A failure is
        reported once every earlier task has finished, so the error is the first in input order."""
        results: list = [None] * len(args)
        failures: dict = {}
        done, last = 0, time.time()
        pending = (a for a in args if not failures)  # no new task after a failure
        for event in self.stream(fn, pending, workers, cpus_per_task):
            if event is not None:
                i, value, finished = event
                if isinstance(value, DataPrepError):
                    failures[i] = value
                elif finished:
                    results[i] = value
                    done += 1
            if time.time() - last >= interval:
                last = time.time()
                print(f"{label}: {done}/{len(args)} done, {unit(results)}", flush=True)
        if failures:
            first = failures[min(failures)]
            raise (BadRecordError if isinstance(first, BadRecordError) else DataPrepError)(str(first))
        return results

    def stop(self) -> None:
        warming, self._warming = self._warming, []
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.shutdown()
            return
        if self.ray is None:
            return
        try:
            # a warm-up task still running at shutdown (a run stopped by an input error found while Ray
            # started) has the driver's core worker print an error line on stderr: let them end first
            if warming:
                self.ray.wait(warming, num_returns=len(warming), timeout=WARM_WAIT_S)
        except Exception:  # a cluster already lost: nothing to wait for
            pass
        finally:
            node = None if self.address else getattr(self.ray._private.worker, "_global_node", None)
            if hasattr(node, "kill_all_processes"):  # ours: all of it at once (its agents too), not one by one
                node.kill_all_processes = lambda **kw: kill_descendants()
            self.ray.shutdown()
            self.ray = None

    def _kill_pool(self) -> None:
        pool, self.pool = self.pool, None
        pool.kill()

    def __enter__(self) -> Cluster:
        signal.signal(signal.SIGTERM, _terminate)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self.pool is not None:  # an error or a signal: no waiting for the tasks
            self._kill_pool()
        self.stop()


class _Peekable:
    """An iterator that tells whether it has an item more, without losing it."""

    def __init__(self, items) -> None:
        self.items, self.next = iter(items), []

    def __iter__(self):
        return self

    def __next__(self):
        return self.next.pop() if self.next else next(self.items)

    def more(self) -> bool:
        if not self.next:
            self.next = [item for item in (next(self.items, None),) if item is not None]
        return bool(self.next)


def kill_descendants() -> None:
    """SIGKILL every process this one started, children and theirs (Linux /proc)."""
    children: dict = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    todo, found = [os.getpid()], []
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _terminate(signum, frame) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a repeat (recipes.launch passes it on) must not cut the cleanup short
    raise SystemExit(128 + signum)
