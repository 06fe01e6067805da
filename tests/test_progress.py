"""Where a run is, from its log: the committed GPU smoke logs (benchmarks/gpu_smoke, Megatron-Bridge on an H200)
read back, split by attempt; `nemotron jobs status`, `plot` and `goodput` on a recorded two-attempt run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import REPO
from ultra3 import goodput, ledger, progress, records
from ultra3.contract import ATTEMPT_MARK

SMOKE = REPO / "benchmarks" / "gpu_smoke"


def two_attempts() -> str:
    """The smoke test's pretrain (iterations 1-40) and its resume (41-60) as one requeued job's log."""
    return (f"{ATTEMPT_MARK} 1: Slurm job 7 (restart 0) on node001 at 2026-11-26T06:37:00+0000\n"
            + (SMOKE / "pretrain.log").read_text()
            + f"\n{ATTEMPT_MARK} 2: Slurm job 7 (restart 1) on node001 at 2026-11-26T06:45:00+0000\n"
            + (SMOKE / "resume.log").read_text())


def test_the_smoke_logs_read_back():
    (one,) = progress.parse((SMOKE / "pretrain.log").read_text())
    assert [it["iteration"] for it in one.iterations] == list(range(1, 41))
    assert one.iterations[0]["lm loss"] == pytest.approx(8.334375) and one.iterations[0]["of"] == 40
    assert one.iterations[0]["elapsed time per iteration (ms)"] == pytest.approx(87356.3)
    assert one.saved == [20, 40] and one.loaded == []
    assert [(v["iteration"], v["set"]) for v in one.validation] == [
        (20, "validation (in training)"), (40, "validation (in training)"), (40, "validation"), (40, "test")]


def test_a_requeued_run_splits_into_its_attempts_and_says_where_it_is():
    first, second = progress.parse(two_attempts())
    assert (first.number, second.number) == (1, 2)
    assert [it["iteration"] for it in second.iterations] == list(range(41, 61)) and second.loaded == [40]
    lines = progress.status_lines([first, second], seq_length=512, time_limit_s=1800)
    assert lines[0] == f"progress:  iteration 60 of 60 (100.0%), {60 * 4 * 512 / 1e3:.2f}K tokens"
    assert lines[1].startswith(f"loss:      lm loss {second.iterations[-1]['lm loss']:.4g}, validation ")
    step = progress.step_seconds([first, second])
    assert 0.1 < step < 1.0  # each attempt's first steps (87 s of autotuning in the first) left out
    assert lines[2].startswith(f"speed:     {step:.2f} s/iteration, {4 * 512 / step:,.0f} tokens/s; ETA 0 min")


def test_a_loss_spike_is_flagged_as_megatron_judges_it():
    lines = [f"[2026-11-26 06:40:{i % 60:02d}] iteration {i:>8}/     200 | lm loss: {2.0 if i != 150 else 25.0:E} |"
             for i in range(1, 201)]
    attempts = progress.parse("\n".join(lines))
    assert [it["iteration"] for it in progress.spikes(attempts)] == [150]  # 25 >= 10 x 2.0, the first 100's largest
    assert progress.spikes(attempts, factor=20.0) == []
    assert any(line.startswith("spike:     iteration 150: lm loss 25") for line in
               progress.status_lines(attempts, None, None))


def test_a_data_prep_says_its_shards():
    text = ("data prep pretrain: 1 dataset(s), 16 shard(s) (13 to write, 3 done); tokenizer ...\n"
            "progress: 10 docs (5.0% of 200 records), 1.00k tokens, 1.00k tokens/s, 1.0 MB/s, shards 4/13, "
            "elapsed 0:00:01")  # a second attempt: 3 shards kept from the first, 4 of its 13 written
    assert progress.status_lines(progress.parse(text), None, None) == ["progress:  shards 7 of 16"]


@pytest.fixture
def recorded(home) -> records.JobRecord:
    """A finished two-attempt pretrain run in the registry: its log, config and ledger as a job leaves them."""
    job_dir = home / "experiments" / "ultra3-pretrain_20261126-063700-abcdef"
    (job_dir / "pretrain" / "code").mkdir(parents=True)
    (job_dir / "pretrain" / "log-local.out").write_text(two_attempts())
    (job_dir / "pretrain" / "code" / "config.yaml").write_text(
        "run: {nodes: 1, gpus_per_node: 1}\nmodel: {seq_length: 512}\n")
    (job_dir / "pretrain" / "exit_code").write_text("0\n")
    first, second = progress.parse(two_attempts())
    start1 = first.iterations[0]["at"] - 95  # the job started 95 s before its first iteration ended
    start2 = second.iterations[0]["at"] - 80
    entries = [{"event": "start", "attempt": 1, "at": start1, "restart": 0, "nodes": 1},
               {"event": "end", "attempt": 1, "at": first.iterations[-1]["at"] + 30, "outcome": "continue",
                "exit": 75, "why": "stopped for the time limit with its work saved"},
               {"event": "start", "attempt": 2, "at": start2, "restart": 1, "nodes": 1},
               {"event": "end", "attempt": 2, "at": second.iterations[-1]["at"] + 20, "outcome": "done", "exit": 0,
                "why": "completed"}]
    (job_dir / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    record = records.JobRecord(id=job_dir.name, stage="pretrain", config="tiny", executor="local", mode="local",
                               submitted=time.time(), job_dir=str(job_dir), task="pretrain",
                               log_glob="pretrain/log-local.out", handle={"pid": None, "started": None})
    records.save(record)
    return record


def test_goodput_splits_each_attempt(recorded):
    runs = ledger.attempts(recorded)
    logs = progress.parse(two_attempts())
    assert [(r.number, r.outcome) for r in runs] == [(1, "continue"), (2, "done")]
    first = goodput.split(runs[0], logs[0], progress.step_seconds(logs))
    saved_40 = next(it["at"] for it in logs[0].iterations if it["iteration"] == 40)
    assert first.startup == pytest.approx(95) and first.productive == pytest.approx(saved_40 - runs[0].start - 95)
    assert first.lost == pytest.approx(30)  # after the save at iteration 40, nothing kept
    second = goodput.split(runs[1], logs[1], None)
    assert second.startup == pytest.approx(80) and second.lost == 0


def test_status_plot_and_goodput_from_a_new_shell(recorded, cli, tmp_path):
    status = cli("jobs", "status", recorded.id, prog="nemotron")
    assert status.rc == 0, status.err
    assert "progress:  iteration 60 of 60 (100.0%), 122.88K tokens" in status.out
    assert "attempts:  2" in status.out and "continue  stopped for the time limit with its work saved" in status.out
    shown = cli("jobs", "goodput", recorded.id, prog="nemotron")
    assert shown.rc == 0, shown.err
    assert shown.out.startswith(f"{recorded.id}: 2 attempt(s), goodput ")
    assert "attempt   1  continue  productive" in shown.out and "GPU-h" in shown.out
    png = tmp_path / "loss.png"
    plotted = cli("jobs", "plot", recorded.id, "-o", str(png), prog="nemotron")
    assert plotted.rc == 0 and plotted.out == f"wrote {png}\n", plotted.err
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 600 and image[..., :3].std() > 0.05  # drawn, not blank


def test_plot_of_a_job_without_iterations_is_one_line(home, cli, recorded):
    Path(recorded.job_dir, "pretrain", "log-local.out").write_text("preflight ok\n")
    bad = cli("jobs", "plot", recorded.id, prog="nemotron")
    assert bad.rc == 2 and len(bad.err_lines) == 1 and bad.err.startswith("error: ")
    assert "no training iteration" in bad.err
