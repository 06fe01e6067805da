"""`executor = "ray"` profiles: data prep submitted to an existing Ray cluster through the Jobs API,
followed with `nemotron jobs`. A real Ray head on 127.0.0.1 (its own ports), started here."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import free_ports, wait_for

pytestmark = pytest.mark.heavy  # Ray, torch, NeMo-Run or real jobs: not in the fast tier

@pytest.fixture(scope="module")
def ray_head():
    with ray_cluster() as address:
        yield address


@contextlib.contextmanager
def ray_cluster():
    """A Ray head of its own on 127.0.0.1, stopped (every process it started) when the block ends."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's unix socket paths must fit 107 bytes
    # token authentication (Ray's default) with a token of its own, so no other Ray on this machine
    # (whose ray.init writes ~/.ray/auth_token) can change it; the CLI finds it through the environment
    token = Path(tmp, "auth_token")
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # job drivers use this Python
    # ports of its own, so another Ray on this machine (an embedded one of a data-prep run) can't collide
    dashboard, gcs, agent, grpc, runtime_env, metrics = free_ports(6)
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus=2",
                             "--node-ip-address=127.0.0.1", f"--port={gcs}", "--dashboard-host=127.0.0.1",
                             f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={agent}",
                             f"--dashboard-agent-grpc-port={grpc}", f"--runtime-env-agent-port={runtime_env}",
                             f"--metrics-export-port={metrics}", f"--temp-dir={tmp}",
                             "--object-store-memory=200000000", "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def up() -> bool:  # the dashboard answers (401 without Ray's auth token: it is up)
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{dashboard}/api/version", timeout=1).status == 200
        except urllib.error.HTTPError as e:
            return e.code == 401
        except OSError:
            return False

    def agent_ready() -> bool:  # the job agent starts after the dashboard; a no-op job proves it
        # in a fresh interpreter, as the CLI runs: Ray caches its auth token per process
        probe = ("from ultra3.executors.ray import client; "
                 f"client('http://127.0.0.1:{dashboard}').submit_job(entrypoint='true')")
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0

    try:
        assert wait_for(up, timeout=180), "the Ray head did not come up"
        assert wait_for(agent_ready, timeout=240, interval=3), \
            f"the Ray head's job agent did not come up:\n{_agent_log(tmp)}"
        yield f"http://127.0.0.1:{dashboard}"
    finally:  # --block: SIGTERM drains and stops every process the head started
        head.send_signal(signal.SIGTERM)
        head.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _agent_log(tmp: str) -> str:
    logs = sorted(Path(tmp).glob("session_*/logs/dashboard_agent.log"))
    return "\n".join(logs[-1].read_text().splitlines()[-15:]) if logs else "(no agent log)"


def test_data_prep_on_an_existing_ray_cluster(cli, home, ray_head):
    with open("env.toml", "a") as f:
        f.write(f'\n[ray]\nexecutor = "ray"\naddress = "{ray_head}"\n')
    sub = cli("data", "prep", "pretrain", "-c", "tiny", "--batch", "ray")
    assert sub.rc == 0, sub.err
    assert "Ray job on" in sub.out
    job_id = sub.out.split()[1]
    status = wait_for(lambda: (r := cli("jobs", "status", job_id, prog="nemotron")).rc == 0 and
                      ("COMPLETED" in r.out or "FAILED" in r.out) and r, timeout=240, interval=2)
    assert status and "COMPLETED" in status.out, (status.out if status else "no end state",
                                                   cli("jobs", "logs", job_id, prog="nemotron").out[-3000:])
    assert "[ray]" in status.out
    logs = cli("jobs", "logs", job_id, prog="nemotron")
    assert "preflight ok" in logs.out
    out = next(Path(home).glob(f"nemorun/experiments/ultra3-data-prep-pretrain/{job_id}/data"))
    assert (out / "blend.json").is_file() and list(out.rglob("*.idx")), sorted(p.name for p in out.rglob("*"))


def test_the_ray_executor_refuses_a_training_stage(cli, home):
    with open("env.toml", "a") as f:
        f.write('\n[ray]\nexecutor = "ray"\naddress = "http://127.0.0.1:1"\n')
    r = cli("pretrain", "-c", "tiny", "--batch", "ray")
    assert r.rc == 2 and r.err_lines == ["error: job.executor: the ray executor runs Ray stages (data prep); submit "
                                         "`pretrain` with a slurm profile or on this machine"]


def test_a_ray_job_s_final_state_outlives_its_cluster(cli, home):
    """One job's end is seen (`jobs status` while the cluster is up) and kept; another's never is, and the job wrote
    it in its job dir (its attempts ledger). Once the cluster is gone, a later shell still reads both."""
    with ray_cluster() as address:
        with open("env.toml", "a") as f:
            f.write(f'\n[ray]\nexecutor = "ray"\naddress = "{address}"\n')
        seen = cli("data", "prep", "pretrain", "-c", "tiny", "--batch", "ray")
        unseen = cli("data", "prep", "pretrain", "-c", "tiny", "--batch", "ray",
                     "datasets=[{name: gone, path: /nonexistent/x.jsonl, weight: 1}]")  # stops in its preflight
        assert seen.rc == 0 and unseen.rc == 0, seen.err + unseen.err
        seen_id, unseen_id = seen.out.split()[1], unseen.out.split()[1]
        done = wait_for(lambda: "COMPLETED" in cli("jobs", "status", seen_id, prog="nemotron").out, timeout=240,
                        interval=2)
        assert done, cli("jobs", "logs", seen_id, prog="nemotron").out[-3000:]
        ledger = next(Path(home).glob(f"nemorun/experiments/ultra3-data-prep-pretrain/{unseen_id}")) / "attempts.jsonl"
        assert wait_for(lambda: ledger.is_file() and '"event": "end"' in ledger.read_text(), timeout=240, interval=1)
    gone = cli("jobs", "status", seen_id, prog="nemotron")
    assert gone.rc == 0 and "COMPLETED" in gone.out and "UNKNOWN" not in gone.out, gone.out + gone.err
    failed = cli("jobs", "status", unseen_id, prog="nemotron")
    assert failed.rc == 0 and "FAILED (exit code 3)" in failed.out, failed.out + failed.err
    listed = cli("jobs", "list", prog="nemotron").out
    assert "UNKNOWN" not in listed, listed
    kept = json.loads(next(Path(home).glob(f"nemorun/experiments/*/{seen_id}/*/final_state.json")).read_text())
    assert kept == {"state": "COMPLETED", "exit_code": 0, "reason": ""}
