"""The attempt supervisor's ledger and decisions (recipes/attempts.py) on real job dirs, off Slurm: what a requeued
attempt finds and what it does; the Slurm side is tests/test_long_runs_slurm.py."""

from __future__ import annotations

import json
import os
import signal

import pytest

from conftest import wait_for

from recipes import attempts
from recipes.contract import ATTEMPTS_FILE, CONTINUE_EXIT, FINISHED_FILE, INPUT_ERROR_EXIT, ledger_entries


@pytest.fixture
def cfg(tmp_path, monkeypatch) -> dict:
    for var in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_NNODES"):
        monkeypatch.delenv(var, raising=False)
    job_dir, outputs = tmp_path / "job", tmp_path / "outputs" / "ultra3-pretrain" / "default-abc"
    job_dir.mkdir()
    outputs.mkdir(parents=True)
    return {"run": {"max_retries": 1}, "job": {"dir": str(job_dir), "id": "ultra3-pretrain_x", "outputs": str(outputs),
                                               "produces": [{"path": f"{outputs}/checkpoints"}]}}


def entries(cfg: dict) -> list[dict]:
    with open(f"{cfg['job']['dir']}/{ATTEMPTS_FILE}") as f:
        text = f.read()
    assert "\n\n" not in text  # one entry a line, no blank ones
    return ledger_entries(text)


def test_a_completed_attempt_marks_the_run_finished_where_every_submission_looks(cfg, capsys):
    attempt = attempts.begin(cfg)
    assert attempt["attempt"] == 1 and capsys.readouterr().out == ""  # off Slurm a job is one attempt: no line
    assert attempts.end(cfg, attempt, 0, None) == 0
    for folder in (cfg["job"]["dir"], cfg["job"]["outputs"]):  # the checkpoints live under job.outputs
        assert json.loads(open(f"{folder}/{FINISHED_FILE}").read())["attempt"] == 1
    assert attempts.begin(cfg) == 0  # a new submission of the same config, or a requeue: nothing runs
    assert "this run finished" in capsys.readouterr().out
    assert [e["event"] for e in entries(cfg)] == ["start", "end"]


def test_a_run_whose_outputs_are_its_own_marks_only_its_job_dir(cfg):
    cfg["job"]["produces"] = [{"path": f"{cfg['job']['dir']}/checkpoints"}]  # a fresh run on every submission
    attempts.end(cfg, attempts.begin(cfg), 0, None)
    assert not (attempts.os.path.exists(f"{cfg['job']['outputs']}/{FINISHED_FILE}"))


def test_an_attempt_that_left_no_end_is_closed_as_lost_and_counts_as_a_failure(cfg):
    first = attempts.begin(cfg)  # its node died: no end line
    with open(f"{cfg['job']['dir']}/{ATTEMPTS_FILE}", "a") as f:
        f.write('{"event": "end", "attem')  # a torn line, as a node dying mid-write leaves
    second = attempts.begin(cfg)
    assert second["attempt"] == first["attempt"] + 1
    lost = [e for e in entries(cfg) if e["event"] == "end"]
    assert [(e["attempt"], e["outcome"]) for e in lost] == [(1, "lost")]
    assert attempts.failures_in_a_row(entries(cfg)) == 1


def test_failures_in_a_row_past_max_retries_stop_the_run_before_it_starts(cfg, capsys):
    for _ in range(2):
        attempts.begin(cfg)  # two attempts lost in a row; run.max_retries is 1
    assert attempts.begin(cfg) == 1
    stopped = entries(cfg)[-1]
    assert stopped["outcome"] == "stopped" and "2 failed attempts in a row, over run.max_retries=1" in stopped["why"]


def test_a_success_or_a_continuation_resets_the_count(cfg):
    ledger = [{"event": "end", "attempt": n, "outcome": outcome}
              for n, outcome in enumerate(("failed", "continue", "lost", "failed"), 1)]
    assert attempts.failures_in_a_row(ledger) == 2
    assert attempts.failures_in_a_row(ledger[:2]) == 0


@pytest.mark.parametrize("code, outcome, why", [
    (INPUT_ERROR_EXIT, "stopped", "a config or input error: never retried"),
    (17, "stopped", "failed validation again (exit 17); never retried"),
    (CONTINUE_EXIT, "continue", "stopped early with its work saved"),
    (16, "failed", "asks to resume from its checkpoint (exit 16)"),
    (137, "failed", "exit code 137 (SIGKILL"),
])
def test_how_an_attempt_ends_decides_what_follows(cfg, monkeypatch, code, outcome, why):
    assert attempts.end(cfg, attempts.begin(cfg), code, None) == code
    last = entries(cfg)[-1]
    assert (last["outcome"], last["exit"]) == (outcome, code) and why in last["why"], last


def test_the_watchdog_ends_an_attempt_whose_stage_outlives_the_signal(cfg):
    cfg["job"]["grace_s"] = attempts.STOP_MARGIN_S + 1  # the stage has 1 s from the signal
    watch = attempts.Watch(cfg, attempts.begin(cfg))
    watch.armed()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # as Slurm sends it to the job's steps
        assert wait_for(lambda: len(entries(cfg)) == 2, timeout=10, interval=0.05)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    assert watch.signalled
    last = entries(cfg)[-1]
    assert last["outcome"] == "failed" and last["why"].startswith("did not stop within 1 s of the time-limit signal")
    assert attempts.end(cfg, {"attempt": last["attempt"]}, CONTINUE_EXIT, watch) == CONTINUE_EXIT  # ended once
    assert len(entries(cfg)) == 2
