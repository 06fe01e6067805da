"""`--fork RUN[@ITERATION]`: a new training run from another run's checkpoint, against a real source job's
registry record, config.yaml and checkpoint dir (iter_* directories as Megatron-Bridge writes them)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from ultra3 import records

SOURCE = "ultra3-pretrain_20261128-101500-abc123"


@pytest.fixture
def source(home, cli_here) -> Path:
    """A tiny pretrain run that saved iterations 20 and 40 (and left an unfinished save, no iter_ name of its own):
    its config.yaml the one the launcher compiles."""
    job_dir = home / "experiments" / SOURCE
    save = job_dir / "checkpoints"
    for name in ("iter_0000020", "iter_0000040", "iter_0000060.tmp"):
        (save / name).mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("40")
    (job_dir / "pretrain" / "code").mkdir(parents=True)
    config = compiled(cli_here("pretrain", "-c", "tiny", "--dry-run").out)
    config["job"].update(id=SOURCE, dir=str(job_dir))
    config["checkpoint"]["save"] = str(save)
    (job_dir / "pretrain" / "code" / "config.yaml").write_text(yaml.safe_dump(config))
    records.save(records.JobRecord(id=SOURCE, stage="pretrain", config="tiny", executor="local", mode="local",
                                   submitted=time.time(), job_dir=str(job_dir), task="pretrain",
                                   log_glob="pretrain/log-local.out", handle={"pid": None, "started": None}))
    return save


def compiled(out: str) -> dict:
    return yaml.safe_load(out.split("== compiled config ==\n", 1)[1].split("\n== ", 1)[0])


def test_a_fork_loads_the_iteration_and_says_what_changed(cli_here, source):
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--fork", f"{SOURCE}@20", "optimizer.lr=1e-5",
                     "scheduler.lr_wsd_decay_iters=20")
    assert shown.rc == 0, shown.err
    config = compiled(shown.out)
    assert config["checkpoint"]["load"] == str(source) and config["checkpoint"]["ckpt_step"] == 20
    assert config["checkpoint"]["save"] != str(source)  # its own: ${job.dir}/checkpoints
    # a changed schedule must override the one saved in the checkpoint, which Megatron-Core would otherwise keep
    assert config["scheduler"]["override_opt_param_scheduler"] is True
    assert config["scheduler"]["use_checkpoint_opt_param_scheduler"] is False
    fork = config["job"]["fork"]
    assert (fork["from"], fork["iteration"], fork["path"]) == (SOURCE, 20, str(source))
    assert fork["changed"] == {"optimizer.lr": 1e-5, "scheduler.lr_wsd_decay_iters": 20}
    assert f"(forked from {SOURCE} at iteration 20, changed: " in shown.out
    assert f"<- fork {SOURCE}@20 (command line)" in shown.out


def test_the_newest_iteration_by_default(cli_here, source):
    for ref in (SOURCE, f"{SOURCE}@latest", "20261128-101500"):  # a unique prefix of the id, as `nemotron jobs`
        shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--fork", ref)
        assert shown.rc == 0, shown.err
        assert compiled(shown.out)["checkpoint"]["ckpt_step"] == 40
        assert "override_opt_param_scheduler" not in json.dumps(compiled(shown.out).get("scheduler"))


@pytest.mark.parametrize("args, said", [
    ((f"--fork={SOURCE}@30",), f"fork: {SOURCE} has no checkpoint at iteration 30; it has 20, 40 (in "),
    (("--fork=nosuch@20",), "fork: no job 'nosuch' in "),
    ((f"--fork={SOURCE}@x",), f"fork: '{SOURCE}@x' is not RUN or RUN@ITERATION (set in command line)"),
    ((f"--fork={SOURCE}", "checkpoint.ckpt_step=20"), "checkpoint.ckpt_step: set in command line beside fork="),
])
def test_a_bad_fork_is_one_line(cli_here, source, args, said):
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", *args)
    assert bad.rc == 2 and len(bad.err_lines) == 1 and bad.err_lines[0].startswith(f"error: {said}"), bad.err


def test_a_fork_of_another_stage_or_of_nothing_saved_is_refused(cli_here, source):
    bad = cli_here("sft", "-c", "tiny", "--dry-run", "--fork", SOURCE)
    assert bad.rc == 2 and f"fork: {SOURCE} (pretrain) has no checkpoint dir" in bad.err, bad.err
    for path in source.glob("iter_*"):
        path.rmdir()
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", "--fork", SOURCE)
    assert bad.rc == 2 and f"{SOURCE} saved no checkpoint in {source} yet" in bad.err, bad.err


def test_a_forked_job_says_so_in_its_manifest_and_lineage(cli, source):
    ran = cli("pretrain", "-c", "tiny", "--fork", f"{SOURCE}@20", "optimizer.lr=1e-5")  # stops in its preflight here
    job_id = ran.out.split()[1]
    job_dir = Path(ran.out.split("job dir: ", 1)[1].split()[0])
    manifest = json.loads((job_dir / "pretrain" / "code" / "manifest.json").read_text())
    assert manifest["fork"] == {"from": SOURCE, "iteration": 20, "path": str(source),
                                "changed": {"optimizer.lr": 1e-5}}
    lineage = cli("jobs", "lineage", job_id, prog="nemotron")
    assert lineage.rc == 0, lineage.err
    assert f"  forked from {SOURCE} at iteration 20, changed: optimizer.lr=1e-05\n" in lineage.out
