"""`nemotron jobs` for everyday use, on jobs of real local runs: list's filters and its pipe listing, `logs
--follow` ending with the final state, and `prune`, which removes the job dirs and records of old finished jobs
and keeps, saying why, those not ended and those holding published artifacts or checkpoints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ultra3.cli.jobs import _short
from ultra3.records import State

FAILING_PIPE = {"stages": {"pretrain": {"stage": "pretrain", "config": "tiny"},  # stops in its preflight here
                           "sft": {"stage": "sft", "config": "tiny"}}}


def test_list_s_state_column_names_the_upstream_by_its_state_only():
    st = State("CANCELLED", reason="upstream ultra3-pretrain_20261125-140210-13a9b2 FAILED",
               upstream="ultra3-pretrain_20261125-140210-13a9b2")
    assert _short(st) == "CANCELLED (upstream FAILED)"
    waiting = State("PENDING", reason="waiting for upstream ultra3-x_1 RUNNING", upstream="ultra3-x_1")
    assert _short(waiting) == "PENDING (waiting for upstream RUNNING)" and _short(State("FAILED")) == "FAILED"


@pytest.mark.parametrize("args, line", [
    (["list", "--stage", "pretrian"], "error: --stage pretrian: no such stage; did you mean 'pretrain'?"),
    (["list", "--state", "faild"], "error: --state FAILD: no such state; did you mean 'FAILED'?"),
    (["prune", "--older-than", "7"], "error: --older-than 7: give a number and a unit, e.g. 7d, 12h, 30m (or 0 for "
                                     "every age)"),
])
def test_bad_filters_are_one_line(cli_here, args, line):
    r = cli_here("jobs", *args, prog="nemotron")
    assert (r.rc, r.err_lines) == (2, [line]), r.err


@pytest.mark.heavy
def test_list_filters_follow_and_prune_on_real_local_runs(cli, home, tmp_path):
    def nemotron(*args: str):
        return cli("jobs", *args, prog="nemotron")

    assert cli("data", "prep", "pretrain", "-c", "tiny").rc == 0  # publishes its blend: its job dir stays
    failed = cli("pretrain", "-c", "tiny")
    assert failed.rc != 0
    lone = re.search(r"^submitted (\S+) ", failed.out, re.M).group(1)
    pipe_file = tmp_path / "fails.yaml"
    pipe_file.write_text(yaml.safe_dump(FAILING_PIPE, sort_keys=False))
    piped = cli("pipe", "-c", str(pipe_file))
    pipe_id = re.search(r"^pipe: (\S+)$", piped.out, re.M).group(1)
    step = re.search(r"^== pretrain: (\S+) ==$", piped.out, re.M).group(1)
    running = cli("pretrain", "-c", "tiny", "--batch", "workstation", 'run.setup=["sleep 300"]')
    busy = re.search(r"^submitted (\S+) ", running.out, re.M).group(1)
    try:
        rows = lambda *args: [line.split()[0] for line in nemotron("list", *args).out.splitlines()[1:]]  # noqa: E731
        assert rows("--state", "failed") == [step, lone]
        assert rows("--stage", "data-prep-pretrain") == rows("--stage", "data prep pretrain") != []
        assert rows("--profile", "workstation") == [busy] and rows("--pipe", pipe_id) == [step]
        assert nemotron("list", "--state", "TIMEOUT").out == f"no jobs with --state TIMEOUT (registry: {home}/jobs)\n"
        pipes = nemotron("list", "--pipes").out.splitlines()
        assert re.fullmatch(rf"{pipe_id}  fails +FAILED +1 FAILED, 1 NOT RUN +\d+s", pipes[1]), pipes

        followed = nemotron("logs", step, "--follow")
        assert followed.err_lines == [f"{step} ended FAILED (exit code 3)"], followed.err  # the log said why

        # a checkpoint written into the lone run's job dir (as a run that saved, then failed): it stays
        job_dir = Path(re.search(r"^job dir: (\S+)$", failed.out, re.M).group(1))
        (job_dir / "checkpoints" / "iter_0000020").mkdir(parents=True)
        (job_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("20")
        dry = nemotron("prune", "--older-than", "0")
        assert dry.rc == 0, dry.err
        said = dry.out.splitlines()
        assert said[0].startswith("would remove 1 job(s), ") and said[1].startswith(f"  {step}  FAILED  "), dry.out
        assert f"  {busy}  RUNNING  not ended (RUNNING)" in said, dry.out
        assert any(re.fullmatch(r"  ultra3-data-prep-pretrain_\S+  COMPLETED  holds published "
                                r"ultra3-pretrain-data-tiny:v1", line) for line in said), dry.out
        assert f"  {lone}  FAILED  holds its pretrain-checkpoint output {job_dir}/checkpoints (not published; a " \
               "resume or a fork starts from it)" in said, dry.out
        assert said[-1] == "dry run: nothing removed; `nemotron jobs prune --older-than 0 --yes` removes them"
        step_dir = Path(said[1].split()[-1])
        assert step_dir.is_dir() and (home / "jobs" / f"{step}.json").is_file()  # the dry run removed nothing

        done = nemotron("prune", "--older-than", "0", "--yes")
        assert done.rc == 0 and done.out.startswith("removed 1 job(s)"), done.out + done.err
        assert f"removed pipe record {pipe_id} (none of its jobs is left)" in done.out
        assert not step_dir.exists() and not (home / "jobs" / f"{step}.json").exists()
        assert not (home / "pipes" / f"{pipe_id}.json").exists()
        assert sorted(rows()) == sorted([busy, lone, rows("--stage", "data-prep-pretrain")[0]])
        assert job_dir.is_dir()
        assert nemotron("prune", "--older-than", "1d").out.splitlines()[0] == "would remove 0 job(s), 0.0 MB (job " \
                                                                             "dirs and records):"
    finally:
        nemotron("cancel", busy)
