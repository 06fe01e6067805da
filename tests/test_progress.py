"""Where a run is, from its log: the committed GPU smoke logs (benchmarks/gpu_smoke, Megatron-Bridge on an H200)
read back, split by attempt; `nemotron jobs status`, `plot` and `goodput` on a recorded two-attempt run, and on
one whose log is still being written."""

from __future__ import annotations

import calendar
import json
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from ultra3 import goodput, ledger, progress, records
from ultra3.contract import ATTEMPT_MARK

SMOKE = REPO / "benchmarks" / "gpu_smoke"


def mark(number: int, at: str) -> str:
    """The first node's line as an attempt starts (recipes/attempts.py)."""
    return f"{ATTEMPT_MARK} {number}: Slurm job 7 (restart {number - 1}) on node001 at {at}\n"


def two_attempts() -> str:
    """The smoke test's pretrain (iterations 1-40) and its resume (41-60) as one requeued job's log; each mark
    precedes its log's first line (the resume ran first that day, at 04:17)."""
    return (mark(1, "2026-11-26T06:37:00+0000") + (SMOKE / "pretrain.log").read_text()
            + mark(2, "2026-11-26T04:17:30+0000") + (SMOKE / "resume.log").read_text())


def megatron(i: int, of: int, loss: float, ms: float = 2000.0, at: str = "2026-11-26 06:40:00") -> str:
    """An iteration line as Megatron-Bridge writes it (batch 4)."""
    return (f" [{at}] iteration {i:>8}/{of:>8} | consumed samples: {4 * i:>12} | elapsed time per iteration (ms): "
            f"{ms:.1f} | learning rate: 1.000000E-04 | global batch size:     4 | lm loss: {loss:E} | loss scale: 1.0 |"
            " number of skipped iterations:   0 | number of nan iterations:   0 |\n")


@pytest.mark.parametrize("step, first, last, of, saved, loaded, validation", [
    ("pretrain", (1, 8.334375), (40, 6.319043), 40, [20, 40], [],
     [(20, "validation (in training)", 7.004302), (40, "validation (in training)", 6.398107),
      (40, "validation", 6.356113), (40, "test", 6.359898)]),
    ("resume", (41, 6.353098), (60, 6.305297), 60, [60], [40],
     [(60, "validation (in training)", 6.36975), (60, "validation", 6.347687), (60, "test", 6.34968)]),
    ("sft", (1, 7.085596), (40, 6.901337), 40, [20, 40], [0],
     [(20, "validation (in training)", 6.805695), (40, "validation (in training)", 6.844316),
      (40, "validation", 6.914853)]),
])
def test_the_smoke_logs_read_back(step, first, last, of, saved, loaded, validation):
    (one,) = progress.parse((SMOKE / f"{step}.log").read_text())
    its = one.iterations
    assert [it["iteration"] for it in its] == list(range(first[0], last[0] + 1)) and {it["of"] for it in its} == {of}
    assert (its[0]["lm loss"], its[-1]["lm loss"]) == (pytest.approx(first[1]), pytest.approx(last[1]))
    assert its[-1]["consumed samples"] == 4 * last[0] and its[-1]["global batch size"] == 4
    assert one.saved == saved and one.loaded == loaded
    assert [(v["iteration"], v["set"], v["lm loss"]) for v in one.validation] == [
        (i, s, pytest.approx(x)) for i, s, x in validation]


def test_pretrain_first_iteration_holds_the_autotuning():
    (one,) = progress.parse((SMOKE / "pretrain.log").read_text())
    assert one.iterations[0]["elapsed time per iteration (ms)"] == pytest.approx(87356.3)
    assert 0.3 < progress.step_seconds([one]) < 0.4  # the first 3 left out


def test_a_requeued_run_splits_into_its_attempts_and_says_where_it_is():
    first, second = progress.parse(two_attempts())
    assert (first.number, second.number) == (1, 2) and first.utc_offset == second.utc_offset == 0
    assert first.started == calendar.timegm((2026, 11, 26, 6, 37, 0, 0, 0, 0))
    assert first.iterations[0]["at"] == calendar.timegm((2026, 11, 26, 6, 39, 54, 0, 0, 0))  # in the mark's zone
    assert [it["iteration"] for it in first.iterations] == list(range(1, 41))
    assert [it["iteration"] for it in second.iterations] == list(range(41, 61)) and second.loaded == [40]
    assert progress.startup_seconds([first, second]) == pytest.approx((175 + 137) / 2)  # to each one's 3rd step
    lines = progress.status_lines([first, second], seq_length=512, time_limit_s=1800)
    assert lines[0] == f"progress:  iteration 60 of 60 (100.0%), {60 * 4 * 512 / 1e3:.2f}K tokens"
    assert lines[1] == "loss:      lm loss 6.305, validation 6.348 (iteration 60)"  # the test set's left out
    step = progress.step_seconds([first, second])
    assert 0.3 < step < 0.7  # each attempt's first steps (87 s and 116 s of autotuning) left out
    assert lines[2] == f"speed:     {step:.2f} s/iteration, {4 * 512 / step:,.0f} tokens/s; ETA 0 min of steps"
    assert len(lines) == 3  # no spike: 60 losses are fewer than Megatron's 100 samples


def test_the_allocations_left_count_each_ones_start_up():
    """800 iterations of 2 s left, 10-minute allocations of which each spends 100 s starting: 1,600 s of steps
    in 500 s each, 4 allocations."""
    ends = (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1795675200 + 2 * i)) for i in range(1, 201))
    text = mark(1, "2026-11-26T06:38:26+0100") + "".join(megatron(i, 1000, 2.0, at=at) for i, at in enumerate(ends, 1))
    (one,) = progress.parse(text)
    assert progress.startup_seconds([one]) == 100  # 06:38:26 to the 3rd iteration's end, 06:40:06 (both UTC+1)
    assert progress.status_lines([one], 512, 600)[1:] == [
        "loss:      lm loss 2", "speed:     2.00 s/iteration, 1,024 tokens/s; ETA 27 min of steps, ~4 allocation(s) "
        "of run.time, each less 2 min of start-up"]
    assert progress.status_lines([one], None, None) == [
        "progress:  iteration 200 of 1,000 (20.0%), 800 samples", "loss:      lm loss 2",
        "speed:     2.00 s/iteration; ETA 27 min of steps"]  # no seq_length: samples; no time limit: no count


def test_a_run_in_phases_counts_to_the_runs_end_and_says_its_phase():
    """Phase 1 logs its own end (iteration N/ 300): the run's train_iters is what is left, the phase is said."""
    text = "".join(megatron(i, 300, 2.0) for i in range(1, 201))
    (one,) = progress.parse(text)
    lines = progress.status_lines([one], None, None, run=(1000, 300))
    assert lines[0] == "progress:  iteration 200 of 1,000 (20.0%), 800 samples; phase 1 of 2 (phase 2 from " \
                       "iteration 300)"
    assert lines[2] == "speed:     2.00 s/iteration; ETA 27 min of steps"  # 800 iterations left, not 100


def test_a_loss_spike_is_flagged_as_megatron_judges_it():
    losses = {i: 2.0 for i in range(1, 201)} | {7: float("nan"), 150: 25.0, 160: float("inf"), 170: -30.0}
    attempts = progress.parse("".join(megatron(i, 200, loss) for i, loss in losses.items()))
    # 25 >= 10 x 2.0, the largest of the first 100 finite losses (the NaN is not sampled); Inf is not flagged
    assert [it["iteration"] for it in progress.spikes(attempts)] == [150, 170]
    assert [it["iteration"] for it in progress.spikes(attempts, factor=14.0)] == [170]  # 30 >= 28 > 25
    lines = progress.status_lines(attempts, None, None)
    assert lines[-2:] == ["spike:     iteration 150: lm loss 25 (at least 10x the largest of the first 100)",
                          "spike:     iteration 170: lm loss -30 (at least 10x the largest of the first 100)"]
    many = {i: 2.0 if i <= 100 else 50.0 for i in range(1, 106)}
    lines = progress.status_lines(progress.parse("".join(megatron(i, 200, x) for i, x in many.items())), None, None)
    assert lines[-1] == "spikes:    5 in all, from iteration 101" and len([x for x in lines if "spike:" in x]) == 3


def test_the_plot_circles_the_spikes(tmp_path):
    """The red circles are there only where a spike is (the curves are blue and orange, the rest black or grey)."""
    import matplotlib.image

    from ultra3.plot import loss_png

    def red_pixels(spike: float) -> int:
        attempts = progress.parse("".join(megatron(i, 200, spike if i == 150 else 2.0) for i in range(1, 201)))
        loss_png(attempts, str(tmp_path / "loss.png"), "spike", progress.SPIKY_LOSS_FACTOR)
        rgb = matplotlib.image.imread(tmp_path / "loss.png")[..., :3]
        return int(((rgb[..., 0] > 0.8) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)).sum())

    assert red_pixels(25.0) > 50 and red_pixels(19.0) == 0  # 19 < 10 x 2.0: no spike


def test_a_data_prep_says_its_shards():
    pretrain = ("ultra3 data prep pretrain: 1 dataset(s), 16 shard(s) (13 to write, 3 done); tokenizer ...\n"
                "progress: 10 docs (5.0% of 200 records), 1.00k tokens, 1.00k tokens/s, 1.0 MB/s, shards 4/13, "
                "elapsed 0:00:01, ETA 0:00:19\n")  # a second attempt: 3 shards kept from the first, 4 of its 13 written
    assert progress.status_lines(progress.parse(pretrain), None, None) == ["progress:  shards 7 of 16"]
    sft = "write: 5 of 12 shard(s) kept from an earlier run\nwrite: 2/7 done, 40 packs\n"
    assert progress.status_lines(progress.parse(sft), None, None) == ["progress:  shards 7 of 12"]
    assert progress.status_lines(progress.parse("write: 2/12 done, 40 packs\n"), None, None) == [
        "progress:  shards 2 of 12"]


def test_a_log_being_written_is_read_to_its_last_whole_line():
    """A running job's log ends inside a line (`lm loss: 6.4` of 6.412724E+00), and an attempt killed mid-line
    leaves one glued in front of the next attempt's mark: neither is read as an iteration."""
    text = (SMOKE / "pretrain.log").read_text()
    cut = text[:text.index("lm loss: 6.412724E+00") + len("lm loss: 6.4")]  # iteration 36
    (growing,) = progress.parse(cut)
    assert growing.iterations[-1]["iteration"] == 35
    first, second = progress.parse(cut + mark(2, "2026-11-26T04:17:30+0000") + (SMOKE / "resume.log").read_text())
    assert [it["iteration"] for it in first.iterations] == list(range(1, 36))
    assert second.number == 2 and second.iterations[0]["iteration"] == 41


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


def test_status_plot_and_goodput_of_a_recorded_run(recorded, cli_here, tmp_path):
    """The commands read the registry and the job dir as a new shell does (run in this process, for speed)."""
    status = cli_here("jobs", "status", recorded.id, prog="nemotron")
    assert status.rc == 0, status.err
    assert "progress:  iteration 60 of 60 (100.0%), 122.88K tokens\n" in status.out
    assert "loss:      lm loss 6.305, validation 6.348 (iteration 60)\n" in status.out
    assert "attempts:  2" in status.out and "continue  stopped for the time limit with its work saved" in status.out
    shown = cli_here("jobs", "goodput", recorded.id, prog="nemotron")
    assert shown.rc == 0, shown.err
    assert shown.out.startswith(f"{recorded.id}: 2 attempt(s), goodput ")
    assert "attempt   1  continue  productive" in shown.out and "GPU-h" in shown.out
    png = tmp_path / "loss.png"
    plotted = cli_here("jobs", "plot", recorded.id, "-o", str(png), prog="nemotron")
    assert plotted.rc == 0 and plotted.out == f"wrote {png}\n", plotted.err
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 600 and image[..., :3].std() > 0.05  # drawn, not blank


def test_plot_of_a_running_job_defaults_to_the_working_directory(recorded, cli_here):
    """The log ends inside iteration 36's line: the curve stops at 35, and status says so."""
    log = Path(recorded.job_dir, "pretrain", "log-local.out")
    text = (SMOKE / "pretrain.log").read_text()
    log.write_text(text[:text.index("lm loss: 6.412724E+00") + len("lm loss: 6.4")])
    plotted = cli_here("jobs", "plot", recorded.id[:20], prog="nemotron")
    assert plotted.rc == 0 and plotted.out == f"wrote {recorded.id}-loss.png\n", plotted.err
    import matplotlib.image

    assert matplotlib.image.imread(f"{recorded.id}-loss.png")[..., :3].std() > 0.05
    status = cli_here("jobs", "status", recorded.id, prog="nemotron")
    assert "progress:  iteration 35 of 40 (87.5%), 71.68K tokens" in status.out


@pytest.mark.parametrize("log, args, said", [
    ("preflight ok\n", [], "its log has no training iteration yet (a pretrain job)"),
    (None, ["-o", "loss.pdf"], "-o loss.pdf: the plot is a PNG; give a path ending in .png"),
    (None, ["-o", "missing/loss.png"], "-o missing/loss.png: cannot write it (No such file or directory)"),
])
def test_plot_refuses_in_one_line(recorded, cli_here, log, args, said):
    if log is not None:
        Path(recorded.job_dir, "pretrain", "log-local.out").write_text(log)
    bad = cli_here("jobs", "plot", recorded.id, *args, prog="nemotron")
    assert bad.rc == 2 and len(bad.err_lines) == 1 and bad.err.startswith("error: ") and said in bad.err, bad.err
    assert bad.out == "" and list(Path.cwd().glob("**/*.p*")) == []  # nothing written


def test_plot_without_matplotlib_names_the_extra(recorded, cli_here, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` finds where it is not installed
    bad = cli_here("jobs", "plot", recorded.id, prog="nemotron")
    assert bad.rc == 2 and bad.err_lines == [
        "error: matplotlib is not installed; pip install 'ultra3-launcher[plot]'"]
