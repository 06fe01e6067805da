"""`ultra3 pipe` on the real local Slurm cluster: every step submitted at once with real afterok edges,
run in order, each consuming its upstream's output (read back from the artifact manifests); a failed
step leaves the rest CANCELLED with the reason; a completed pipe re-runs as skips; a single stage finds
its input in the store with its provenance."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import our_jobs, squeue_ids, wait_for
from test_slurm_jobs import jobs, sacct_states, wait_state

pytestmark = pytest.mark.slurm

SUBMITTED = re.compile(r"^(\S+): submitted (\S+) \(Slurm job (\d+)(?:, after ([\d, ]+))?\)$", re.M)
CPU_CHAIN = {"stages": {
    "data-pretrain": {"stage": "data prep pretrain", "config": "tiny"},
    "data-sft": {"stage": "data prep sft", "config": "tiny"},
    "quantize": {"stage": "quantize", "config": "tiny"},
}}


@pytest.fixture(autouse=True)
def _cancel_leftovers(tmp_path):
    yield
    left = sorted(our_jobs(tmp_path))
    if left:
        subprocess.run(["scancel", *left], capture_output=True)


def submitted(out: str) -> dict[str, tuple[str, str, str | None]]:
    """step -> (job id, Slurm id, the Slurm ids it waits for)."""
    return {m[0]: (m[1], m[2], m[3]) for m in SUBMITTED.findall(out)}


def dependency(slurm_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", slurm_id], capture_output=True, text=True).stdout
    return re.search(r"Dependency=(\S+)", out).group(1)


def store_manifests(root: Path) -> dict[str, dict]:
    """Every manifest in the artifact store, by producing job id and type."""
    return {(m["producer"], m["type"]): m
            for m in (json.loads(p.read_text()) for p in root.glob("*/v*/manifest.json"))}


def test_cpu_chain_runs_in_order_and_each_step_consumes_its_upstream(slurm, cli, home, tmp_path):
    pipe = tmp_path / "cpu.yaml"
    pipe.write_text(yaml.safe_dump(CPU_CHAIN, sort_keys=False))
    r = cli("pipe", "-c", str(pipe), "--batch", "ci")
    assert r.rc == 0, r.out + r.err
    steps = submitted(r.out)
    assert list(steps) == ["data-pretrain", "data-sft", "quantize"], r.out
    (first, s1, _), (second, s2, after2), (third, s3, after3) = steps.values()
    assert (after2, after3) == (s1, s2)
    # Slurm itself holds the order: the edges as the controller has them, while the chain is queued
    assert dependency(s3).startswith(f"afterok:{s2}"), dependency(s3)
    assert "nemotron jobs status pipe-cpu_" in r.out

    for job in (first, second, third):
        wait_state(cli, job, "COMPLETED", "FAILED", "CANCELLED", timeout=600)
    assert sacct_states([s1, s2, s3]) == {s1: "COMPLETED", s2: "COMPLETED", s3: "COMPLETED"}
    times = subprocess.run(["sacct", "-X", "-n", "-P", "-j", f"{s1},{s2},{s3}", "-o", "JobID,Start,End"],
                           capture_output=True, text=True).stdout.split()
    spans = {row.split("|")[0]: row.split("|")[1:] for row in times}
    assert spans[s1][1] <= spans[s2][0] and spans[s2][1] <= spans[s3][0], spans  # one after another

    job_dir = Path(re.search(r"^job dir:\s+(\S+)$", jobs(cli, "status", third).out, re.M).group(1))
    cfg = yaml.safe_load((job_dir / "quantize" / "code" / "config.yaml").read_text())
    manifests = store_manifests(Path(cfg["job"]["artifacts_root"]))
    sft_data = manifests[(second, "sft-data")]
    quantized = manifests[(third, "quantized-checkpoint")]
    assert (first, "pretrain-data") in manifests
    assert quantized["inputs"] == [{"name": "calibration", "key": "calibration.path", "path": sft_data["path"],
                                    "producer": second, "artifact": f"{sft_data['name']}:v{sft_data['version']}"}]
    assert Path(quantized["path"], "config.json").is_file()

    # the same pipe again: every step done with this config -> skipped, nothing submitted
    start = time.monotonic()
    again = cli("pipe", "-c", str(pipe), "--batch", "ci")
    seconds = time.monotonic() - start
    assert again.rc == 0, again.err
    assert again.out.count(": skipped, done by ") == 3 and "every step already completed" in again.out, again.out
    assert our_jobs(tmp_path) == set()
    print(f"re-run of a completed 3-step pipe: {seconds:.2f} s")

    # a single stage, nothing set: the newest pretrain-data of this profile, with where it came from
    dry = cli("pretrain", "-c", "tiny", "--batch", "ci", "dataset.mock=false", "--dry-run")
    assert dry.rc == 0, dry.err
    blend = manifests[(first, "pretrain-data")]
    assert re.search(rf"^dataset.blend_path = {re.escape(blend['path'])}  \(from {first} completed "
                     rf"\d{{4}}-\d\d-\d\d \d\d:\d\d, {blend['name']}:v{blend['version']}\)$", dry.out, re.M), dry.out
    by_job = cli("pretrain", "-c", "tiny", "--batch", "ci", "dataset.mock=false", f"dataset.blend_path=job:{first}",
                 "--dry-run")
    assert by_job.rc == 0 and f"dataset.blend_path = {blend['path']}" in by_job.out, by_job.err

    lineage = jobs(cli, "lineage", third)
    assert lineage.rc == 0, lineage.err
    assert f"consumed calibration.path = {sft_data['path']} <- {second}" in lineage.out
    assert f"produced {quantized['name']}:v{quantized['version']}" in lineage.out


def test_a_failed_step_cancels_the_rest_with_the_reason(slurm, cli, home):
    r = cli("pipe", "-c", "tiny", "--run", "ci")
    assert r.rc not in (0, 2), r.out + r.err  # the job's own failure, not bad input
    steps = submitted(r.out)
    assert list(steps) == ["data-pretrain", "pretrain", "data-sft", "sft", "quantize"], r.out
    assert re.search(r"pipe step pretrain \(\S+\) FAILED: PREFLIGHT FAILED on \S+: .*no NVIDIA GPU visible", r.err), \
        r.err
    states = sacct_states([s for _, s, _ in steps.values()])
    ids = [s for _, s, _ in steps.values()]
    assert [states[i] for i in ids] == ["COMPLETED", "FAILED", "CANCELLED", "CANCELLED", "CANCELLED"], states
    # sft waits for pretrain (its checkpoint) and data-sft (the step before): the failed one is the reason
    upstream = {"data-sft": ("pretrain", "FAILED"), "sft": ("pretrain", "FAILED"),
                "quantize": ("data-sft", "CANCELLED")}
    for step, (before, state) in upstream.items():
        st = wait_state(cli, steps[step][0], "CANCELLED", timeout=30)
        assert st["upstream"] == f"upstream {steps[before][0]} {state}", st
        assert f"CANCELLED (upstream {steps[before][0]} {state})" in r.err  # what the pipe said when it stopped
    assert not (squeue_ids() & set(ids))  # nothing left PENDING


def test_cancel_a_pipe_by_its_id_cancels_every_step(slurm, cli, home, tmp_path):
    from test_slurm_jobs import add_profile

    add_profile("slow", setup=["sleep 120"])
    pipe = tmp_path / "cpu.yaml"
    pipe.write_text(yaml.safe_dump(CPU_CHAIN, sort_keys=False))
    r = cli("pipe", "-c", str(pipe), "--batch", "slow")
    assert r.rc == 0, r.out + r.err
    pipe_id = re.search(r"nemotron jobs status (pipe-cpu_\S+)", r.out).group(1)
    steps = submitted(r.out)
    status = jobs(cli, "status", pipe_id)
    assert status.rc == 0 and all(job in status.out for job, _, _ in steps.values()), status.out
    cancelled = jobs(cli, "cancel", pipe_id)
    assert cancelled.rc == 0, cancelled.err
    assert [line.split(": ")[0] for line in cancelled.out.splitlines()] == list(steps), cancelled.out
    ids = [s for _, s, _ in steps.values()]
    for job, _, _ in steps.values():
        wait_state(cli, job, "CANCELLED", timeout=60)
    assert set(sacct_states(ids).values()) == {"CANCELLED"}
    assert wait_for(lambda: not (squeue_ids() & set(ids)), timeout=60)  # gone from the queue once cleaned up


def test_a_test_counts_and_cancels_only_its_own_jobs(slurm, tmp_path):
    """Someone else's job queued meanwhile (its work dir and output elsewhere) is not this test's to touch."""
    def sbatch(where: Path) -> str:
        where.mkdir(parents=True, exist_ok=True)
        return subprocess.run(["sbatch", "--parsable", "--chdir", str(where), "-o", f"{where}/out", "--time=1",
                               "--wrap", "sleep 60"], capture_output=True, text=True, check=True).stdout.strip()

    foreign = tempfile.mkdtemp(prefix="someone-else-")
    theirs, ours = sbatch(Path(foreign)), sbatch(tmp_path / "work")
    try:
        assert wait_for(lambda: {theirs, ours} <= squeue_ids(), timeout=30)
        assert our_jobs(tmp_path) == {ours}
    finally:
        subprocess.run(["scancel", theirs, ours], capture_output=True)  # both submitted by this test
        shutil.rmtree(foreign, ignore_errors=True)
