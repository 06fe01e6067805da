"""Ray for the data-prep runtimes: an embedded local Ray by default, or the cluster at `$RAY_ADDRESS`.

Embedded: `ray.init` on this machine's CPUs (those this process may run on), loopback only
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` makes Ray bind 127.0.0.1 instead of the routable address), no
dashboard, usage stats off, a small object store (only task arguments and receipts travel through it);
the workers find the `recipes` package through PYTHONPATH, which they inherit. `ray.shutdown()` at the end
stops every process it started, all at once with SIGKILL once the driver has disconnected (an embedded Ray
holds nothing worth the graceful exit Ray would wait for, process after process); a SIGTERM (Slurm's
scancel) ends the run through the same path.

`$RAY_ADDRESS` set (Ray on Slurm, a Ray job): connect to it; the `recipes` package is shipped to the
workers as a runtime-env `py_modules` entry, so they need not see this directory.

Started lazily: a run whose shards are all done, or that stops on a config error, never starts Ray. A run
that will write shards starts it while the driver counts the inputs and plans on a thread (`start_while`),
then has the workers start (`warm`: imports, tokenizer) before the first shard is queued.

`run_ordered` runs a list of tasks a few at a time and gives their results, and the first error, in the
list's order (the SFT and RL data preps).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from .errors import BadRecordError, DataPrepError

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # recipes/
WARM_WAIT_S = 10
STARTS = 2  # an embedded Ray whose raylet misses Ray's fixed 30 s registration limit is started once more
SLOW_START = "timed out during startup"  # ray._private.node's message for that


def local_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class ClusterError(Exception):
    """Ray could not be started or reached."""


class Cluster:
    def __init__(self, object_store_mb: int = 256) -> None:
        self.object_store_mb = object_store_mb
        self.ray = None
        self.cpus = 0
        self.address = os.environ.get("RAY_ADDRESS") or None
        self._warming: list = []  # the refs of the warm-up tasks

    def start_while(self, work, warm=None, args: tuple = (), slots: int | None = None, cpus_per_task: int = 1):
        """Start Ray here (ray.init wants the main thread) while `work()` runs on a thread; then queue
        `warm(*args)` as `slots` tasks (default: the cluster's CPUs / cpus_per_task), so that each starts a
        worker (waited for only on a multi-node cluster). Returns what `work()` returns, or raises what it raised."""
        result: dict = {}

        def run_work() -> None:
            try:
                result["value"] = work()
            except BaseException as e:
                result["error"] = e

        thread = threading.Thread(target=run_work, name="while-ray-starts", daemon=True)
        thread.start()
        ray = self.start()
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

    def start(self):
        """Ray, started (or connected to) on the first call."""
        return self.ray if self.ray is not None else self._start()

    def _start(self):
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
            ray.init(address=self.address, runtime_env={"py_modules": [PACKAGE]}, logging_level=logging.ERROR)
            return
        parent = os.path.dirname(PACKAGE)
        paths = [parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != parent]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        ray.init(num_cpus=local_cpus(), num_gpus=0, include_dashboard=False,
                 object_store_memory=self.object_store_mb << 20, logging_level=logging.ERROR)

    def stop(self) -> None:
        if self.ray is None:
            return
        warming, self._warming = self._warming, []
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

    def __enter__(self) -> Cluster:
        signal.signal(signal.SIGTERM, _terminate)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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


def run_ordered(ray, remote, args: list, workers: int, interval: float, label: str, unit) -> list:
    """Run remote(*a) for each a in `args`, at most `workers` at a time; results in argument order. A
    failure is reported once every earlier task has finished, so the error is the first in input order."""
    results: list = [None] * len(args)
    failures: dict = {}
    inflight: dict = {}
    nxt, done, last = 0, 0, time.time()
    try:
        while (nxt < len(args) and not failures) or inflight:
            while nxt < len(args) and not failures and len(inflight) < workers:
                inflight[remote.remote(*args[nxt])] = nxt
                nxt += 1
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                i = inflight.pop(ref)
                try:
                    results[i] = ray.get(ref)
                    done += 1
                except Exception as e:  # a RayTaskError; a config/input problem is its cause
                    cause = getattr(e, "cause", None) or e
                    if not isinstance(cause, DataPrepError):
                        raise
                    failures[i] = cause
            if time.time() - last >= interval:
                last = time.time()
                print(f"{label}: {done}/{len(args)} done, {unit(results)}", flush=True)
    finally:
        for ref in inflight:
            ray.cancel(ref, force=True)
    if failures:
        first = failures[min(failures)]
        raise (BadRecordError if isinstance(first, BadRecordError) else DataPrepError)(str(first))
    return results


def where() -> str:
    return f"Ray cluster at {os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else "embedded local Ray"

