"""An env.toml written for NVIDIA's Nemotron CLI, through the real CLI: its quick-start profile works unedited,
each of its profile keys is honoured under our name (a note says so) or refused with what to write instead,
`${oc.env:...}` placeholders resolve, and a stage config that sizes its own job keeps its node count."""

from __future__ import annotations

import re

from pathlib import Path

import pytest

from ultra3.paths import nemorun_home

QUICK_START = """
[YOUR-CLUSTER]
executor = "slurm"
account = "YOUR-ACCOUNT"
partition = "batch"
nodes = 48
ntasks_per_node = 8
gpus_per_node = 8
mounts = ["/lustre:/lustre"]

[wandb]
project = "ultra3"
entity = "my-team"
"""


@pytest.fixture
def nvidia(home):
    Path("env.toml").write_text(QUICK_START)
    return home


def write(profile: str) -> None:
    Path("env.toml").write_text(QUICK_START + profile)


def test_quick_start_profile_keeps_the_tiny_job_on_one_node(cli_here, nvidia):
    r = cli_here("pretrain", "-c", "tiny", "--run", "YOUR-CLUSTER", "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert "note: run.nodes: 48 from profile 'YOUR-CLUSTER' (env.toml) is not used: configs/_shared/tiny.yaml " \
           "sizes this job" in r.out
    assert "note: env.toml [YOUR-CLUSTER] ntasks_per_node: 8: one launcher per node starts one rank per GPU" in r.out
    assert "#SBATCH --nodes=1\n" in r.out and "logger.wandb_project" in r.out  # [wandb] reaches the logger
    wide = cli_here("pretrain", "-c", "tiny", "--run", "YOUR-CLUSTER", "--dry-run", "--full", "run.nodes=2")
    assert "#SBATCH --nodes=2\n" in wide.out  # the command line still wins


HONOURED = [
    ('container = "/lustre/img.sqsh"', "container: read as container_image", "--container-image /lustre/img.sqsh"),
    ('env_vars = {NCCL_DEBUG = "INFO"}', "env_vars: read as env", "export NCCL_DEBUG=INFO"),
    ('setup_lines = "module load cuda"', "setup_lines: read as setup", "module load cuda"),
    ('run_partition = "interactive"', "run_partition: 'interactive' is the partition of this --run submission",
     "#SBATCH --partition=interactive"),
    ('lustre_mount = "/scratch:/scratch"', "lustre_mount: '/scratch:/scratch' added to mounts", "/scratch:/scratch"),
    *[(f'{key} = {value}', f"{key}: read by image builds and by stages whose profile names no container_image; "
                           "not used here", "#SBATCH --partition=batch")
      for key, value in (("build_partition", '"cpu"'), ("build_time", '"01:00:00"'), ("build_image", '"x"'),
                         ("build_registry", '"reg.example.com"'), ("build_include_gpus", "true"),
                         ("build_gpus_per_node", "1"))],
    # the profile names no image: the stage looks for its built one under build_cache_dir
    ('build_cache_dir = "/lustre/cache"', "", "(no /lustre/cache/ultra3-training-"),
    ('batch_partition = "long"', "batch_partition: 'long' is for --batch submissions, not this --run one",
     "#SBATCH --partition=batch"),
    ("nproc_per_node = 8", "nproc_per_node: 8: one launcher per node starts one rank per GPU", "#SBATCH --nodes=1"),
    ('remote_job_dir = "/lustre/me/jobs"', "remote_job_dir: read as job_dir",
     "artifacts_root: /lustre/me/jobs/artifacts"),
    ('sif_dir = "/lustre/sif"', "", "#SBATCH --nodes=1"),  # an RL key: only the RL stages read it (below)
    ('account = "${oc.env:ULTRA3_TEST_ACCOUNT,fallback-acct}"', "", "#SBATCH --account=fallback-acct"),
]


@pytest.mark.parametrize("line,note,shown", HONOURED, ids=[h[0].split(" ")[0] for h in HONOURED])
def test_nvidia_key_is_honoured(cli_here, nvidia, line, note, shown):
    write(f"\n[mine]\nextends = \"YOUR-CLUSTER\"\n{line}\n")
    r = cli_here("pretrain", "-c", "tiny", "--run", "mine", "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert not note or f"note: env.toml [mine] {note}" in r.out, r.out[:2000]
    assert shown in r.out


REFUSED = [
    ('startup_commands = ["pip install x"]', "startup_commands: NVIDIA's CLI key has no equivalent here: ultra3 runs "
                                             "no per-task commands"),
    ('run_command = "python {script}"', "run_command: NVIDIA's CLI key has no equivalent here"),
    ("apptainer = true", "apptainer: NVIDIA's CLI key has no equivalent here"),
    ("ntasks_per_node = 4", "ntasks_per_node: 4 tasks per node with gpus_per_node = 8: ultra3 runs one rank per GPU"),
    ('tunnel = "docker"', "tunnel: must be \"ssh\""),
    ('workdir = "/workspace"', "workdir: NVIDIA's CLI key has no equivalent here: the job runs in its own code dir"),
    ('pre_ray_start_commands = ["ulimit -n 65536"]', "pre_ray_start_commands: NVIDIA's CLI key has no equivalent "
                                                     "here: the job brings up Ray itself"),
    ("nprocs_per_node = 8", "nprocs_per_node: NVIDIA's CLI key has no equivalent here: cloud executors"),
]


@pytest.mark.parametrize("line,error", REFUSED, ids=[r[0].split(" ")[0] for r in REFUSED])
def test_nvidia_key_is_refused_with_its_fix(cli_here, nvidia, line, error):
    write(f"\n[mine]\nextends = \"YOUR-CLUSTER\"\n{line}\n")
    r = cli_here("pretrain", "-c", "tiny", "--run", "mine", "--dry-run")
    lines = r.err.splitlines()
    assert r.rc == 2 and len(lines) == 1 and lines[0].startswith(f"error: env.toml [mine] {error}"), r.err


def test_rl_keys_of_a_profile_reach_the_rl_stages(cli_here, nvidia):
    write('\n[rl]\nextends = "YOUR-CLUSTER"\nsif_dir = "/lustre/sif"\npersistent_cache = "/lustre/cache"\n'
          'sandbox = {container = "/lustre/sandbox.sqsh", port = 6001}\n')
    r = cli_here("rl", "teacher", "-c", "swe", "--batch", "rl", "--dry-run", "--full", "policy=/lustre/p",
                 "data.dir=/lustre/d")
    assert r.rc == 0, r.err
    assert "sif_dir: /lustre/sif" in r.out and "VLLM_CACHE_ROOT: /lustre/cache/vllm" in r.out
    rlvr = cli_here("rl", "rlvr", "--batch", "rl", "--dry-run", "--full", "policy=/lustre/p", "data.dir=/lustre/d",
                    "judges.genrm_model=/g", "sif_dir=null")
    assert rlvr.rc == 0, rlvr.err
    assert "--container-image=/lustre/sandbox.sqsh" in rlvr.out and "NGINX_PORT=6001" in rlvr.out
    assert "project: ultra3" in rlvr.out and "entity: my-team" in rlvr.out  # [wandb] -> wandb.*


@pytest.mark.parametrize("table,note", [
    ("[cli]\ntheme = 'monokai'", "[cli]: NVIDIA's CLI colours its dry run with it; ultra3 prints plain text"),
    ("[cache]\ngit_dir = '/tmp/git'", "[cache]: NVIDIA's CLI keeps its git clones there; ultra3 clones nothing"),
    ("[wandb]\ngroup = 'ablations'", "[wandb] group: not read: the stages' W&B loggers take project, entity and a "
                                      "run name only"),
])
def test_nvidia_settings_tables_not_read_here_get_a_note(cli_here, nvidia, table, note):
    Path("env.toml").write_text(QUICK_START.replace("[wandb]\n", table + "\n") if "[wandb]" in table else
                                QUICK_START + "\n" + table + "\n")
    r = cli_here("pretrain", "-c", "tiny", "--run", "YOUR-CLUSTER", "--dry-run")
    assert r.rc == 0, r.err
    assert any(line.startswith("note: ") and note in line for line in r.out.splitlines()), r.out[:3000]


def test_an_ssh_tunnel_profile_reaches_its_login_node(cli_here, nvidia):
    """tunnel = "ssh" with host/user/identity: the dry run reads the artifact store on that host, through SSH."""
    write('\n[far]\nextends = "YOUR-CLUSTER"\ntunnel = "ssh"\nhost = "login.invalid"\nuser = "me"\n'
          'identity = "~/.ssh/id_ed25519"\nremote_job_dir = "/lustre/me/jobs"\n')
    r = cli_here("pretrain", "-c", "tiny", "--run", "far", "--dry-run")
    assert r.rc == 1 and r.err_lines[-1].startswith("error: cannot read the artifact store "
                                                    "/lustre/me/jobs/artifacts on login.invalid: ssh: "), r.err


def test_wandb_run_name_and_artifacts_root_are_honoured(cli_here, nvidia, tmp_path):
    Path("env.toml").write_text(QUICK_START + f"name = 'ultra3-run1'\n[artifacts]\nwandb = false\n"
                                               f"[artifacts.manifest]\nroot = '{tmp_path}/store'\n")
    r = cli_here("sft", "-c", "tiny", "--run", "YOUR-CLUSTER", "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert "logger.wandb_exp_name                     = ultra3-run1  <- profile 'YOUR-CLUSTER' (env.toml)" in r.out
    assert f"artifacts_root: {tmp_path}/store" in r.out


def test_a_slurm_profile_without_an_image_warns_in_a_dry_run_and_is_refused_on_submission(cli_here, nvidia):
    dry = cli_here("pretrain", "-c", "tiny", "--run", "YOUR-CLUSTER", "--dry-run")
    missing = f"no {nemorun_home()}/containers/ultra3-training-"
    assert "warning: run.container_image: no container image is set and the training image is not built for profile " \
           f"'YOUR-CLUSTER' ({missing}" in dry.out and "so the job would run `python` from the compute nodes' PATH; " \
           "build it (ultra3 container build training --batch YOUR-CLUSTER), or set container_image = \"IMAGE\" in " \
           "[YOUR-CLUSTER] of env.toml" in dry.out
    real = cli_here("pretrain", "-c", "tiny", "--batch", "YOUR-CLUSTER")
    assert real.rc == 2 and len(real.err_lines) == 1, real.err
    assert real.err_lines[0].startswith("error: run.container_image: no container image is set and the training "
                                        f"image is not built for profile 'YOUR-CLUSTER' ({missing}"), real.err
    assert real.err_lines[0].endswith("(a .sqsh file or registry image), or container_image = \"\" to run without a "
                                      "container on purpose"), real.err
    write('\n[bare]\nextends = "YOUR-CLUSTER"\ncontainer_image = ""\n')
    bare = cli_here("pretrain", "-c", "tiny", "--run", "bare", "--dry-run")
    assert bare.rc == 0 and "run.container_image" not in bare.out.split("== values")[0], bare.out[:2000]


def test_nvidia_quick_start_commands_work_verbatim(cli_here, nvidia):
    for stage in ("pretrain", "sft"):
        r = cli_here("ultra3", stage, "-c", "tiny", "--run", "YOUR-CLUSTER", "--dry-run", "--full", prog="nemotron")
        assert r.rc == 0, r.err
        assert "#SBATCH --nodes=1\n" in r.out and "#SBATCH --gpus-per-node=1\n" in r.out
        assert re.search(r"^run\.nodes +\= 1  <- configs/_shared/tiny\.yaml$", r.out, re.M)  # which source sized it


@pytest.mark.parametrize("stage,alias,ours", [
    ("pretrain", "data.per_split_data_args_path", "dataset.blend_path"),
    ("pretrain", "run.data", "dataset.blend_path"),
    ("sft", "dataset.ultra3_packed_sft_dir", "dataset.packed_dir"),
    ("sft", "run.data", "dataset.packed_dir"),
])
def test_nvidia_config_keys_are_read_as_ours(cli_here, nvidia, tmp_path, stage, alias, ours):
    r = cli_here(stage, "--run", "YOUR-CLUSTER", "--dry-run", f"{alias}={tmp_path}",
                 f"recipe.pretrained_checkpoint={tmp_path}",
                 *(["phase2.start_tokens=null"] if stage == "pretrain" else []))
    assert f"note: {alias}: read as {ours} (NVIDIA's CLI name; set in command line)" in r.out.splitlines(), r.out[:2000]
    assert f"{ours} = {tmp_path}  (set in command line)" in r.out


def test_nvidia_config_keys_in_a_config_file_and_their_misuses(cli_here, nvidia, tmp_path):
    mine = tmp_path / "mine.yaml"  # -c PATH, as NVIDIA's CLI takes it, with its key for the blend
    mine.write_text("defaults: [tiny]\ndataset:\n  mock: false\n"
                    f"data:\n  per_split_data_args_path: {tmp_path}/blend.json\n")
    r = cli_here("pretrain", "-c", str(mine), "--dry-run")  # read as ours: checked as ours
    assert r.rc == 2 and r.err_lines == [f"error: dataset.blend_path: {tmp_path}/blend.json does not exist (set in "
                                         f"{mine}); run `ultra3 data prep pretrain -c tiny` or fix the path"], r.err
    skip = cli_here("pretrain", "-c", "tiny", "--dry-run", "run.data=null")
    assert skip.rc == 0 and "note: run.data: null (set in command line): NVIDIA's way to skip the artifact lookup" \
        in skip.out
    both = cli_here("pretrain", "-c", "tiny", "--dry-run", "run.data=a:latest", "dataset.blend_path=/b")
    assert both.rc == 2 and "error: run.data: and dataset.blend_path both set in command line; " \
        "keep dataset.blend_path" in both.err_lines, both.err
    none = cli_here("quantize", "-c", "tiny", "--dry-run", "dataset.ultra3_packed_sft_dir=/x")
    assert none.rc == 2 and none.err_lines == [
        "error: dataset.ultra3_packed_sft_dir: NVIDIA's CLI key for a stage that takes sft-data as its data input; "
        "ultra3 quantize does not (set in command line); remove it"], none.err
