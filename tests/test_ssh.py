"""Submission through SSH (NeMo-Run's SSHTunnel: rsync + sbatch on the login node) to the local
cluster, with a real sshd on 127.0.0.1:2222, and lifecycle commands that reach the cluster over ssh."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_for

pytestmark = pytest.mark.slurm
PORT = 2222


@pytest.fixture(scope="module")
def sshd(tmp_path_factory, slurm):
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs root and openssh-server for the SSH tests (scripts/test.sh installs it)")
        pytest.skip("needs root and /usr/sbin/sshd")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    shutil.copy(d / "client.pub", d / "authorized_keys")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-p", str(PORT), "-o", "ListenAddress=127.0.0.1",
                             "-h", str(d / "host"), "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}",
                             "-o", f"PidFile={d / 'sshd.pid'}", "-o", "StrictModes=no", "-o", "UsePAM=no",
                             "-o", "PermitRootLogin=prohibit-password"], stderr=subprocess.DEVNULL)
    known = Path.home() / ".ssh" / "known_hosts"
    known.parent.mkdir(mode=0o700, exist_ok=True)
    before = known.read_text() if known.exists() else None
    scan = wait_for(lambda: subprocess.run(["ssh-keyscan", "-p", str(PORT), "127.0.0.1"], capture_output=True,
                                           text=True).stdout, timeout=20)
    assert scan, "sshd did not come up"
    known.write_text((before or "") + scan)  # rsync's ssh checks host keys strictly
    yield d
    proc.terminate()
    proc.wait(timeout=10)
    if before is None:
        known.unlink()
    else:
        known.write_text(before)


def test_batch_through_ssh_then_status_and_logs_over_ssh(cli, home, sshd, tmp_path):
    remote = tmp_path / "cluster-jobs"
    with open("env.toml", "a") as f:
        f.write(f"""
[ssh]
extends = "ci"
host = "127.0.0.1"
port = {PORT}
user = "root"
identity = "{sshd / 'client'}"
job_dir = "{remote}"
setup = ["export PATH={Path(sys.executable).parent}:$PATH"]
""")
    t0 = time.time()
    sub = cli("pretrain", "-c", "tiny", "--batch", "ssh")
    assert sub.rc == 0, sub.err
    job_id = sub.out.split()[1]
    assert f"job dir: {remote}/ultra3-pretrain/{job_id}" in sub.out
    # the job dir was shipped to the "cluster" side with rsync, config and recipes included
    code = remote / "ultra3-pretrain" / job_id / "pretrain" / "code"
    assert (code / "config.yaml").is_file() and (code / "recipes" / "preflight.py").is_file()
    status = wait_for(lambda: (r := cli("jobs", "status", job_id, prog="nemotron")).rc == 0 and "FAILED" in r.out and r,
                      timeout=90)
    assert status, f"job never reached FAILED ({time.time() - t0:.0f}s)"
    assert "PREFLIGHT FAILED" in status.out and "on 127.0.0.1" in status.out
    logs = cli("jobs", "logs", job_id, prog="nemotron")
    assert logs.rc == 0 and "PREFLIGHT FAILED" in logs.out


def test_logs_over_ssh_are_read_from_a_byte_offset(home, sshd, tmp_path):
    """`tail -c +N` on the cluster side: only the new bytes come back, across the files of a requeued job,
    with the remote path quoted (a space and a quote in it)."""
    from ultra3.executors import executor
    from ultra3.records import JobRecord

    job_dir = tmp_path / "it's a job dir"
    task = job_dir / "pretrain"
    task.mkdir(parents=True)
    first = task / "log-ultra3.pretrain_7_0.out"
    first.write_text("one\n")
    record = JobRecord(id="j", stage="pretrain", config="tiny", executor="slurm", mode="detached", submitted=0,
                       job_dir=str(job_dir), task="pretrain", log_glob="pretrain/log-ultra3.pretrain_7_*.out",
                       handle={"slurm_id": "7", "ssh": {"host": "127.0.0.1", "port": PORT, "user": "root",
                                                        "identity": str(sshd / "client")}})
    slurm = executor("slurm")

    text, offset = slurm.read_log(record, 0)
    assert (text, offset) == ("one\n", 4)
    assert slurm.read_log(record, offset) == ("", 4)
    with open(first, "a") as f:
        f.write("two\n")
    (task / "log-ultra3.pretrain_7_1.out").write_text("requeued\n")
    assert slurm.read_log(record, offset) == ("two\nrequeued\n", 17)
