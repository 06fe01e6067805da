"""Pretraining in two phases on one schedule, and a blend mixed in: the dry run's accounting and refusals, which
phase a start trains (read from the checkpoint it resumes, by the runtime's own plan), the launcher starting phase 2
in the same allocation once phase 1 has saved at the switch, and the mixed blend file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipes.contract import checkpoint_iteration, next_phase, phase2_start
from recipes.training import blend_mix, plan
from ultra3.lr_schedule import lr_at

ROOT = Path(__file__).resolve().parents[1]


def compiled(out: str) -> dict:
    return yaml.safe_load(out.split("== compiled config ==\n", 1)[1].split("\n== ", 1)[0])


def blend(folder: Path, *names: str) -> str:
    """A blend.json over empty shards, as `ultra3 data prep pretrain` writes one."""
    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for n, name in enumerate(names, 1):
        for ext in ("bin", "idx"):
            (folder / f"{name}.{ext}").write_bytes(b"")
        pairs += [float(n), str(folder / name)]
    (folder / "blend.json").write_text(json.dumps({"train": pairs, "valid": pairs[:2], "test": []}))
    return str(folder / "blend.json")


@pytest.fixture
def two_blends(home) -> tuple[str, str]:
    return blend(home / "data" / "one", "a", "b"), blend(home / "data" / "two", "c")


@pytest.fixture
def tiny(cli_here, home, two_blends) -> dict:
    """The tiny pretrain's config as the job receives it, on the two real blends."""
    one, two = two_blends
    shown = cli_here("pretrain", "-c", "tiny_phases", "--dry-run", "--full", "dataset.mock=false",
                     f"dataset.blend_path={one}", f"phase2.blend_path={two}")
    assert shown.rc == 0, shown.err
    cfg = compiled(shown.out)
    job_dir = home / "jobs" / "ultra3-pretrain_20261128-120000-aaaaaa"
    job_dir.mkdir(parents=True)
    cfg["job"].update(id=job_dir.name, dir=str(job_dir), artifacts_root=str(home / "artifacts"),
                      checks=["python_version", "inputs"])  # not the GPU and package checks: no GPU here
    cfg["checkpoint"]["save"] = cfg["job"]["produces"][0]["path"] = str(job_dir / "checkpoints")
    return cfg


def test_the_dry_run_accounts_for_each_phase_on_one_schedule(cli_here, two_blends):
    one, two = two_blends
    shown = cli_here("pretrain", "-c", "tiny_phases", "--dry-run", "dataset.mock=false", f"dataset.blend_path={one}",
                     f"phase2.blend_path={two}")
    assert shown.rc == 0, shown.err
    table = shown.out.split("== phases ==\n", 1)[1].split("\n\n", 1)[0]
    assert table.splitlines() == [
        "phase 1  iterations 0-30: 61.44K tokens, LR 0 -> 0.00025",
        f"  blend  {one} (dataset.data_config=tiny)",
        "phase 2  iterations 30-40: 20.48K tokens, LR 0.00025 -> 2.5e-06",
        f"  blend  {two} (phase2.data_config=tiny_phase2)"]


def test_the_default_run_switches_where_the_wsd_decay_begins(cli_here):
    """15T of 20T: phase 2 starts at the iteration the WSD anneal over the last 5T starts (one past it: rounded up)."""
    shown = cli_here("pretrain", "--dry-run", "--full", "--batch", "blackwell",
                     "dataset.blend_path=/lustre/a/blend.json", "phase2.blend_path=/lustre/b/blend.json")
    assert shown.rc == 0, shown.err
    cfg = compiled(shown.out)
    start = phase2_start(cfg)
    assert start == 596047 and cfg["scheduler"]["lr_decay_iters"] - cfg["scheduler"]["lr_wsd_decay_iters"] == start - 1
    assert lr_at(cfg, start - 1) == 2.5e-4 and lr_at(cfg, start) < 2.5e-4
    assert lr_at(cfg, 794728) == pytest.approx(2.5e-6)
    assert "phase 2  iterations 596,047-794,728: 5.00T tokens, LR 0.000249 -> 2.5e-06" in shown.out


@pytest.mark.parametrize("override, message", [
    ("phase2.start_tokens=81920", "phase2.start_tokens: 81.92K tokens is iteration 40, at or past the run's end "
                                  "(train.train_iters=40, 81.92K tokens); use fewer than 81,920, or "
                                  "phase2.start_tokens=null for one blend"),
    ("phase2.start_tokens=-5", "phase2.start_tokens: phase2.start_tokens=-5 must be a positive token count"),
    ("checkpoint.save=null", "phase2.start_tokens: phase 2 starts from the checkpoint phase 1 saves at the switch: "
                             "set checkpoint.save"),
    ("dataset.mix.share=1.5", "dataset.mix.share: 1.5 must be a fraction between 0 and 1"),
    ("scheduler.lr_decay_iters=35", "scheduler.lr_decay_iters: 35: a run in phases decays over the whole run "
                                    "(train.train_iters=40: Megatron-Bridge's scheduler.max_steps in both phases"),
])
def test_a_switch_outside_the_run_is_refused(cli_here, override, message):
    shown = cli_here("pretrain", "-c", "tiny_phases", "--dry-run", override)
    assert shown.rc == 2 and message in shown.err and "Traceback" not in shown.err, shown.err


def test_an_unprepared_phase_blend_names_its_data_prep_command(cli_here, two_blends):
    phase1 = f"dataset.blend_path={two_blends[0]}"
    shown = cli_here("pretrain", "-c", "tiny_phases", "--dry-run", "dataset.mock=false", phase1)
    assert shown.rc == 2
    assert "phase2.blend_path: no pretrain-data artifact for this machine" in shown.err
    assert "run `ultra3 data prep pretrain -c tiny_phase2` first" in shown.err
    assert "(not needed when dataset.mock is set or phase2.start_tokens=null)" in shown.err
    one = cli_here("pretrain", "-c", "tiny_phases", "-d", "dataset.mock=false", phase1, "phase2.start_tokens=null")
    assert one.rc == 0 and "== phases ==" not in one.out, one.err


def test_each_start_trains_the_phase_its_checkpoint_stands_in(tiny, two_blends):
    save = Path(tiny["checkpoint"]["save"])
    first = plan.make_plan(tiny)
    assert (first.phase.number, first.phase.last, first.blend_path) == (1, 30, two_blends[0])
    assert {"train.train_iters=30", "scheduler.max_steps=40", "scheduler.lr_decay_iters=40"} <= set(first.overrides)
    assert not next_phase(tiny)
    for step in (20, 30):  # a save before the switch resumes phase 1; the save at the switch starts phase 2
        (save / f"iter_{step:07d}").mkdir(parents=True)
        (save / "latest_checkpointed_iteration.txt").write_text(str(step))
        assert plan.make_plan(tiny).phase.number == (1 if step < 30 else 2)
        assert next_phase(tiny) is (step == 30)
    second = plan.make_plan(tiny)
    assert (second.phase.first, second.phase.last, second.blend_path) == (30, 40, two_blends[1])
    assert {"train.train_iters=40", "scheduler.max_steps=40", f"checkpoint.load='{save}'"} <= set(second.overrides)
    (save / "latest_checkpointed_iteration.txt").write_text("40")
    assert not next_phase(tiny)  # done: nothing follows


def test_the_launcher_starts_phase_2_in_the_same_allocation(tiny, tmp_path):
    """recipes/launch.py on the job's config: phase 1 ends with its save at the switch, phase 2 starts at once in
    fresh processes, and the attempt ends done with the checkpoint at train.train_iters, published once."""
    tiny["job"].update(recipe="phase_trainer", launch="torchrun")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    env.pop("SLURM_JOB_ID", None)
    done = subprocess.run([sys.executable, "-m", "recipes.launch", "--config", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("trainer:", "ultra3: phase", "published"))]
    blend_one, blend_two = tiny["dataset"]["blend_path"], tiny["phase2"]["blend_path"]
    assert lines[:3] == [
        f"trainer: phase 1 of 2: iterations 0-30 on {blend_one}; train.train_iters=30 scheduler.max_steps=40",
        "ultra3: phase 1 ended at iteration 30; phase 2 starts in this allocation",
        f"trainer: phase 2 of 2: iterations 30-40 on {blend_two}; train.train_iters=40 scheduler.max_steps=40"]
    assert len(lines) == 4 and lines[3].startswith("published ultra3-pretrain-checkpoint-tiny_phases:v1")
    assert checkpoint_iteration(tiny["checkpoint"]["save"]) == 40


def test_a_mixed_blend_gives_the_other_its_share_of_every_split(home):
    own, other = blend(home / "lc", "long1", "long2"), blend(home / "p2", "web")
    mixed = blend_mix.mix(own, other, 0.54)
    train = mixed["train"]
    assert train[1::2] == [str(home / "lc" / "long1"), str(home / "lc" / "long2"), str(home / "p2" / "web")]
    assert sum(train[0:4:2]) == pytest.approx(0.46) and train[4] == pytest.approx(0.54)
    assert train[0] * 2 == pytest.approx(train[2])  # its own proportions kept
    assert mixed["test"] == []
    (home / "bad.json").write_text('{"train": [1.0]}')
    with pytest.raises(blend_mix.BlendError, match="not a per-split blend"):
        blend_mix.mix(own, str(home / "bad.json"), 0.5)


def test_the_long_context_phase_at_1m_on_the_reports_layout(cli_here, gb200):
    """From phase 2's checkpoint (weights only), 46% long documents + 54% phase 2, 1M context on CP32 TP8 EP128 PP2:
    the dry run checks and sizes it right at 1M."""
    shown = cli_here("pretrain", "-c", "long_context", "--batch", "gb200", "--dry-run", "--full",
                     "dataset.blend_path=/lustre/data/long/blend.json",
                     "dataset.mix.blend_path=/lustre/data/phase2/blend.json",
                     "recipe.pretrained_checkpoint=/lustre/ckpt/pretrain")
    assert shown.rc == 0, shown.err
    assert "TP · PP · CP  8 · 2 · 32 = 512" in shown.out and "DP            1" in shown.out
    assert "tokens per iteration  25,165,824 (1,048,576 seq_length x 24 global batch)" in shown.out
    assert "total tokens          32.99B" in shown.out and "2.5e-06 peak -> 2.5e-06 min" in shown.out
    memory = shown.out.split("== memory ==\n", 1)[1].split("\n\n", 1)[0]
    assert "32,768 tokens per CP rank" in memory and "per GPU of 186 GiB gb200 HBM" in memory
    cfg = compiled(shown.out)
    cfg["job"].update(dir="/jobs/lc", id="ultra3-pretrain_20261128-130000-cccccc")
    p = plan.make_plan(cfg)
    assert (p.phase.of, p.blend_path) == (1, "/lustre/data/long/blend.json")
    assert p.mix == ("/lustre/data/phase2/blend.json", 0.54)
    assert {"checkpoint.pretrained_checkpoint='/lustre/ckpt/pretrain'", "model.context_parallel_size=32",
            "model.seq_length=1048576", "train.train_iters=1311"} <= set(p.overrides)


def test_the_long_context_phase_takes_phase_2s_checkpoint_and_names_the_commands(cli_here, gb200):
    shown = cli_here("pretrain", "-c", "long_context", "--batch", "gb200", "--dry-run")
    assert shown.rc == 2
    assert "run `ultra3 data prep pretrain -c long_context --batch gb200` first" in shown.err
    assert "run `ultra3 data prep pretrain -c phase2 --batch gb200` first" in shown.err
    assert "recipe.pretrained_checkpoint: no pretrain-checkpoint artifact for profile 'gb200'" in shown.err
    assert "run `ultra3 pretrain --batch gb200` first" in shown.err


def test_the_default_pipe_is_the_report_run_with_both_phases(cli_here):
    shown = cli_here("pipe", "--batch", "blackwell", "--dry-run")
    assert shown.rc == 0, shown.err
    assert "  long-context: left out; set data-long-context.datasets=... to run it\n" in shown.out
    graph = shown.out.split("== graph", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [" ".join(line.split()) for line in graph] == [
        "* data-pretrain", "data-phase2", "* pretrain <- data-pretrain, data-phase2", "data-sft",
        "* sft <- pretrain, data-sft", "* quantize <- data-sft, sft",
        "critical path: data-pretrain -> pretrain -> sft -> quantize (no estimate for data-pretrain, quantize)"]
    step = shown.out.split("3. pretrain", 1)[1].split("4. data-sft", 1)[0]
    assert "phase 1  iterations 0-596,047: 15.00T tokens" in step and "phase 2  iterations 596,047-794,728" in step
    assert "(phase2.data_config=phase2)" in step and "from pipe step data-phase2" in step


def test_naming_a_long_document_corpus_adds_the_long_context_phase(cli_here):
    shown = cli_here("pipe", "--batch", "blackwell", "--dry-run",
                     "data-long-context.datasets=[{name: books, path: /lustre/books, weight: 1}]")
    assert shown.rc == 0, shown.err
    assert "left out" not in shown.out
    graph = [" ".join(line.split()) for line in shown.out.split("== graph", 1)[1].split("\n\n", 1)[0].splitlines()]
    assert "* long-context <- data-phase2, pretrain, data-long-context" in graph
    assert "* sft <- long-context, data-sft" in graph  # SFT starts from the long-context checkpoint


@pytest.mark.parametrize("when, message", [
    ("data-sft", "stages.sft.when: must be STEP.KEY"),
    ("nope.datasets", "stages.sft.when: no step 'nope'"),
])
def test_a_bad_when_is_refused_in_one_line(cli_here, tmp_path, when, message):
    pipe = tmp_path / "p.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {"data-sft": {"stage": "data prep sft", "config": "tiny"},
                                               "sft": {"stage": "sft", "config": "tiny", "when": when}}}))
    shown = cli_here("pipe", "-c", str(pipe), "--dry-run")
    assert shown.rc == 2 and message in shown.err and len(shown.err.strip().splitlines()) == 1, shown.err
