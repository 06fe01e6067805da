"""Following a Slurm job ends at the batch script's last line (`job exited with code N`), which lands seconds
before Slurm's accounting ends the job: exit code 0 there is the job's completion; another code leaves the
verdict to Slurm. Real jobs on the local cluster stand in for the job (a sleep Slurm still calls RUNNING) and a
real job dir holds what NeMo-Run's script writes."""

from __future__ import annotations

import io
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import wait_for

pytestmark = pytest.mark.slurm


def running_ids() -> set[str]:
    return set(subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True,
                              text=True).stdout.split())


@pytest.fixture
def running(home):
    """A real Slurm job that runs until cancelled, as a launcher record whose job dir is ours to write."""
    from ultra3 import records

    done = subprocess.run(["sbatch", "--parsable", "-A", "ultra3", "-p", "debug", "-o", "/dev/null",
                           "--wrap", "sleep 300"], capture_output=True, text=True, check=True)
    slurm_id = done.stdout.strip().split(";")[0]
    wait_for(lambda: slurm_id in running_ids())
    job_dir = home / "job"
    (job_dir / "t").mkdir(parents=True)
    record = records.JobRecord(id="ultra3-x_20261128-120000-aaaaaa", stage="x", config="tiny", executor="slurm",
                               mode="attached", submitted=1.0, job_dir=str(job_dir), task="t",
                               log_glob=f"t/log-ultra3.t_{slurm_id}_*.out", handle={"slurm_id": slurm_id})
    (job_dir / "t" / f"log-ultra3.t_{slurm_id}_0.out").write_text("the job's last line\n")
    yield record, job_dir / "t" / f"sbatch_ultra3.t_{slurm_id}.out"
    subprocess.run(["scancel", slurm_id], capture_output=True)


def follow_in_thread(record) -> tuple[threading.Thread, dict]:
    from ultra3 import jobs

    result: dict = {}
    out = io.StringIO()
    thread = threading.Thread(target=lambda: result.update(state=jobs.follow(record, out), out=out.getvalue()),
                              daemon=True)
    thread.start()
    return thread, result


def test_following_ends_at_exit_code_0_in_the_batch_output_while_slurm_says_running(running):
    record, batch_out = running
    thread, result = follow_in_thread(record)
    batch_out.write_text("+ srun --output log\njob exited with code 0\n+ '[' 0 -ne 0 ']'\n")

    thread.join(timeout=20)

    assert not thread.is_alive(), "still following a job whose script said it exited 0"
    st = result["state"]
    assert (st.state, st.exit_code, st.source) == ("COMPLETED", 0, "job dir") and result["out"] == \
        "the job's last line\n"
    assert record.handle["slurm_id"] in running_ids()  # Slurm had not said so yet


def test_another_exit_code_leaves_the_verdict_to_slurm(running):
    record, batch_out = running
    batch_out.write_text("job exited with code 1\n")  # an earlier attempt's end: the job goes on
    thread, result = follow_in_thread(record)
    Path(batch_out).write_text("job exited with code 1\njob exited with code 143\n")

    thread.join(timeout=3)
    assert thread.is_alive(), f"took the script's exit code for the job's end: {result}"
    subprocess.run(["scancel", record.handle["slurm_id"]], check=True)
    thread.join(timeout=30)

    assert not thread.is_alive() and result["state"].state == "CANCELLED", result

