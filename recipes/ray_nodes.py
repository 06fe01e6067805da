"""A Ray cluster over a Slurm allocation, for a Ray stage on several nodes: the head and the driver on the
first node, a worker on every other, each node's resources (its group of the job's layout, its place in the
topology) and free ports of its own, and an orderly stop (the workers' Ray before the head's). Ray itself is
imported only on the head, once the preflight has passed."""

from __future__ import annotations

import collections
import glob
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable

from . import quiet
from .contract import GROUP_RESOURCE, HEAD_NODE_VAR, PREFLIGHT_EXIT, PREFLIGHT_MARK
from .nodes import WAIT_S, free_port, job_file, read, run_child

STOP_WAIT_S = 30  # for the worker nodes to stop their Ray before the head stops its own


def ray_across_nodes(cfg: dict, driver: list[str], started: Callable[[], None] | None = None) -> int:
    """A Ray cluster over the Slurm allocation: the head and the driver on the first node, a worker on
    every other. Each node picks free ports of its own (nothing collides with another Ray on the same
    machine); the head publishes its address in the shared job dir, and its exit marker there releases
    the workers with exit 0."""
    tag = job_file(cfg, "ray")
    # The cluster lives and dies with this allocation: no token (a token file would be a secret in the
    # shared job dir), and the same setting for the head, the workers and the drivers.
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    os.environ.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "2")
    # workers report their tasks every 100 ms, not every second: fewer of those ending just before the
    # driver go missing from the tasks-per-node line
    os.environ.setdefault("RAY_task_events_report_interval_ms", "100")
    temp = tempfile.mkdtemp(prefix="ray-u3-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    try:
        if os.environ.get("SLURM_NODEID", "0") == "0":
            return _ray_head(cfg, driver, tag, temp, started)
        return _ray_worker(cfg, tag, temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def node_group(cfg: dict, rank: int) -> str | None:
    """This node's group in the job's layout (`job.node_groups`: [[group, nodes], ...] in node order)."""
    first = 0
    for group, count in cfg["job"].get("node_groups") or []:
        if first <= rank < first + count:
            return group
        first += count
    return None


def _ray_start(cfg: dict, ip: str | None, temp: str, *extra: str) -> subprocess.Popen:
    """`ray start --block` for this node: its Slurm CPUs and GPUs, its group of the layout as a Ray resource
    (GROUP_RESOURCE + name, one per node) and its place in the topology (topology_resources), no dashboard,
    free ports (Ray's fixed defaults, such as the dashboard agent's 52365, collide between Rays on one
    machine)."""
    argv = [os.path.join(os.path.dirname(sys.executable), "ray"), *quiet.RAY_CLI_OPTIONS, "start", "--block",
            "--disable-usage-stats", f"--temp-dir={temp}", "--min-worker-port=0", "--max-worker-port=0",
            f"--dashboard-agent-listen-port={free_port(ip)}", *extra]
    if ip:
        argv.append(f"--node-ip-address={ip}")
    if os.environ.get("SLURM_CPUS_ON_NODE"):
        argv.append(f"--num-cpus={os.environ['SLURM_CPUS_ON_NODE']}")
    if os.environ.get("SLURM_GPUS_ON_NODE"):  # what the allocation grants this node
        argv.append(f"--num-gpus={os.environ['SLURM_GPUS_ON_NODE']}")
    resources = topology_resources()
    if group := node_group(cfg, int(os.environ.get("SLURM_NODEID", "0"))):
        resources = {GROUP_RESOURCE + group: 1, **resources}
    argv.append("--resources=" + json.dumps(resources))
    if cfg.get("object_store_mb"):
        argv.append(f"--object-store-memory={int(cfg['object_store_mb']) << 20}")
    print("+ " + " ".join(argv))
    return quiet.RayCli(argv)


def topology_resources() -> dict[str, int]:
    """Where this node sits, as the Ray resources NeMo RL reads to place its workers by NVLink domain and then
    by position (nemo_rl/distributed/virtual_cluster.py: NVLINK_DOMAIN_PREFIX and TOPO_RANK_KEY, which its
    ray.sub sets; its recipes' `cluster.segment_size` picks whole segments of one domain)."""
    found = {"topo_rank": topo_rank()}
    if uuid := nvlink_cluster_uuid():
        found[f"nvlink_domain_{uuid}"] = 1
    return found


def nvlink_cluster_uuid() -> str | None:
    """The GPUs' NVLink fabric (`nvidia-smi -q`'s ClusterUUID, one per GB200 NVL72 rack), or None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "ClusterUUID":
            return value.strip() or None
    return None


def topo_rank() -> int:
    """This node's position: Slurm's block topology address `<block>.<node>` as block * 10^10 + node (the
    digits of each), else its rank in the job + 1 (Ray drops a resource of 0)."""
    addr = os.environ.get("SLURM_TOPOLOGY_ADDR", "")
    if os.environ.get("SLURM_TOPOLOGY_ADDR_PATTERN") == "block.node":
        block, node = (re.sub(r"\D", "", part) for part in (addr.split(".")[0], addr.split(".")[-1]))
        if block and node:
            return int(block) * 10**10 + int(node)
    return int(os.environ.get("SLURM_NODEID", "0")) + 1


def _ray_head(cfg: dict, driver: list[str], tag: str, temp: str, started: Callable[[], None] | None) -> int:
    ip = socket.gethostbyname((os.environ.get(HEAD_NODE_VAR) or node_address() or "127.0.0.1").split()[0])
    # Ray moves a loopback head to the machine's routable address unless told it is a one-machine cluster
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0" if ipaddress.ip_address(ip).is_loopback else "1"
    port = free_port(ip)
    head = _ray_start(cfg, ip, temp, "--head", f"--port={port}", f"--ray-client-server-port={free_port(ip)}",
                      "--include-dashboard=false")
    address = f"{joinable(ip)}:{port}"  # for this process, the driver and the workers
    import ray

    try:
        _connect(ray, address, head)
        with open(tag + ".tmp", "w") as f:
            f.write(address)
        os.replace(tag + ".tmp", tag + ".head")
        _wait_for_nodes(ray, int(os.environ["SLURM_NNODES"]), head)
        code = run_child(driver, env={**os.environ, "RAY_ADDRESS": address}, started=started)
        print(f"ray tasks per node: {tasks_per_node(ray)}")
        return code
    finally:
        with open(tag + ".done", "w") as f:
            f.write("done\n")
        ray.shutdown()
        _wait_for_workers_to_stop(tag, int(os.environ.get("SLURM_NNODES", "1")) - 1)
        stop_ray(head, temp)


def _wait_for_workers_to_stop(tag: str, workers: int) -> None:
    """The workers' Ray goes first: a worker node whose head (its GCS) is gone before it has drained logs
    RpcError tracebacks as it stops."""
    deadline = time.time() + STOP_WAIT_S
    while len(glob.glob(glob.escape(tag) + ".stopped-*")) < workers and time.time() < deadline:
        time.sleep(0.2)


def _ray_worker(cfg: dict, tag: str, temp: str) -> int:
    deadline = time.time() + WAIT_S
    while not os.path.exists(tag + ".head"):
        if os.path.exists(tag + ".done"):
            return 0  # the head stopped before its cluster was up: its exit code tells why
        if time.time() > deadline:
            print(f"{PREFLIGHT_MARK}: no Ray head address in {tag}.head after {WAIT_S}s")
            return PREFLIGHT_EXIT
        time.sleep(1)
    address = read(tag + ".head")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"  # Ray refuses to add a node without it
    worker = _ray_start(cfg, node_address(), temp, f"--address={address}")
    try:
        while not os.path.exists(tag + ".done"):
            if worker.poll() is not None:
                return worker.returncode or 1
            time.sleep(1)
        stop_ray(worker, temp)
        return 0
    finally:  # what the head waits for before it stops
        with open(f"{tag}.stopped-{os.environ.get('SLURM_NODEID', '0')}", "w") as f:
            f.write("stopped\n")


def stop_ray(node: subprocess.Popen, temp: str) -> None:
    """Stop this node's `ray start --block`, which stops every Ray process it started, once it has started
    them all (it writes `ray_current_cluster` last): a SIGTERM in the middle of its start can leave a process
    it is starting behind (a dashboard agent, a raylet), which outlives the head's GCS in the job's step.
    A node joined the cluster before the driver started, so what is left of its start takes seconds: it
    gets STOP_WAIT_S, what the head gives the workers to stop."""
    deadline = time.time() + STOP_WAIT_S
    while not os.path.exists(os.path.join(temp, "ray_current_cluster")) and node.poll() is None \
            and time.time() < deadline:
        time.sleep(0.2)
    node.terminate()
    node.wait(timeout=120)


def _connect(ray, address: str, head: subprocess.Popen) -> None:
    deadline = time.time() + WAIT_S
    while True:
        try:
            ray.init(address=address, logging_level=quiet.RAY_LEVEL)
            return
        except ConnectionError:
            if head.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{PREFLIGHT_MARK}: the Ray head at {address} did not start") from None
            time.sleep(1)


def _wait_for_nodes(ray, nodes: int, head: subprocess.Popen) -> None:
    deadline = time.time() + WAIT_S
    while len(alive := sorted((n["NodeManagerAddress"], n["Resources"].get("CPU", 0))
                              for n in ray.nodes() if n["Alive"])) < nodes:
        if head.poll() is not None or time.time() > deadline:
            raise SystemExit(f"{PREFLIGHT_MARK}: the Ray cluster has {len(alive)} of {nodes} nodes "
                             f"after {WAIT_S}s")
        time.sleep(1)
    print(f"ray cluster up: {len(alive)} nodes ({', '.join(f'{ip} with {cpus:g} CPU(s)' for ip, cpus in alive)})")


def tasks_per_node(ray) -> str:
    """The Ray tasks each node ran (from Ray's timeline), e.g. `127.0.0.1: 3 write_shard`."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in ray.timeline():
        if event["cat"].startswith("task::"):
            counts[event["pid"]][event["cat"][len("task::"):]] += 1
    return "; ".join(f"{node}: " + ", ".join(f"{n} {name}" for name, n in sorted(c.items()))
                     for node, c in sorted(counts.items())) or "none"


def node_address() -> str | None:
    """This Slurm node's address (its NodeAddr) as an IP, or None (Ray then picks one)."""
    name = os.environ.get("SLURMD_NODENAME")
    if not name:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True,
                             timeout=60, check=False).stdout
        addr = out.split("NodeAddr=", 1)[1].split()[0]
        return socket.gethostbyname(addr)
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def joinable(ip: str) -> str:
    """The head's address for Ray clients, which replace a literal loopback address by the machine's
    routable one: on a one-machine cluster, this machine's name where it resolves to `ip`."""
    if ipaddress.ip_address(ip).is_loopback:
        try:
            if socket.gethostbyname(socket.gethostname()) == ip:
                return socket.gethostname()
        except OSError:
            pass
    return ip
