"""A Ray job's state once its cluster cannot be reached: the final state a command kept in the task dir, else the
end the job wrote in its job dir (the attempts ledger, written here by the runtime's own recipes/attempts.py),
else UNKNOWN with the reason. The cluster is an address nothing listens on (the real cluster, stopped under a job
that ran on it: tests/test_ray_executor.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import free_ports
from recipes import attempts
from ultra3 import jobs
from ultra3.records import JobRecord


def ray_record(job_dir: Path) -> JobRecord:
    (job_dir / "data-prep").mkdir(parents=True)
    return JobRecord(id=f"ultra3-data-prep-pretrain_{job_dir.name}", stage="data prep pretrain", config="tiny",
                     executor="ray", mode="detached", submitted=1.0, job_dir=str(job_dir), task="data-prep",
                     log_glob="", handle={"ray_address": f"http://127.0.0.1:{free_ports(1)[0]}", "submission_id": None})


def ended(record: JobRecord, code: int) -> None:
    """The job's launcher on the cluster's node: one attempt, begun and ended with `code`."""
    cfg = {"job": {"dir": record.job_dir, "id": record.id}, "run": {}}
    attempts.end(cfg, attempts.begin(cfg), code, None)


@pytest.mark.parametrize("code, state, exit_code, reason", [
    (0, "COMPLETED", 0, ""),
    (3, "FAILED", 3, "a config or input error: never retried"),
    (1, "FAILED", 1, "exit code 1"),
])
def test_the_job_s_own_end_in_its_job_dir_gives_its_state(tmp_path, code, state, exit_code, reason):
    record = ray_record(tmp_path / f"job-{code}")
    ended(record, code)
    st = jobs.state(record)
    assert (st.state, st.exit_code, st.reason, st.source) == (state, exit_code, reason, "job dir")


def test_a_kept_final_state_is_read_without_the_cluster(tmp_path):
    record = ray_record(tmp_path / "job")
    final = {"state": "FAILED", "exit_code": 3, "reason": "PREFLIGHT FAILED on head: no GPU"}
    (Path(record.task_dir) / "final_state.json").write_text(json.dumps(final))
    st = jobs.state(record)
    assert (st.state, st.exit_code, st.reason, st.source) == ("FAILED", 3, final["reason"], "job dir")


def test_without_a_kept_state_or_an_end_it_is_unknown_and_says_why(tmp_path, capsys):
    record = ray_record(tmp_path / "job")
    (Path(record.task_dir) / "final_state.json").write_text("{not json")
    st = jobs.state(record)
    assert st.state == "UNKNOWN" and st.exit_code is None
    assert st.reason.startswith(f"cannot reach the Ray cluster at {record.handle['ray_address']}: ")
    assert st.reason.endswith("; its job dir holds no end of it either"), st.reason
    assert "final_state.json: skipped, a damaged final state file" in capsys.readouterr().err
