"""`ultra3 pipe` on the real local Slurm cluster: every step submitted at once with real afterok edges only where
a step reads another's output or names it in after:, so independent steps run side by side, each consuming its
upstream's output (read back from the artifact manifests); a failed step leaves only what waits for it CANCELLED
with the reason; a completed pipe re-runs as skips, except a step whose outputs were removed; a single stage finds
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
CPU_GRAPH = {"stages": {  # two steps that read nothing; quantize reads data-sft's output and waits for both
    "data-pretrain": {"stage": "data prep pretrain", "config": "tiny"},
    "data-sft": {"stage": "data prep sft", "config": "tiny"},
    "quantize": {"stage": "quantize", "config": "tiny", "after": ["data-pretrain"]},
}}


@pytest.fixture(autouse=True)
def _cancel_leftovers(tmp_path):
    yield
    left = sorted(our_jobs(tmp_path))
    if left:
        subprocess.run(["scancel", *left], capture_output=True)


def submitted(out: str) -> dict[str, tuple[str, str, str | None]]:
    """step -> (job id, Slurm id, the Slurm ids it waits for, "" for none)."""
    return {m[0]: (m[1], m[2], m[3]) for m in SUBMITTED.findall(out)}


def dependency(slurm_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", slurm_id], capture_output=True, text=True).stdout
    return re.search(r"Dependency=(\S+)", out).group(1)


def store_manifests(root: Path) -> dict[str, dict]:
    """Every manifest in the artifact store, by producing job id and type."""
    return {(m["producer"], m["type"]): m
            for m in (json.loads(p.read_text()) for p in root.glob("*/v*/manifest.json"))}


def spans(slurm_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Slurm id -> (Start, End) as sacct has them (ISO times: they sort as strings)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(slurm_ids), "-o", "JobID,Start,End"],
                         capture_output=True, text=True).stdout
    return {row.split("|")[0]: tuple(row.split("|")[1:3]) for row in out.split()}


def test_independent_steps_run_side_by_side_and_a_dependent_one_after_both(slurm, cli, home, tmp_path):
    """data-pretrain and data-sft read nothing: both start at once on the two nodes of `multi` (a setup sleep holds
    each long enough to overlap); quantize reads data-sft's output and names data-pretrain in after:, so it starts
    when both ended."""
    from test_slurm_jobs import add_profile

    add_profile("side", partition="multi", setup=["sleep 8"])
    pipe = tmp_path / "cpu.yaml"
    pipe.write_text(yaml.safe_dump(CPU_GRAPH, sort_keys=False))
    r = cli("pipe", "-c", str(pipe), "--batch", "side")
    assert r.rc == 0, r.out + r.err
    steps = submitted(r.out)
    assert list(steps) == ["data-pretrain", "data-sft", "quantize"], r.out
    (first, s1, after1), (second, s2, after2), (third, s3, after3) = steps.values()
    assert (after1, after2) == ("", "") and sorted(after3.split(", ")) == sorted([s1, s2]), r.out
    # the edges as the controller has them, while quantize is queued: afterok on both, on nothing else
    assert sorted(re.findall(r"afterok:(\d+)", dependency(s3))) == sorted([s1, s2]), dependency(s3)
    assert dependency(s1) == dependency(s2) == "(null)"
    pipe_id = re.search(r"nemotron jobs status (pipe-cpu_\S+)", r.out).group(1)

    for job in (first, second, third):
        wait_state(cli, job, "COMPLETED", "FAILED", "CANCELLED", timeout=600)
    done = {s1: "COMPLETED", s2: "COMPLETED", s3: "COMPLETED"}  # Slurm's accounting may lag the scripts' ends
    assert wait_for(lambda: sacct_states([s1, s2, s3]) == done), sacct_states([s1, s2, s3])
    times = spans([s1, s2, s3])
    assert times[s1][0] < times[s2][1] and times[s2][0] < times[s1][1], times  # side by side
    assert times[s3][0] >= max(times[s1][1], times[s2][1]), times  # after both

    status = jobs(cli, "status", pipe_id)
    assert status.rc == 0, status.err
    assert re.search(rf"^  quantize +{third} +after data-pretrain, data-sft  COMPLETED$", status.out, re.M), status.out
    assert re.search(rf"^  data-sft +{second} +- +COMPLETED$", status.out, re.M), status.out
    record = home / "pipes" / f"{pipe_id}.json"  # a record written before pipes were graphs: no `after`
    old = json.loads(record.read_text())
    old["steps"] = [{k: v for k, v in step.items() if k != "after"} for step in old["steps"]]
    record.write_text(json.dumps(old))
    status = jobs(cli, "status", pipe_id)
    assert status.rc == 0 and re.search(rf"^  quantize +{third} +COMPLETED$", status.out, re.M), status.out

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
    again = cli("pipe", "-c", str(pipe), "--batch", "side")
    seconds = time.monotonic() - start
    assert again.rc == 0, again.err
    assert again.out.count(": skipped, done by ") == 3 and "every step already completed" in again.out, again.out
    assert our_jobs(tmp_path) == set()
    print(f"re-run of a completed 3-step pipe: {seconds:.2f} s")

    # a single stage, nothing set: the newest pretrain-data of this profile, with where it came from
    dry = cli("pretrain", "-c", "tiny", "--batch", "side", "dataset.mock=false", "--dry-run")
    assert dry.rc == 0, dry.err
    blend = manifests[(first, "pretrain-data")]
    assert re.search(rf"^dataset.blend_path = {re.escape(blend['path'])}  \(from {first} completed "
                     rf"\d{{4}}-\d\d-\d\d \d\d:\d\d, {blend['name']}:v{blend['version']}\)$", dry.out, re.M), dry.out

    lineage = jobs(cli, "lineage", third)
    assert lineage.rc == 0, lineage.err
    assert f"consumed calibration.path = {sft_data['path']} <- {second}" in lineage.out
    assert f"produced {quantized['name']}:v{quantized['version']}" in lineage.out


def test_a_step_whose_outputs_were_removed_runs_again(slurm, cli, home, tmp_path):
    """data-sft completed, then its packed data was deleted: the next run does not take it as done (the dry run says
    why) and runs it again; quantize, whose own output is still there, stays done."""
    pipe = tmp_path / "two.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {"data-sft": CPU_GRAPH["stages"]["data-sft"],
                                               "quantize": {"stage": "quantize", "config": "tiny"}}}, sort_keys=False))
    r = cli("pipe", "-c", str(pipe), "--run", "ci")
    assert r.rc == 0, r.out[-3000:] + r.err
    sft_id = submitted(r.out)["data-sft"][0]
    store = home / "nemorun" / "artifacts"
    made = store_manifests(store)[(sft_id, "sft-data")]
    shutil.rmtree(made["path"])

    dry = cli("pipe", "-c", str(pipe), "--run", "ci", "--dry-run")
    assert dry.rc == 0, dry.err
    gone = f"its output {made['path']} recorded by {sft_id} is gone"
    assert re.search(rf"^  1\. data-sft +ultra3 data prep sft -c tiny  \[runs again: {re.escape(gone)}; run as \S+\]$",
                     dry.out, re.M), dry.out
    assert re.search(r"^  2\. quantize +ultra3 quantize -c tiny  \[skip: done by ", dry.out, re.M), dry.out

    again = cli("pipe", "-c", str(pipe), "--run", "ci")
    assert again.rc == 0, again.out[-3000:] + again.err
    assert f"data-sft: runs again: {gone}" in again.out
    assert list(submitted(again.out)) == ["data-sft"] and "quantize: skipped, done by " in again.out, again.out
    new_id, slurm_id, _ = submitted(again.out)["data-sft"]
    # the attached run returns at the script's end line, seconds before Slurm's accounting says COMPLETED
    assert wait_for(lambda: sacct_states([slurm_id]) == {slurm_id: "COMPLETED"}), sacct_states([slurm_id])
    assert Path(store_manifests(store)[(new_id, "sft-data")]["path"], "metadata.json").is_file()  # made again


def test_a_failed_branch_cancels_only_what_waits_for_it(slurm, cli, home, tmp_path):
    """data-pretrain's tokenizer is not there at run time (the dry run only warns: the cluster may mount it), so it
    fails; quantize, after it, is cancelled by Slurm; data-sft, independent, completes; the attached pipe follows
    both branches, says which step was cancelled because of which, and exits non-zero naming how to resume."""
    stages = {**CPU_GRAPH["stages"], "data-pretrain": {**CPU_GRAPH["stages"]["data-pretrain"],
                                                        "overrides": {"tokenizer": "/nonexistent/tokenizer.json"}}}
    pipe = tmp_path / "branch.yaml"
    pipe.write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    dry = cli("pipe", "-c", str(pipe), "--run", "ci", "--dry-run")
    assert dry.rc == 0 and "tokenizer: /nonexistent/tokenizer.json does not exist" in dry.out, dry.out + dry.err
    r = cli("pipe", "-c", str(pipe), "--run", "ci")
    assert r.rc not in (0, 2), r.out + r.err  # the job's own failure, not bad input
    steps = submitted(r.out)
    ids = [s for _, s, _ in steps.values()]
    expected = dict(zip(ids, ["FAILED", "COMPLETED", "CANCELLED"]))  # Slurm's accounting may lag the script's end
    assert wait_for(lambda: sacct_states(ids) == expected), (sacct_states(ids), r.out + r.err)
    bad = steps["data-pretrain"][0]
    assert f"== data-sft: {steps['data-sft'][0]} ==" in r.out  # followed after the failure
    assert f"quantize: CANCELLED (upstream {bad} FAILED): it waits for data-pretrain, which failed" in r.err_lines, \
        r.err
    last = r.err_lines[-1]
    assert re.fullmatch(rf"error: pipe step data-pretrain \({bad}\) FAILED: .*; cancelled because of it: quantize\. "
                        rf"Fix it, then `ultra3 pipe -c {pipe} --run ci` again resumes \(completed steps are skipped\),"
                        r" --from data-pretrain starts at it, --force re-runs every step; `nemotron jobs status "
                        r"pipe-branch_\S+` shows every step", last), last
    assert re.search(r"^pipe: pipe-branch_\S+$", r.out, re.M), r.out
    st = wait_state(cli, steps["quantize"][0], "CANCELLED", timeout=30)
    assert st["upstream"] == f"upstream {bad} FAILED", st
    assert not (squeue_ids() & set(ids))  # nothing left PENDING


def test_cancel_a_pipe_by_its_id_cancels_every_step(slurm, cli, home, tmp_path):
    from test_slurm_jobs import add_profile

    add_profile("slow", setup=["sleep 120"])
    pipe = tmp_path / "cpu.yaml"
    pipe.write_text(yaml.safe_dump(CPU_GRAPH, sort_keys=False))
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
