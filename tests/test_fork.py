"""`--fork RUN[@ITERATION]`: a new training run from another run's checkpoint, against a real source job's
registry record, config.yaml and checkpoint dir (iter_* directories as Megatron-Bridge writes them)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from recipes.publish import record_outputs
from recipes.training import plan
from test_ssh import PORT, sshd  # noqa: F401  (the SSH tests' sshd on 127.0.0.1, a fixture)
from ultra3 import records

SOURCE = "ultra3-pretrain_20261128-101500-abc123"


def make_source(cli_here, home: Path, job_id: str, stage: str, *overrides: str, job_dir: Path | None = None,
                handle: dict | None = None) -> Path:
    """A tiny run that saved iterations 20 and 40 (and left an unfinished save, no iter_ name of its own): its
    config.yaml the one the launcher compiles; run here, or (a handle) submitted to Slurm. Returns its checkpoint
    dir."""
    job_dir = job_dir or home / "experiments" / job_id
    save = job_dir / "checkpoints"
    for name in ("iter_0000020", "iter_0000040", "iter_0000060.tmp"):
        (save / name).mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("40")
    (job_dir / stage / "code").mkdir(parents=True)
    shown = cli_here(stage, "-c", "tiny", "--dry-run", "--full", *overrides)
    assert shown.rc == 0, shown.err
    config = compiled(shown.out)
    config["job"].update(id=job_id, dir=str(job_dir))
    config["checkpoint"]["save"] = str(save)
    (job_dir / stage / "code" / "config.yaml").write_text(yaml.safe_dump(config))
    records.save(records.JobRecord(id=job_id, stage=stage, config="tiny", executor="slurm" if handle else "local",
                                   mode="detached" if handle else "local", submitted=time.time(),
                                   job_dir=str(job_dir), task=stage, log_glob=f"{stage}/log-local.out",
                                   handle=handle or {"pid": None, "started": None}))
    return save


@pytest.fixture
def source(home, cli_here) -> Path:
    return make_source(cli_here, home, SOURCE, "pretrain")


def compiled(out: str) -> dict:
    return yaml.safe_load(out.split("== compiled config ==\n", 1)[1].split("\n== ", 1)[0])


def test_a_fork_loads_the_iteration_and_says_what_changed(cli_here, source):
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "--fork", f"{SOURCE}@20", "optimizer.lr=1e-5",
                     "scheduler.lr_wsd_decay_iters=20")
    assert shown.rc == 0, shown.err
    config = compiled(shown.out)
    assert config["checkpoint"]["load"] == str(source) and config["checkpoint"]["ckpt_step"] == 20
    assert config["checkpoint"]["save"] != str(source)  # its own: ${job.dir}/checkpoints
    # a changed schedule overrides the one saved in the checkpoint (Megatron-Core would keep it, or refuse the change)
    assert config["scheduler"]["override_opt_param_scheduler"] is True
    assert config["scheduler"]["use_checkpoint_opt_param_scheduler"] is False
    fork = config["job"]["fork"]
    assert (fork["from"], fork["iteration"], fork["path"]) == (SOURCE, 20, str(source))
    assert fork["changed"] == {"optimizer.lr": 1e-5, "scheduler.lr_wsd_decay_iters": 20}
    assert f"(forked from {SOURCE} at iteration 20, changed: " in shown.out
    assert f"<- fork {SOURCE}@20 (command line)" in shown.out


def test_the_newest_iteration_by_default(cli_here, source):
    for ref in (SOURCE, f"{SOURCE}@latest", "20261128-101500"):  # a unique prefix of the id, as `nemotron jobs`
        shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "--fork", ref)
        assert shown.rc == 0, shown.err
        assert compiled(shown.out)["checkpoint"]["ckpt_step"] == 40
        assert "override_opt_param_scheduler" not in json.dumps(compiled(shown.out).get("scheduler"))
        assert "changed: nothing" in shown.out and "warning: fork" not in shown.out


@pytest.mark.parametrize("args, said", [
    ((f"--fork={SOURCE}@30",), f"fork: {SOURCE} has no checkpoint at iteration 30; it has 20, 40 (in "),
    (("--fork=nosuch@20",), "fork: no job 'nosuch' in "),
    ((f"--fork={SOURCE}@x",), f"fork: '{SOURCE}@x' is not RUN or RUN@ITERATION (set in command line)"),
    ((f"--fork={SOURCE}", "checkpoint.ckpt_step=20"), "checkpoint.ckpt_step: set in command line beside fork="),
    ((f"--fork={SOURCE}", "optimizer.lr=1e-5", "scheduler.use_checkpoint_opt_param_scheduler=true"),
     "scheduler.use_checkpoint_opt_param_scheduler: True (set in command line) keeps the schedule saved at iteration "
     "40, so the fork's optimizer.lr would be ignored or refused by Megatron-Core; leave it unset"),
])
def test_a_bad_fork_is_one_line(cli_here, source, args, said):
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", *args)
    assert bad.rc == 2 and len(bad.err_lines) == 1 and bad.err_lines[0].startswith(f"error: {said}"), bad.err


def test_a_fork_never_saves_into_its_source(cli_here, source):
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "--fork", SOURCE, f"checkpoint.save={source}/")
    assert bad.rc == 2 and bad.err_lines == [
        f"error: checkpoint.save: {source} (set in command line) is {SOURCE}'s own checkpoint dir; a fork saves to "
        "its own: leave checkpoint.save to the config, or give another dir"], bad.err


def test_a_fork_of_another_stage_or_of_nothing_saved_is_refused(cli_here, source):
    bad = cli_here("sft", "-c", "tiny", "--dry-run", "--full", "--fork", SOURCE)
    assert bad.rc == 2 and bad.err_lines == [
        f"error: fork: {SOURCE} is a pretrain run, not sft; fork a sft run (sft starts from a pretrain checkpoint "
        f"with recipe.pretrained_checkpoint=job:{SOURCE})"], bad.err
    for path in source.glob("iter_*"):
        path.rmdir()
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "--fork", SOURCE)
    assert bad.rc == 2 and f"{SOURCE} saved no checkpoint in {source} yet" in bad.err, bad.err


def test_a_fork_trains_on_its_source_data_unless_given(cli_here, home, source):
    """Unset, the data input is the source's, not the store's newest (here there is none: without the source's,
    the dry run would stop); the source's own starting checkpoint (SFT) is replaced by the fork, not a change."""
    data = home / "data"
    data.mkdir()
    for ext in ("bin", "idx"):
        (data / f"shard.{ext}").write_bytes(b"")
    (data / "blend.json").write_text(json.dumps({"train": [1.0, str(data / "shard")]}))
    blend = str(data / "blend.json")
    make_source(cli_here, home, "ultra3-pretrain_20261128-111500-def456", "pretrain", "dataset.mock=false",
                f"dataset.blend_path={blend}")
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "dataset.mock=false", "--fork", "20261128-1115")
    assert shown.rc == 0, shown.err
    assert compiled(shown.out)["dataset"]["blend_path"] == blend
    assert f"dataset.blend_path = {blend}  (set in fork 20261128-1115 (command line): " \
           "ultra3-pretrain_20261128-111500-def456's input)" in shown.out
    assert "changed: nothing" in shown.out

    pretrained = home / "pretrained"
    (pretrained / "iter_0000001").mkdir(parents=True)
    (pretrained / "latest_checkpointed_iteration.txt").write_text("1")
    sft = "ultra3-sft_20261128-121500-0a0b0c"
    make_source(cli_here, home, sft, "sft", f"recipe.pretrained_checkpoint={pretrained}")
    shown = cli_here("sft", "-c", "tiny", "--dry-run", "--full", "--fork", f"{sft}@20", "optimizer.lr=1e-6")
    assert shown.rc == 0, shown.err
    config = compiled(shown.out)
    assert config["recipe"]["pretrained_checkpoint"] is None and config["job"]["fork"]["changed"] == {
        "optimizer.lr": 1e-6}
    assert "recipe.pretrained_checkpoint: not needed (checkpoint.load is set)" in shown.out


def test_a_fork_of_another_config_warns_that_every_difference_is_a_change(cli_here, source):
    Path("tiny-low-lr.yaml").write_text("defaults: [tiny]\noptimizer:\n  lr: 1.0e-5\n")
    shown = cli_here("pretrain", "-c", "tiny-low-lr.yaml", "--dry-run", "--full", "--fork", SOURCE)
    assert shown.rc == 0, shown.err
    assert f"warning: fork: {SOURCE} ran config 'tiny', this run 'tiny-low-lr': each of the 1 keys that differ is a " \
           "change; give -c tiny to change only the keys given" in shown.out.splitlines()
    assert compiled(shown.out)["job"]["fork"]["changed"] == {"optimizer.lr": 1e-5}


def test_a_fresh_optimizer_warns_that_the_schedule_starts_again(cli_here, source):
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "--fork", f"{SOURCE}@20",
                     "checkpoint.load_optim=false")
    assert shown.rc == 0, shown.err
    assert "warning: checkpoint.load_optim: false (set in command line): Megatron-Bridge then loads no scheduler " \
           "state either, so the LR schedule starts again from its warmup at iteration 20" in shown.out.splitlines()


def test_a_forked_job_records_the_fork_and_goes_on_from_its_own_checkpoints(cli, source):
    ran = cli("pretrain", "-c", "tiny", "--fork", f"{SOURCE}@20", "optimizer.lr=1e-5")  # stops in its preflight here
    job_id = ran.out.split()[1]
    job_dir = Path(ran.out.split("job dir: ", 1)[1].split()[0])
    manifest = json.loads((job_dir / "pretrain" / "code" / "manifest.json").read_text())
    assert manifest["fork"] == {"from": SOURCE, "iteration": 20, "path": str(source),
                                "changed": {"optimizer.lr": 1e-5}}
    lineage = cli("jobs", "lineage", job_id, prog="nemotron")
    assert lineage.rc == 0, lineage.err
    # the source published nothing (stopped before its end): its record and job dir say what it was
    assert f"  forked from {SOURCE} at iteration 20, changed: optimizer.lr=1e-05\n    {SOURCE}  (pretrain -c tiny)\n" \
           in lineage.out

    # the runtime's view: the source's checkpoint at the fork's iteration, saving into its own job dir
    config = yaml.safe_load((job_dir / "pretrain" / "code" / "config.yaml").read_text())
    own = config["checkpoint"]["save"]
    assert own == f"{job_dir}/checkpoints"
    values = plan.override_values(config)
    assert (values["checkpoint.load"], values["checkpoint.ckpt_step"], values["checkpoint.save"]) == \
        (str(source), 20, own)
    # once it saved (a later allocation, an in-job restart): on from its own newest checkpoint, not the fork's again
    Path(own, "iter_0000025").mkdir(parents=True)
    Path(own, "latest_train_state.pt").write_bytes(b"")
    values = plan.override_values(config)
    assert (values["checkpoint.load"], values["checkpoint.ckpt_step"]) == (own, None)
    assert "checkpoint.ckpt_step=null" in plan.override_list(config)

    # completed: its published checkpoint's manifest carries the fork, and lineage reads it from there
    published = record_outputs(config, 1.0)  # as recipes/launch.py does when the stage exits 0
    assert [(p["path"], p["fork"]) for p in published] == [(own, manifest["fork"])]
    lineage = cli("jobs", "lineage", job_id, prog="nemotron")
    assert f"  forked from {SOURCE} at iteration 20, changed: optimizer.lr=1e-05\n    {SOURCE}  (pretrain -c tiny)\n" \
           f"  produced {published[0]['name']}:v1  {own}\n" in lineage.out, lineage.out


@pytest.mark.slurm
def test_the_checkpoints_of_a_run_submitted_over_ssh_are_listed_over_ssh(cli_here, home, sshd, tmp_path):  # noqa: F811
    """Its job dir read, and its iter_* listed, on the login node through ssh (here a real sshd on this machine):
    the config names a dir this process is never asked to open itself."""
    ssh = {"host": "127.0.0.1", "port": PORT, "user": "root", "identity": str(sshd / "client")}
    remote = tmp_path / "cluster side" / SOURCE  # a space: the path is quoted on the remote shell
    save = make_source(cli_here, home, SOURCE, "pretrain", job_dir=remote, handle={"slurm_id": "7", "ssh": ssh})
    shown = cli_here("pretrain", "-c", "tiny", "--dry-run", "--full", "--fork", SOURCE)
    assert shown.rc == 0, shown.err
    assert (compiled(shown.out)["checkpoint"]["load"], compiled(shown.out)["checkpoint"]["ckpt_step"]) == \
        (str(save), 40)
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", "--fork", f"{SOURCE}@30")
    assert bad.rc == 2 and bad.err_lines == [f"error: fork: {SOURCE} has no checkpoint at iteration 30; it has 20, 40 "
                                             f"(in {save})"], bad.err
    ssh["port"] = 1  # nothing listens: one line saying why, not "no checkpoint yet"
    records.save(records.JobRecord(**{**records.load(SOURCE).__dict__, "handle": {"slurm_id": "7", "ssh": ssh}}))
    bad = cli_here("pretrain", "-c", "tiny", "--dry-run", "--fork", SOURCE)
    assert bad.rc == 2 and len(bad.err_lines) == 1 and "fork: cannot read" in bad.err, bad.err
