"""The executors behind their one interface, on real parts: Slurm chains on the local cluster (afterok,
and Slurm cancelling a job whose upstream failed), the dry-run render of a chain, logs read from a byte
offset in real files, a local job run from its script file, and executors that do not chain refusing to."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import squeue_ids, wait_for
from ultra3 import jobs, records
from ultra3.compile import compile_job
from ultra3.job import Options
from ultra3.executors import executor
from ultra3.jobprep.jobdir import new_job_id
from ultra3.records import JobRecord
from ultra3.stages import STAGES

PRETRAIN = next(s for s in STAGES if s.name == "pretrain")


def add_profile(name: str, setup: list[str]) -> str:
    """A profile of the `home` fixture's env.toml whose batch script ends in its setup lines."""
    lines = ", ".join(f'"{line}"' for line in setup)
    with open("env.toml", "a") as f:
        f.write(f'\n[{name}]\nextends = "ci"\nsetup = [{lines}]\n')
    return name


def pretrain_job(**options):
    return compile_job(PRETRAIN, Options(config="tiny", **options))


# -- Slurm chains --------------------------------------------------------------------------------

@pytest.fixture
def nemo_run_here(home, monkeypatch):
    """NeMo-Run submitting from this process: it sets NEMORUN_HOME (undone after the test), and its
    packager (invoke) reads stdin."""
    monkeypatch.setenv("NEMORUN_HOME", str(home / "nemorun"))
    monkeypatch.setattr("sys.stdin", open(os.devnull))


@pytest.mark.slurm
def test_a_job_after_a_failing_one_is_cancelled_by_slurm_and_says_why(slurm, cli, home, nemo_run_here):
    slurm_ex = executor("slurm")
    first_job = pretrain_job(batch=add_profile("fails-soon", ["sleep 20", "exit 1"]))  # time to see the wait
    second_job = pretrain_job(batch="ci")
    first = slurm_ex.submit(first_job, new_job_id(first_job))
    first_slurm = slurm_ex.scheduler_id(first)
    submitted = [first_slurm]
    try:
        second_id = new_job_id(second_job)
        second = slurm_ex.submit(second_job, second_id, after=[first])
        submitted.append(slurm_ex.scheduler_id(second))
        for r in (first, second):
            records.save(r)

        assert second.after == [first.id] and first.after == []
        shown = subprocess.run(["scontrol", "show", "job", submitted[1]], capture_output=True, text=True).stdout
        assert re.search(rf"\bDependency=afterok:{first_slurm}\(unfulfilled\)", shown), shown
        # what NeMo-Run submitted is what the dry run renders for this chain
        script = Path(second.job_dir, "pretrain_sbatch.sh").read_text()
        assert script.rstrip("\n") == slurm_ex.render(second_job, second_id, [first])
        assert f"#SBATCH --dependency=afterok:{first_slurm}\n" in script
        assert "#SBATCH --kill-on-invalid-dep=yes\n" in script

        waiting = wait_for(lambda: (st := jobs.state(second)).reason.startswith("waiting") and st, timeout=15)
        assert waiting and waiting.state == "PENDING", jobs.state(second)
        assert waiting.reason in (f"waiting for upstream {first.id} PENDING",
                                  f"waiting for upstream {first.id} RUNNING"), waiting
        assert waiting.upstream == first.id

        ended = wait_for(lambda: (s := jobs.states([first, second]))[second.id].done and s, timeout=60)
        assert ended, f"{second.id} never ended: {jobs.state(second)}"  # not PENDING forever
        assert (ended[first.id].state, ended[first.id].exit_code) == ("FAILED", 1), ended[first.id]
        st = ended[second.id]
        assert (st.state, st.reason, st.upstream, st.exit_code) == (
            "CANCELLED", f"upstream {first.id} FAILED", first.id, None), st
        assert st.label == f"CANCELLED (upstream {first.id} FAILED)"
    finally:
        left = sorted(set(submitted) & squeue_ids())
        if left:
            subprocess.run(["scancel", *left], capture_output=True)

    # a later shell
    status = cli("jobs", "status", second.id, prog="nemotron")
    assert status.rc == 0 and f"state:     CANCELLED (upstream {first.id} FAILED) [sacct]\n" in status.out, status.out
    listed = cli("jobs", "list", prog="nemotron")
    row = next(line for line in listed.out.splitlines() if line.startswith(second.id))
    assert " CANCELLED (upstream FAILED) " in row, listed.out  # the column stays narrow: status names the job


def test_a_slurm_job_waits_only_for_slurm_jobs_of_its_cluster(home, tmp_path):
    local = JobRecord(id="ultra3-pretrain_x", stage="pretrain", config="tiny", executor="local", mode="local",
                      submitted=0, job_dir=str(tmp_path), task="pretrain", log_glob="log", handle={"pid": 1})
    with pytest.raises(ValueError, match="only for Slurm jobs of its own cluster"):
        executor("slurm").submit(pretrain_job(batch="ci"), "ultra3-pretrain_y", after=[local])


def test_dry_run_render_of_a_chain_has_the_dependency_lines(home):
    job = pretrain_job(batch="ci")
    alone = executor("slurm").render(job, None)
    chained = executor("slurm").render(job, None, ["<data-pretrain>", "<tokenizer>"])

    assert "--dependency" not in alone and "--kill-on-invalid-dep" not in alone
    assert "#SBATCH --dependency=afterok:<data-pretrain>:<tokenizer>\n" in chained
    assert "#SBATCH --kill-on-invalid-dep=yes\n" in chained
    assert [line for line in chained.splitlines() if "--dependency" not in line and "kill-on-invalid" not in line] \
        == alone.splitlines()
    assert "#SBATCH --output=@JOB_DIR@/pretrain/" in chained  # no id yet: the job dir's placeholder


def test_executors_that_do_not_chain_refuse_to(home, tmp_path):
    upstream = JobRecord(id="ultra3-pretrain_x", stage="pretrain", config="tiny", executor="local", mode="local",
                         submitted=0, job_dir=str(tmp_path), task="pretrain", log_glob="log")
    assert (executor("slurm").chains, executor("local").chains, executor("ray").chains) == (True, False, False)
    for name in ("local", "ray"):
        with pytest.raises(ValueError, match=f"the {name} executor does not chain jobs"):
            executor(name).submit(pretrain_job(), "ultra3-pretrain_y", after=[upstream])
    assert not (Path(home) / "nemorun").exists()  # refused before anything was written


# -- logs from a byte offset ---------------------------------------------------------------------

def test_read_log_returns_only_the_new_bytes(tmp_path):
    task = tmp_path / "pretrain"
    task.mkdir()
    log = task / "log-local.out"
    record = JobRecord(id="j", stage="pretrain", config="tiny", executor="local", mode="local", submitted=0,
                       job_dir=str(tmp_path), task="pretrain", log_glob="pretrain/log-local.out")
    local = executor("local")
    assert local.read_log(record, 0) == ("", 0)  # no log yet

    log.write_bytes("step 1 ✓\n".encode())
    text, offset = local.read_log(record, 0)
    assert (text, offset) == ("step 1 ✓\n", len("step 1 ✓\n".encode()))
    assert local.read_log(record, offset) == ("", offset)

    with open(log, "ab") as f:  # a second write, ending inside a 3-byte character
        f.write("step 2 ✓".encode()[:-1])
    text, at = local.read_log(record, offset)
    assert text == "step 2 " and at == offset + len(b"step 2 ")  # the cut character waits for its end
    with open(log, "ab") as f:
        f.write("✓".encode()[-1:] + b"\n")
    assert local.read_log(record, at) == ("✓\n", log.stat().st_size)


def test_slurm_read_log_reads_the_logs_of_every_start_as_one_stream(tmp_path):
    """A requeued job writes a log per start (log-<name>_<id>_<restart count>.out), read in that order."""
    task = tmp_path / "pretrain"
    task.mkdir()
    for restart, body in ((0, "first start\n"), (1, "second start\n"), (10, "eleventh start\n")):
        (task / f"log-ultra3.pretrain_7_{restart}.out").write_text(body)
    record = JobRecord(id="j", stage="pretrain", config="tiny", executor="slurm", mode="detached", submitted=0,
                       job_dir=str(tmp_path), task="pretrain", log_glob="pretrain/log-ultra3.pretrain_7_*.out",
                       handle={"slurm_id": "7"})
    text, offset = executor("slurm").read_log(record, 0)
    assert text == "first start\nsecond start\neleventh start\n" and offset == len(text)
    assert executor("slurm").read_log(record, len("first start\nsec")) == ("ond start\neleventh start\n", offset)


# -- the local executor --------------------------------------------------------------------------

def test_a_local_job_runs_its_script_file(home):
    job = pretrain_job(overrides=['run.setup=["echo set up", "exit 0"]'])
    record = executor("local").submit(job, new_job_id(job))
    records.save(record)
    out = io.StringIO()

    final = jobs.follow(record, out)

    assert (final.state, final.exit_code) == ("COMPLETED", 0), final
    script = Path(record.task_dir, "job.sh")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert script.read_text().startswith("#!/bin/bash\ntrap ")
    assert Path(record.task_dir, "exit_code").read_text().strip() == "0"


def test_a_failed_local_run_prints_its_preflight_line_once(home):
    """The log streams the PREFLIGHT FAILED line; the error after it, in the same terminal (or file), points at it
    instead of saying it again with the log's tail (on a stderr of its own, the error carries the line, without the
    tail: test_slurm_jobs)."""
    from conftest import BIN

    ultra3 = [str(BIN / "ultra3"), "pretrain", "-c", "tiny"]
    merged = subprocess.run(ultra3, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert merged.returncode != 0 and merged.stdout.count("PREFLIGHT FAILED") == 1, merged.stdout
    assert re.search(r"^error: ultra3-pretrain_\S+ FAILED \(exit code 3\): its preflight stopped it \(the line "
                     r"above\)$", merged.stdout, re.M), merged.stdout


# -- the registry --------------------------------------------------------------------------------

def test_a_record_written_before_chains_still_loads(home):
    old = {"id": "ultra3-pretrain_20260101-000000-aaaaaa", "stage": "pretrain", "config": "tiny", "executor": "slurm",
           "mode": "detached", "submitted": 1.0, "job_dir": "/jobs/x", "task": "pretrain",
           "log_glob": "pretrain/log-*.out", "profile": "ci", "slurm_id": "12", "pid": None, "ssh": None,
           "ray_address": None, "argv": ["ultra3"]}
    records.registry_dir().mkdir(parents=True)
    (records.registry_dir() / f"{old['id']}.json").write_text(json.dumps(old))

    record = jobs.find("12")
    assert (record.id, record.after, record.pipe, record.handle) == (old["id"], [], None, {"slurm_id": "12"})
    assert [r.id for r in jobs.all_records()] == [old["id"]]


# records before the handle: each executor's fields beside the others, null where another executor's
PREVIOUS_SHAPE = {
    "local": ({"pid": 4242, "started": "boot/17"}, "pid 4242", None, None),
    "slurm": ({"slurm_id": "12", "ssh": {"host": "login", "user": "me", "port": 2222, "identity": None}},
              "Slurm job 12", "12", {"host": "login", "user": "me", "port": 2222, "identity": None}),
    "ray": ({"ray_address": "http://head:8265"}, "Ray job on http://head:8265", None, None),
}


@pytest.mark.parametrize("name", PREVIOUS_SHAPE)
def test_a_record_of_the_previous_shape_is_read_into_its_executor_s_handle(home, name):
    fields, where, scheduler_id, remote = PREVIOUS_SHAPE[name]
    old = {"id": f"ultra3-pretrain_20260101-000000-{name}", "stage": "pretrain", "config": "tiny", "executor": name,
           "mode": "detached", "submitted": 1.0, "job_dir": "/jobs/x", "task": "pretrain", "log_glob": "pretrain/log",
           "profile": None, "slurm_id": None, "pid": None, "started": None, "ssh": None, "ray_address": None,
           "argv": ["ultra3"], "after": [], "pipe": None} | fields
    records.registry_dir().mkdir(parents=True)
    (records.registry_dir() / f"{old['id']}.json").write_text(json.dumps(old))

    record = jobs.find(old["id"])
    reader = executor(name)

    assert record.handle == fields
    assert (reader.where(record), reader.scheduler_id(record), reader.remote(record)) == (where, scheduler_id, remote)
    records.save(record)  # written back in this launcher's shape: the same record
    assert json.loads((records.registry_dir() / f"{old['id']}.json").read_text())["handle"] == fields
    assert jobs.find(old["id"]) == record
