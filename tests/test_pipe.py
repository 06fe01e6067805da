"""`ultra3 pipe` without a cluster: the shipped chains compile whole, inputs are wired to the outputs of
earlier steps, every step's errors are listed before anything is written, and overrides reach one step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml


def written(home) -> list:
    return sorted(p for p in home.rglob("*") if p.is_file()) if home.exists() else []


def test_tiny_pipe_dry_run_wires_each_input_to_the_step_that_makes_it(cli, home):
    r = cli("pipe", "-c", "tiny", "--dry-run")
    assert r.rc == 0, r.err
    steps = re.findall(r"^  \d\. (\S+) +ultra3 ([a-z ]+) -c tiny  \[run as (\S+?)(?:, after (.+))?\]$", r.out, re.M)
    # each after the steps whose outputs it reads, and no other: data-sft reads nothing, so it waits for nothing
    assert [(s[0], s[1], s[3]) for s in steps] == [
        ("data-pretrain", "data prep pretrain", ""), ("pretrain", "pretrain", "data-pretrain"),
        ("data-sft", "data prep sft", ""), ("sft", "sft", "pretrain, data-sft"), ("eval-sft", "eval", "sft"),
        ("quantize", "quantize", "data-sft, sft"), ("eval-quantized", "eval", "quantize")]
    assert "critical path: data-pretrain -> pretrain -> sft -> quantize -> eval-quantized" in r.out
    ids = {s[0]: s[2] for s in steps}
    wired = dict(re.findall(r"^       (\S+) = (\S+)  \(from pipe step \S+ \(", r.out, re.M))
    assert wired["dataset.blend_path"].endswith(f"/{ids['data-pretrain']}/data/blend.json")
    assert wired["recipe.pretrained_checkpoint"].endswith(f"/{ids['pretrain']}/checkpoints")
    assert wired["dataset.packed_dir"].endswith(f"/{ids['data-sft']}/data")
    assert wired["bf16_checkpoint"].endswith(f"/{ids['sft']}/checkpoints")
    assert wired["calibration.path"] == wired["dataset.packed_dir"]  # quantize calibrates on sft's data
    # each eval scores the latest checkpoint before it: the SFT model, then its quantization
    evals = re.findall(r"^       checkpoint = (\S+)  \(from pipe step (\S+) ", r.out, re.M)
    assert [(path.split("/")[-2:], step) for path, step in evals] == [
        ([ids["sft"], "checkpoints"], "sft"), ([ids["quantize"], "nvfp4"], "quantize")]
    assert "dataset.mock = False  <- tiny.yaml [pretrain]" in r.out  # the pipe's own override, shown
    assert "== estimated cost ==" in r.out and "Dry run: nothing was written or submitted." in r.out
    assert written(home) == []


def test_an_override_reaches_one_step_and_explicit_values_beat_the_wiring(cli, home, tmp_path):
    mine = tmp_path / "ckpt"
    mine.mkdir()
    r = cli("pipe", "-c", "tiny", "--dry-run", "pretrain.train.train_iters=20",
            f"sft.recipe.pretrained_checkpoint={mine}")
    assert r.rc == 0, r.err
    assert "train.train_iters = 20  <- command line" in r.out
    assert r.out.count("train.train_iters = 20") == 1
    assert f"recipe.pretrained_checkpoint = {mine}  (set in command line)" in r.out


def test_every_steps_errors_are_listed_and_nothing_is_written(cli, home):
    r = cli("pipe", "-c", "tiny", "--dry-run", "pretrain.train.train_iters=-3", "quantize.calibration.samples=0")
    assert r.rc == 2
    assert any(line.startswith("error: pretrain: train.train_iters") for line in r.err_lines), r.err
    assert any(line.startswith("error: quantize: calibration.samples") for line in r.err_lines), r.err
    assert "Traceback" not in r.err and written(home) == []


@pytest.mark.parametrize("args, message", [
    (["nosuch.key=1"], "error: nosuch.key=1: a pipe override is STEP.key=value with STEP one of data-pretrain, "
                       "data-phase2, pretrain, data-long-context, long-context, data-sft, sft, quantize"),
    (["--from", "nope"], "error: --from nope: no such step; the pipe's steps are data-pretrain, data-phase2, "
                         "pretrain, data-sft, sft, quantize"),
    (["--from", "sfft"], "error: --from sfft: no such step; did you mean 'sft'? the pipe's steps are data-pretrain, "
                         "data-phase2, pretrain, data-sft, sft, quantize"),
    (["pretrian.train.train_iters=5"], "error: pretrian.train.train_iters=5: no step 'pretrian'; did you mean "
                                       "'pretrain'? a pipe override is STEP.key=value with STEP one of data-pretrain, "
                                       "data-phase2, pretrain, data-long-context, long-context, data-sft, sft, "
                                       "quantize"),
    (["-c", "tinny"], "error: --config: no config 'tinny' for this stage; did you mean 'tiny'? choose one of: default, "
                      "from_release, post_training, tiny, or give a path"),
    (["--from", "sft", "--to", "pretrain"], "error: --to pretrain comes before --from sft"),
    (["-c", "nope"], "error: --config: no config 'nope' for this stage; choose one of: default, from_release, "
                     "post_training, tiny, or give a path"),
])
def test_bad_pipe_arguments_are_one_line(cli, home, args, message):
    r = cli("pipe", *args, "--dry-run")
    assert r.rc == 2 and r.err_lines == [message], r.err


def test_from_a_step_needs_the_earlier_steps_it_waits_for_completed(cli, home):
    r = cli("pipe", "-c", "tiny", "--dry-run", "--from", "sft")
    assert r.rc == 2
    assert r.err_lines == [f"error: {step}: --from sft: this earlier step has no completed run of this config; start "
                           "from it or leave --from out" for step in ("pretrain", "data-sft")], r.err


def test_a_pipe_config_names_known_stages(cli, home, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"stages": {"one": {"stage": "pretrian", "config": "tiny"}}}))
    r = cli("pipe", "-c", str(bad), "--dry-run")
    assert r.rc == 2 and r.err_lines == ["error: bad.yaml stages.one.stage: no stage 'pretrian'"], r.err


def test_a_required_input_with_nothing_to_take_names_the_stage_to_run(cli, home):
    r = cli("pretrain", "-c", "tiny", "dataset.mock=false", "--dry-run")
    assert r.rc == 2
    line = next(line for line in r.err_lines if line.startswith("error: dataset.blend_path"))
    assert "no pretrain-data artifact for this machine in " in line
    assert "run `ultra3 data prep pretrain -c tiny` first, or set dataset.blend_path=PATH (or job:ID, NAME:latest) " \
           "(not needed when dataset.mock is set)" in line
    batch = cli("sft", "--batch", "ci", "--dry-run", "dataset.mock=true")
    assert batch.rc == 2
    assert any("no pretrain-checkpoint artifact for profile 'ci'" in line and
               "run `ultra3 pretrain --batch ci` first" in line for line in batch.err_lines), batch.err


@pytest.mark.heavy
def test_on_this_machine_a_failed_step_stops_only_what_waits_for_it(cli, home, tmp_path):
    """Local executor: data prep runs and publishes, pretrain stops in its preflight (no GPU here), the independent
    data-sft still runs, and the pipe exits with the failed step's code, naming the command that resumes it."""
    pipe = tmp_path / "two.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {
        "data": {"stage": "data prep pretrain", "config": "tiny", "overrides": {"sample": 20}},
        "pretrain": {"stage": "pretrain", "config": "tiny", "overrides": {"dataset.mock": False}},
        "data-sft": {"stage": "data prep sft", "config": "tiny"}}}, sort_keys=False))
    r = cli("pipe", "-c", str(pipe))
    assert r.rc == 3, r.out[-3000:] + r.err  # the preflight's exit code
    assert re.search(r"^published ultra3-pretrain-data-tiny-sample-20:v1 -> ", r.out, re.M), r.out[-3000:]
    assert re.search(r"^input data: dataset.blend_path = \S+/sample-20/blend.json  \(from pipe step data ", r.out, re.M)
    assert re.search(r"error: pipe step pretrain \(\S+\) FAILED: PREFLIGHT FAILED on \S+: .*\. Fix it, then "
                     rf"`ultra3 pipe -c {pipe}` again resumes \(completed steps are skipped\), --from pretrain starts "
                     r"at it, --force re-runs every step; `nemotron jobs status pipe-two_\S+` shows every step$",
                     r.err), r.err
    assert "== data-sft" in r.out and re.search(r"^published ultra3-sft-data-tiny:v1 -> ", r.out, re.M), r.out[-3000:]
    again = cli("pipe", "-c", str(pipe))  # resumes where it stopped: the data steps are not redone
    assert again.rc == 3 and re.search(r"^data: skipped, done by ultra3-data-prep-pretrain_\S+ "
                                       r"\(ultra3-pretrain-data-tiny-sample-20:v1\)$", again.out, re.M), again.out
    assert re.search(r"^data-sft: skipped, done by ", again.out, re.M), again.out


def sft_data_done(tmp_path) -> Path:
    """`data prep sft -c tiny` as completed on this machine: its packed dir and its artifact, published with the
    config's digest (a pipe skips that step)."""
    from recipes.contract import artifact_name, publish
    from ultra3.compile import compile_job
    from ultra3.job import Options
    from ultra3.stages import find_stage

    done = compile_job(find_stage("data prep sft"), Options(config="tiny"))
    packed = tmp_path / "packed"
    packed.mkdir()  # what `data prep sft -c tiny` leaves: its metadata at the tiny pack size
    (packed / "metadata.json").write_text('{"format": "ultra3-sft-packed-parquet/1", "pack_size": 512}')
    publish(done.store.root, {"format": 1, "name": artifact_name("sft-data", "tiny"), "type": "sft-data",
                                        "path": str(packed), "producer": "ultra3-data-prep-sft_20260101-000000-aaaaaa",
                                        "profile": None, "config_digest": done.digest, "config": "tiny",
                                        "stage": "data prep sft", "created_ts": 1.0, "inputs": [], "metadata": {}})
    return packed


def test_a_skipped_step_keeps_the_edge_to_the_step_whose_output_is_consumed(cli, home, tmp_path):
    """data-sft already done (its digest in the store): sft still waits for pretrain, whose checkpoint it reads."""
    packed = sft_data_done(tmp_path)
    r = cli("pipe", "-c", "tiny", "--dry-run")
    assert r.rc == 0, r.err
    assert re.search(r"^  3\. data-sft +ultra3 data prep sft -c tiny  \[skip: done by "
                     r"ultra3-data-prep-sft_20260101-000000-aaaaaa \(ultra3-sft-data-tiny:v1\)", r.out, re.M), r.out
    assert re.search(r"^  4\. sft +ultra3 sft -c tiny  \[run as \S+, after pretrain\]$", r.out, re.M), r.out
    assert f"dataset.packed_dir = {packed}  (from ultra3-data-prep-sft_20260101-000000-aaaaaa completed" in r.out


def test_a_failed_local_pipe_names_its_id_and_status_shows_every_step(cli, home, tmp_path):
    """pretrain stops in its preflight (no GPU here), data-sft is skipped (done), sft never starts: the pipe's id is
    printed first and in the error, and `jobs status PIPE` lists all three steps, each with why."""
    sft_data_done(tmp_path)
    pipe = tmp_path / "three.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {"pretrain": {"stage": "pretrain", "config": "tiny"},
                                               "data-sft": {"stage": "data prep sft", "config": "tiny"},
                                               "sft": {"stage": "sft", "config": "tiny"}}}, sort_keys=False))
    r = cli("pipe", "-c", str(pipe))
    assert r.rc == 3, r.out + r.err
    pipe_id = re.search(r"^pipe: (pipe-three_\S+)$", r.out, re.M).group(1)
    assert r.err_lines[-1].startswith("error: pipe step pretrain (") and \
        r.err_lines[-1].endswith(f"; `nemotron jobs status {pipe_id}` shows every step"), r.err
    status = cli("jobs", "status", pipe_id, prog="nemotron")
    assert status.rc == 0, status.err
    rows = status.out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["pretrain", "data-sft", "sft"], status.out
    assert re.fullmatch(r"  pretrain  ultra3-pretrain_\S+ +- +FAILED", rows[0]), status.out
    assert re.fullmatch(r"  data-sft  - +- +SKIPPED \(done by ultra3-data-prep-sft_20260101-000000-aaaaaa\)", rows[1])
    assert re.fullmatch(r"  sft       - +after pretrain  NOT RUN \(waits for pretrain, which failed\)", rows[2])
    assert len({row.rindex(" - ") for row in rows[:2]}) == 1, status.out  # the JOB column is as wide as its widest


def test_a_step_that_declares_no_output_is_not_replaced_by_an_older_artifact(cli, home, tmp_path):
    pipe = tmp_path / "nosave.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {
        "pretrain": {"stage": "pretrain", "config": "tiny", "overrides": {"checkpoint.save": None}},
        "sft": {"stage": "sft", "config": "tiny"}}}))
    r = cli("pipe", "-c", str(pipe), "--dry-run")
    assert r.rc == 2
    assert "error: sft: recipe.pretrained_checkpoint: step pretrain declares no output for it (its output key, e.g. " \
           "checkpoint.save, is unset); set that, or set sft.recipe.pretrained_checkpoint" in r.err_lines, r.err


def test_the_shipped_post_training_pipe_fits_whole_nvlink_segments_on_gb200(cli_here, home):
    """Four distinct MOPD teachers (the SWE teacher is left out of the pipe): 224 nodes, 14 segments of 16."""
    judge, box = "judges.genrm_model=/lustre/genrm", "sandbox.image=/lustre/sandbox.sqsh"
    r = cli_here("pipe", "-c", "post_training", "--batch", "gb200", "--env-file",
                 str(Path(__file__).resolve().parents[1] / "env.toml.example"), "--dry-run", "--full",
                 "rlvr1.policy=/lustre/sft", "rlvr2.policy=/lustre/sft",
                 *(f"{step}.{judge}" for step in ("rlvr1", "rlvr2", "ifbench", "rlhf", "reasoning", "mopd")),
                 *(f"{step}.{box}" for step in ("rlvr1", "rlvr2", "reasoning", "mopd")))
    assert r.rc == 0, r.err
    assert "#SBATCH --nodes=224\n" in r.out
