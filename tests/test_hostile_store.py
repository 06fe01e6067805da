"""Hostile files where the launcher keeps its state, read by the real readers: a local job record whose pid now
belongs to another process (or names pid 1) is neither RUNNING nor signalled; a FIFO, a link to /dev/zero or an
oversized file in the artifact store, the registry or a job dir is never read; a damaged job record or manifest
is named in one warning line on stderr and skipped, never fatal to the others."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import BIN, Result, wait_for
from test_executors import pretrain_job
from test_training_inputs import completed_pretrain_job
from ultra3 import jobs, records
from ultra3.executors import executor
from ultra3.jobprep.jobdir import new_job_id
from ultra3.paths import nemorun_home

OLDER, NEWER = "ultra3-pretrain_20260101-000000-aaaaaa", "ultra3-pretrain_20260103-000000-cccccc"
CKPT = "ultra3-pretrain-checkpoint-tiny"
MIB = 1 << 20


@pytest.fixture
def signals(monkeypatch):
    """os.kill and os.killpg reach only the processes this test started (`mine`): any other target is refused,
    recorded and fails the test, so code that would signal pid 1's group cannot."""
    guard = SimpleNamespace(mine=set(), refused=[])

    def guarded(real):
        def send(pid, sig):
            if pid not in guard.mine:
                guard.refused.append((real.__name__, pid, sig))
                raise AssertionError(f"{real.__name__}({pid}, {sig}): not a process this test started")
            real(pid, sig)
        return send

    monkeypatch.setattr(os, "kill", guarded(os.kill))
    monkeypatch.setattr(os, "killpg", guarded(os.killpg))
    return guard


@pytest.fixture
def decoy(signals):
    """An unrelated process in its own session, as a later process given a dead job's pid is."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    signals.mine.add(proc.pid)
    yield proc
    proc.kill()
    proc.wait()


def bounded(argv: list[str], timeout: float = 20) -> Result:
    """A command that must neither hang nor take the machine's memory (the old readers did both with a FIFO and a
    link to /dev/zero): 2 GiB of address space and `timeout` seconds at most."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, preexec_fn=limit)
    return Result(p.returncode, p.stdout, p.stderr)


def nemotron(*args: str) -> Result:
    return bounded([str(BIN / "nemotron"), "jobs", *args])


def local_record(home: Path, job_id: str, pid: int | None, started: str | None = None) -> records.JobRecord:
    """The registry record of a local job, its task dir made (empty); without `started`, as an older launcher
    wrote it."""
    job_dir = home / "experiments" / job_id
    (job_dir / "pretrain").mkdir(parents=True)
    record = records.JobRecord(id=job_id, stage="pretrain", config="tiny", executor="local", mode="local",
                               submitted=time.time(), job_dir=str(job_dir), task="pretrain",
                               log_glob="pretrain/log-local.out", handle={"pid": pid})
    if started:
        records.save(record := with_pid(record, pid, started))
    else:
        save_older(record)
    return record


def with_pid(record: records.JobRecord, pid: int | None, started: str | None = None) -> records.JobRecord:
    return dataclasses.replace(record, handle={"pid": pid, "started": started})


def save_older(record: records.JobRecord) -> None:
    """The record as an older launcher wrote it: its pid beside the other fields, no handle, no start time."""
    older = {k: v for k, v in dataclasses.asdict(record).items() if k != "handle"} | {"pid": record.handle["pid"]}
    records.registry_dir().mkdir(parents=True, exist_ok=True)
    (records.registry_dir() / f"{record.id}.json").write_text(json.dumps(older))


# -- a local job's process: identified by more than its pid -----------------------------------------------------

def gone_reason(pid: int) -> str:
    return (f"its process (pid {pid}) is gone and left no exit code: killed (SIGKILL, out of memory) or the machine "
            "restarted")


def test_a_job_whose_pid_went_to_another_process_is_gone_and_never_signalled(home, signals, decoy, cli_here):
    job = pretrain_job(overrides=['run.setup=["sleep 60"]'])
    record = executor("local").submit(job, new_job_id(job))
    pid, started = record.handle["pid"], record.handle["started"]
    signals.mine.add(pid)
    records.save(record)
    assert started and jobs.state(record).state == "RUNNING"
    os.killpg(pid, signal.SIGKILL)  # as the OOM killer does: no exit code written
    assert wait_for(lambda: jobs.state(record).state == "UNKNOWN", timeout=10), jobs.state(record)
    records.save(with_pid(record, decoy.pid, started))  # the kernel gave the job's pid to another process

    st = cli_here("jobs", "status", record.id, prog="nemotron")
    cancel = cli_here("jobs", "cancel", record.id, prog="nemotron")

    assert "state:     UNKNOWN\n" in st.out and f"reason:    {gone_reason(decoy.pid)}\n" in st.out, st.out
    assert (cancel.rc, cancel.err_lines) == (1, [f"error: {record.id} not cancelled: {gone_reason(decoy.pid)}"])
    assert decoy.poll() is None and signals.refused == []


def test_an_older_record_of_another_process_s_pid_is_never_signalled(home, signals, decoy, cli_here):
    """A record written before the start time was recorded: only the job's own script proves the process."""
    record = local_record(home, "ultra3-pretrain_20260101-000000-0ld0ld", decoy.pid)

    listed = cli_here("jobs", "list", prog="nemotron")
    cancel = cli_here("jobs", "cancel", record.id, prog="nemotron")

    assert listed.rc == 0 and " UNKNOWN " in listed.out.splitlines()[1], listed.out
    assert (cancel.rc, cancel.err_lines) == (1, [f"error: {record.id} not cancelled: {gone_reason(decoy.pid)}"])
    assert decoy.poll() is None and signals.refused == []


def test_an_older_record_of_a_running_job_is_still_cancelled(home, signals, cli_here):
    """Its process runs the job's own script in its own session, as every local job did: that proves it."""
    record = local_record(home, "ultra3-pretrain_20260101-000000-0ld0ld", None)
    script = Path(record.task_dir, "job.sh")
    script.write_text(f"trap 'echo $? > {record.task_dir}/exit_code' EXIT\ntrap 'exit 143' TERM\nsleep 60\n")
    proc = subprocess.Popen(["bash", str(script)], cwd=record.task_dir, start_new_session=True)
    signals.mine.add(proc.pid)
    save_older(with_pid(record, proc.pid))
    try:
        running = cli_here("jobs", "status", record.id, prog="nemotron")
        cancel = cli_here("jobs", "cancel", record.id, prog="nemotron")
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    after = cli_here("jobs", "status", record.id, prog="nemotron")

    assert "state:     RUNNING [process]" in running.out, running.out
    assert cancel.rc == 0 and cancel.out == f"cancelled {record.id}\n", cancel.out + cancel.err
    assert "state:     CANCELLED (exit code 143) [job dir]" in after.out, after.out


@pytest.mark.parametrize("started", [None, "not-a-boot-id/1"], ids=["older record", "record with a start time"])
def test_a_record_naming_pid_1_never_signals_it(home, signals, cli_here, started):
    """The guard (`signals`) refuses any signal to pid 1's group: code that tried fails here, having killed nothing."""
    record = local_record(home, "ultra3-pretrain_20260101-000000-111111", 1, started)

    st = cli_here("jobs", "status", record.id, prog="nemotron")
    cancel = cli_here("jobs", "cancel", record.id, prog="nemotron")

    assert "state:     UNKNOWN\n" in st.out and f"reason:    {gone_reason(1)}\n" in st.out, st.out
    assert (cancel.rc, cancel.err_lines) == (1, [f"error: {record.id} not cancelled: {gone_reason(1)}"])
    assert signals.refused == []


# -- the job registry: a damaged record is named and skipped ---------------------------------------------------

DAMAGED_RECORDS = {
    "submitted text": ({"submitted": "yesterday"}, 'submitted is "yesterday", not float'),
    "submitted NaN": ({"submitted": float("nan")}, "submitted is NaN, not float"),
    "submitted infinite": ({"submitted": float("inf")}, "submitted is Infinity, not float"),
    "pid text": ({"handle": {"pid": "1"}}, 'pid is "1", not int | None'),
    "pid true": ({"handle": {"pid": True}}, "pid is true, not int | None"),
    "handle text": ({"handle": "pid 1"}, 'handle is "pid 1", not dict[str, object]'),
    "another executor's handle": ({"handle": {"ssh": {"host": "login"}}},
                                  "unknown handle field 'ssh' (written by a newer launcher?)"),
    "no executor of ours": ({"executor": "k8s"}, "executor 'k8s' is none of local, slurm, ray"),
    "job_dir number": ({"job_dir": 5}, "job_dir is 5, not str"),
    "argv numbers": ({"argv": [1]}, "argv is [1], not list[str]"),
    "no stage": ({"stage": None}, "stage is null, not str"),
    "unknown field": ({"future": 1}, "unknown field 'future' (written by a newer launcher?)"),
}


@pytest.fixture
def good_and_bad(home, tmp_path):
    """A completed local job, and the id of a second record to damage."""
    completed_pretrain_job(home, tmp_path, OLDER)
    return OLDER, NEWER


@pytest.mark.parametrize("case", DAMAGED_RECORDS, ids=list(DAMAGED_RECORDS))
def test_a_damaged_job_record_is_named_and_the_others_still_listed(good_and_bad, case, cli_here):
    good, bad = good_and_bad
    change, why = DAMAGED_RECORDS[case]
    record = dataclasses.asdict(jobs.find(good)) | {"id": bad} | change
    path = records.registry_dir() / f"{bad}.json"
    path.write_text(json.dumps(record))

    listed, status, newest = (cli_here("jobs", *args, prog="nemotron") for args in (["list"], ["status", good],
                                                                                    ["status"]))

    warning = f"warning: {path}: skipped, a damaged job record: {why}; fix or remove it"
    for r in (listed, status, newest):
        assert r.rc == 0 and r.err_lines[0] == warning, r.out + r.err
    assert [line.split()[0] for line in listed.out.splitlines()] == ["JOB", good], listed.out
    assert "state:     COMPLETED (exit code 0) [job dir]" in status.out and f"job:       {good}" in newest.out


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized", "not JSON", "a list"])
def test_a_job_record_that_is_no_record_file_is_never_read(good_and_bad, kind):
    good, bad = good_and_bad
    path = records.registry_dir() / f"{bad}.json"
    why = make_hostile(path, kind, "{}")

    listed = nemotron("list")

    assert listed.rc == 0 and listed.err_lines == [f"warning: {path}: skipped, a damaged job record: {why}; "
                                                   "fix or remove it"], listed.err
    assert [line.split()[0] for line in listed.out.splitlines()] == ["JOB", good], listed.out


def make_hostile(path: Path, kind: str, text: str) -> str:
    """Put a hostile file at `path` (whose good content is `text`); the reason a reader gives for skipping it."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
        return "not a regular file"
    if kind == "/dev/zero":
        path.symlink_to("/dev/zero")
        return "not a regular file"
    if kind == "oversized":
        path.write_text(text[:-1] + " " * MIB + text[-1])
        return f"over {MIB} bytes"
    if kind == "not JSON":
        path.write_text("{")
        return "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    path.write_text("[]")
    return "a JSON list, not an object"


def test_a_damaged_exit_code_file_is_named_and_the_job_not_taken_for_finished(home, cli_here):
    record = local_record(home, "ultra3-pretrain_20260101-000000-e0e0e0", 2 ** 22 + 1)  # no such pid
    exit_file = Path(record.task_dir, "exit_code")
    exit_file.write_text("done\n")
    garbled = cli_here("jobs", "status", record.id, prog="nemotron")
    make_hostile(exit_file, "fifo", "")
    fifo = bounded([str(BIN / "nemotron"), "jobs", "status", record.id])

    assert garbled.rc == 0 and "state:     UNKNOWN\n" in garbled.out, garbled.out + garbled.err
    assert garbled.err_lines == [f"warning: {exit_file}: skipped, a damaged exit code file: 'done' is not an exit "
                                 "code; fix or remove it"], garbled.err
    assert fifo.rc == 0 and "state:     UNKNOWN\n" in fifo.out, fifo.out + fifo.err
    assert fifo.err_lines == [f"warning: {exit_file}: skipped, a damaged exit code file: not a regular file; fix or "
                              "remove it"], fifo.err


# -- the artifact store: damaged manifests and `latest` are named and skipped ------------------------------------

def good_manifest(version: int) -> tuple[Path, dict]:
    path = nemorun_home() / "artifacts" / CKPT / f"v{version}" / "manifest.json"
    return path, json.loads(path.read_text())


@pytest.fixture
def two_checkpoints(home, tmp_path):
    """Two completed pretraining jobs, each with its checkpoint published (v1 the older, v2 the newer)."""
    older = completed_pretrain_job(home, tmp_path, OLDER)
    completed_pretrain_job(home, tmp_path, NEWER)
    return older


def sft_dry_run(*overrides: str) -> Result:
    return bounded([str(BIN / "ultra3"), "sft", "-c", "tiny", "--dry-run", *overrides])


DAMAGED_MANIFESTS = {
    "created_ts far out": ({"created_ts": 1e300}, "created_ts 1e+300 is not a time (seconds since 1970)"),
    "created_ts past time_t": ({"created_ts": 1e18}, "created_ts 1e+18 is not a time (seconds since 1970)"),
    "created_ts NaN": ({"created_ts": float("nan")}, "created_ts nan is not a time (seconds since 1970)"),
    "created_ts text": ({"created_ts": "today"}, 'created_ts is "today", not int or float'),
    "version text": ({"version": "2"}, 'version is "2", not int'),
    "version 0": ({"version": 0}, "version 0 is below 1"),
    "producer number": ({"producer": 5}, "producer is 5, not str"),
    "inputs of text": ({"inputs": ["x"]}, "an entry of inputs is not an object with a text or null producer"),
    "metadata list": ({"metadata": []}, "metadata is [], not dict"),
    "no path": ({"path": None}, "path is null, not str"),
}


@pytest.mark.parametrize("case", DAMAGED_MANIFESTS, ids=list(DAMAGED_MANIFESTS))
def test_a_damaged_manifest_is_named_and_the_next_newest_taken(two_checkpoints, case, cli_here):
    change, why = DAMAGED_MANIFESTS[case]
    path, manifest = good_manifest(2)
    path.write_text(json.dumps(manifest | change) + "\n")

    r = cli_here("sft", "-c", "tiny", "--dry-run")

    assert r.rc == 0, r.err
    assert r.err_lines == [f"warning: {path}: skipped, a damaged artifact store file: {why}; fix or remove it"], r.err
    assert f"recipe.pretrained_checkpoint = {two_checkpoints}  (from {OLDER} completed " in r.out, r.out


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized", "not JSON", "a list"])
def test_a_manifest_that_is_no_manifest_file_is_never_read(two_checkpoints, kind):
    path, manifest = good_manifest(2)
    why = make_hostile(path, kind, json.dumps(manifest))

    r = sft_dry_run()

    assert r.rc == 0, r.err
    assert r.err_lines == [f"warning: {path}: skipped, a damaged artifact store file: {why}; fix or remove it"], r.err
    assert f"recipe.pretrained_checkpoint = {two_checkpoints}  (from {OLDER} completed " in r.out, r.out


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized", "not a number"])
def test_a_latest_that_is_no_version_number_is_never_read(two_checkpoints, kind):
    latest = nemorun_home() / "artifacts" / CKPT / "latest"
    if kind == "not a number":
        latest.write_text("v2\n")
        why = "'v2' is not a version number"
    else:
        why = make_hostile(latest, kind, "2\n").replace(str(MIB), "64")

    r = sft_dry_run(f"recipe.pretrained_checkpoint={CKPT}:latest")

    assert r.rc == 2, r.out + r.err
    assert r.err_lines == [
        f"warning: {latest}: skipped, a damaged artifact store file: {why}; fix or remove it",
        f"error: recipe.pretrained_checkpoint: {CKPT}:latest: no pretrain-checkpoint artifact of that name and "
        f"version in {nemorun_home() / 'artifacts'} (set in command line)"], r.err


def test_the_store_read_over_ssh_skips_and_names_what_is_no_manifest_file(two_checkpoints):
    """The cluster side of a store: the same `find | head` argv ssh runs on the login node, run here."""
    fifo, zero, big = (nemorun_home() / "artifacts" / name / "v1" / "manifest.json" for name in ("a", "b", "c"))
    for path in (fifo, zero, big):
        path.parent.mkdir(parents=True)
    make_hostile(fifo, "fifo", "{}")
    make_hostile(zero, "/dev/zero", "{}")
    big.write_text(json.dumps(good_manifest(1)[1] | {"name": "c", "metadata": {"pad": " " * MIB}}))
    code = ("from ultra3.artifacts import Store\n"
            f"print([(m['name'], m['version']) for m in Store({str(nemorun_home() / 'artifacts')!r})._remote()])")

    r = bounded([sys.executable, "-c", code])

    assert r.rc == 0 and r.out == f"[('{CKPT}', 2), ('{CKPT}', 1)]\n", r.out + r.err
    # a FIFO or a device is no regular file to find: not even listed; what is over the limit is named
    assert r.err_lines == [f"warning: {big}: skipped, a damaged artifact store file: over {MIB} bytes; fix or "
                           "remove it"], r.err


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_lineage_never_reads_a_config_yaml_that_is_no_file(two_checkpoints, kind):
    config = Path(jobs.find(NEWER).task_dir, "code", "config.yaml")
    make_hostile(config, kind, "")

    good = nemotron("lineage", OLDER)
    r = nemotron("lineage", NEWER)

    assert good.rc == 0 and f"  produced {CKPT}:v1  {two_checkpoints}\n" in good.out, good.out + good.err
    assert (r.rc, r.err) == (0, ""), r.err
    assert r.out == f"{NEWER}: its job dir holds no artifact record (submitted before artifacts, or not readable " \
                    "from here)\n"


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized", "not JSON", "a list", "steps of strings"])
def test_a_damaged_pipe_record_is_named_and_the_older_one_taken(good_and_bad, kind):
    good, _ = good_and_bad
    from ultra3.pipe_records import pipes_dir

    pipes_dir().mkdir(parents=True)
    record = {"id": "pipe-tiny_20260101-000000-aaaaaa", "config": "tiny.yaml", "submitted": 0.0,
              "steps": [{"id": "pretrain", "stage": "pretrain", "job": good}]}
    (pipes_dir() / f"{record['id']}.json").write_text(json.dumps(record))
    newer = pipes_dir() / "pipe-tiny_20260103-000000-cccccc.json"
    if kind == "steps of strings":
        newer.write_text(json.dumps(record | {"steps": [good]}))
        why = "steps is not a list of {id, stage, job}"
    else:
        why = make_hostile(newer, kind, json.dumps(record))
        why = "not an object with the pipe's id and config" if kind == "a list" else why

    r = nemotron("status", "pipe-tiny")

    assert r.rc == 0 and r.err_lines == [f"warning: {newer}: skipped, a damaged pipe record: {why}; fix or remove "
                                         "it"], r.out + r.err
    assert f"pipe:      {record['id']} (tiny.yaml)" in r.out and good in r.out, r.out


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized", "a list"])
def test_a_built_image_s_manifest_that_is_no_manifest_file_is_never_read(home, kind):
    from ultra3 import images

    image = images.kind_image("training", {}, str(home / "cache"), "h100")
    Path(image.path).parent.mkdir(parents=True)
    Path(image.path).write_bytes(b"sqsh")
    manifest = Path(image.manifest)
    make_hostile(manifest, kind, json.dumps({"digest": image.digest}))

    r = bounded([str(BIN / "ultra3"), "pretrain", "-c", "tiny", "--batch", "blackwell", "--dry-run",
                 "run.container_image=training", f"dataset.blend_path={home}/blend.json"])

    assert r.rc == 2 and "error: run.container_image: the training image is not built" in r.err, r.out + r.err
