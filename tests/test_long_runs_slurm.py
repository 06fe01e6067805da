"""One run across many allocations, on the local Slurm cluster with real data prep jobs: a failed attempt is
retried within run.max_retries and then the run stops with the reason; a job whose node goes DOWN is requeued by
Slurm and goes on; the time-limit signal makes the stage save and stop, the job requeues itself and finishes
byte-identical to an uninterrupted run; a finished run, requeued, runs nothing. One job id throughout."""

from __future__ import annotations

import filecmp
import gzip
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import wait_for

pytestmark = pytest.mark.slurm
FAULTS = """
[ci-faults]
extends = "ci-cpu"
partition = "faults"
"""
TASK = "data-prep-pretrain"


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A data prep config over a generated corpus of 120,000 documents (~80 MB of text): a few seconds of shards
    on one worker, so a test can act while they run."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    data = tmp_path / "corpus.jsonl.gz"
    with gzip.open(data, "wt", compresslevel=1) as f:
        for _ in range(120_000):
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=100))}) + "\n")
    config = tmp_path / "long.yaml"
    config.write_text(f"defaults: [tiny]\nnum_shards: 16\nworkers: 1\nprogress_interval: 1\ndatasets:\n"
                      f"  - {{name: long, path: {data}, text_field: text, weight: 1.0}}\n")
    return config


def submit(cli, config: Path, profile: str, *overrides: str) -> tuple[str, Path, str]:
    """(job id, job dir, Slurm id) of a detached data prep."""
    sub = cli("data", "prep", "pretrain", "-c", str(config), "--batch", profile, *overrides)
    assert sub.rc == 0, sub.err
    job_id = sub.out.split()[1]
    slurm_id = sub.out.split("(Slurm job ", 1)[1].split(")")[0]
    return job_id, Path(sub.out.split("job dir: ", 1)[1].split()[0]), slurm_id


def runtime_pid(job_dir: Path) -> int | None:
    """The data prep runtime of this job (its working directory is the job's code dir), not the supervisor."""
    code = str(job_dir / TASK / "code")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == code and \
                    b"recipes.data_prep_pretrain" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except OSError:
            continue
    return None


def ledger(job_dir: Path) -> list[dict]:
    path = job_dir / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def ended(cli, job_id: str, timeout: float = 240) -> str:
    """`nemotron jobs status` once the job ended (one of the terminal states)."""
    status = wait_for(lambda: (r := cli("jobs", "status", job_id, prog="nemotron")).rc == 0 and
                      any(f"state:     {s}" in r.out for s in ("COMPLETED", "FAILED", "CANCELLED")) and r.out,
                      timeout=timeout, interval=2)
    assert status, f"{job_id} did not end:\n{cli('jobs', 'status', job_id, prog='nemotron').out}"
    return status


def shards_done(job_dir: Path) -> int:
    return len(list((job_dir / "data").glob("*/shard_*.json")))  # their receipts


def test_a_failing_attempt_is_retried_then_the_run_stops_with_the_reason(slurm, cli, home, corpus):
    job_id, job_dir, slurm_id = submit(cli, corpus, "ci-cpu", "run.max_retries=1")
    for attempt in (1, 2):  # each attempt's runtime killed as the kernel's OOM killer would
        pid = wait_for(lambda: runtime_pid(job_dir), timeout=120, interval=0.05)
        assert pid, f"attempt {attempt} never started its runtime"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: runtime_pid(job_dir) != pid, timeout=30, interval=0.05)
    status = ended(cli, job_id)
    assert "state:     FAILED" in status, status
    assert "reason:    exit code 137 (SIGKILL: out of host memory, or killed); 2 failed attempts in a row" in status
    ends = [e for e in ledger(job_dir) if e["event"] == "end"]
    assert [(e["attempt"], e["outcome"], e["exit"]) for e in ends] == [(1, "failed", 137), (2, "failed", 137)]
    assert "retry 1 of run.max_retries=1" in ends[0]["why"]
    assert "2 failed attempts in a row, over run.max_retries=1" in ends[1]["why"]
    assert "SIGKILL" in ends[1]["why"]
    assert f"slurm id:  {slurm_id}" in status  # one job id, one Slurm id, two allocations
    assert "2 failed attempts in a row" in status
    assert not (job_dir / "finished.json").exists()


def test_a_job_whose_node_goes_down_is_requeued_and_goes_on(slurm, cli, home, corpus):
    Path("env.toml").write_text(Path("env.toml").read_text() + FAULTS)
    node = subprocess.run(["sinfo", "-h", "-p", "faults", "-o", "%N"], capture_output=True, text=True).stdout.strip()
    job_id, job_dir, slurm_id = submit(cli, corpus, "ci-faults")
    try:
        assert wait_for(lambda: shards_done(job_dir) >= 2, timeout=120, interval=0.05), "no shard done"
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=ultra3-test"], check=True)
        assert wait_for(lambda: "NODE_FAIL" in subprocess.run(
            ["sacct", "-n", "-X", "-D", "-j", slurm_id, "-o", "State"], capture_output=True, text=True).stdout,
            timeout=60), "the job was not ended by its node's failure"
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    status = ended(cli, job_id)
    assert "state:     COMPLETED (exit code 0)" in status, status
    entries = ledger(job_dir)
    ends = [e for e in entries if e["event"] == "end"]
    # the node's processes got SIGTERM (its slurmd lives on): the first node said so; a dead node says nothing, and
    # the next attempt closes its entry as lost
    assert [(e["attempt"], e["outcome"]) for e in ends] == [(1, "failed"), (2, "done")], entries
    assert "ended by Slurm (PENDING)" in ends[0]["why"]
    assert json.loads((job_dir / "finished.json").read_text())["attempt"] == 2
    logs = cli("jobs", "logs", job_id, prog="nemotron").out
    assert "reused 2" in logs or "reused" in logs  # the second attempt kept the first one's shards


def test_a_finished_run_requeued_runs_nothing(slurm, cli, home, corpus):
    job_id, job_dir, slurm_id = submit(cli, corpus, "ci-cpu")
    assert "state:     COMPLETED (exit code 0)" in ended(cli, job_id)
    before = {p: p.stat().st_mtime_ns for p in (job_dir / "data").rglob("*") if p.is_file()}
    subprocess.run(["scontrol", "requeue", slurm_id], check=True)
    again = wait_for(lambda: len(subprocess.run(["sacct", "-n", "-X", "-D", "-j", slurm_id, "-o", "State"],
                                                capture_output=True, text=True).stdout.split()) >= 2 and
                     "COMPLETED" in ended(cli, job_id), timeout=120, interval=2)
    assert again
    logs = cli("jobs", "logs", job_id, prog="nemotron").out
    assert "this run finished" in logs and "nothing to run" in logs
    assert {p: p.stat().st_mtime_ns for p in (job_dir / "data").rglob("*") if p.is_file()} == before
    assert [e["attempt"] for e in ledger(job_dir) if e["event"] == "start"] == [1]


def test_the_time_limit_signal_continues_the_run_byte_identical(slurm, cli, home, corpus, tmp_path):
    started = time.time()
    job_id, job_dir, slurm_id = submit(cli, corpus, "ci-cpu")
    script = next(job_dir.glob("*_sbatch.sh")).read_text()
    assert "\n#SBATCH --signal=USR1@60\n" in script  # the stage's stop time (cost_data_prep.STOP_S)
    assert wait_for(lambda: shards_done(job_dir) >= 3, timeout=120, interval=0.05), "no shard done"
    signalled = time.time()
    # what Slurm does at run.grace_s before the time limit (--signal=USR1@N): the signal to every job step
    subprocess.run(["scancel", "--signal=USR1", slurm_id], check=True)
    again = wait_for(lambda: [e for e in ledger(job_dir) if e["event"] == "start" and e["attempt"] == 2],
                     timeout=120, interval=0.2)
    assert again, ledger(job_dir)
    resumed = again[0]["at"]
    status = ended(cli, job_id)
    assert "state:     COMPLETED (exit code 0)" in status, status
    ends = [(e["attempt"], e["outcome"]) for e in ledger(job_dir) if e["event"] == "end"]
    assert ends == [(1, "continue"), (2, "done")]
    logs = cli("jobs", "logs", job_id, prog="nemotron").out
    assert "ultra3: SIGUSR1 from Slurm: the time limit is near; the stage saves and stops" in logs
    assert "stopped for the time limit: " in logs and "requeueing Slurm job" in logs
    assert "attempts:  2" in status and "progress:  shards 16 of 16" in status, status  # from a new shell
    assert "continue  stopped for the time limit with its work saved" in status
    shown = cli("jobs", "goodput", job_id, prog="nemotron")
    assert shown.rc == 0 and shown.out.startswith(f"{job_id}: 2 attempt(s), goodput "), shown.out + shown.err
    assert "attempt   1  continue  productive" in shown.out and "node-h" in shown.out
    continued = time.time() - started

    whole_id, whole_dir, _ = submit(cli, corpus, "ci-cpu")
    assert "state:     COMPLETED (exit code 0)" in ended(cli, whole_id)
    uninterrupted = time.time() - continued - started
    # every file byte for byte (the blend names its shards by their paths, under each job's own dir)
    files = sorted(p.relative_to(whole_dir / "data") for p in (whole_dir / "data").rglob("*") if p.is_file()
                   and p.name not in ("manifest.json", "blend.json"))
    assert files and sorted(p.relative_to(job_dir / "data") for p in (job_dir / "data").rglob("*")
                            if p.is_file() and p.name not in ("manifest.json", "blend.json")) == files
    _, mismatch, errors = filecmp.cmpfiles(whole_dir / "data", job_dir / "data", [str(f) for f in files],
                                           shallow=False)
    assert not mismatch and not errors, mismatch + errors
    blend = (job_dir / "data" / "blend.json").read_text()
    assert blend.replace(str(job_dir), str(whole_dir)) == (whole_dir / "data" / "blend.json").read_text()
    print(f"\ncontinued: 2 allocations, {continued:.1f} s; uninterrupted: 1 allocation, {uninterrupted:.1f} s; "
          f"signal to the next attempt's start: {resumed - signalled:.1f} s")
