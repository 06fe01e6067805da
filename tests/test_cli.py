"""The CLI as a user meets it: help, the two entry points, option placement and forms, and what the
dry run prints (compiled config, provenance, precedence, sbatch script or local command)."""

from __future__ import annotations

import re

import pytest
import yaml


def section(out: str, title: str) -> str:
    """The body of the dry run's `== title ... ==` section."""
    match = re.search(rf"^== {re.escape(title)}[^\n]*==\n(.*?)(?=^== |^Not shown |^Dry run:)", out, re.S | re.M)
    assert match, f"no section '{title}' in:\n{out}"
    return match.group(1)


def provenance(out: str) -> dict[str, tuple[str, str]]:
    """key -> (value, source) from the 'values not from the stage default' section."""
    rows = {}
    for line in section(out, "values not from the stage default").splitlines():
        if m := re.match(r"^(\S+)\s+= (.*?)  <- (.+)$", line):
            rows[m[1]] = (m[2], m[3])
    return rows


def compiled(out: str) -> dict:
    return yaml.safe_load(section(out, "compiled config"))


def ok(r):
    assert r.rc == 0, f"rc {r.rc}\nstdout:\n{r.out}\nstderr:\n{r.err}"
    assert "Traceback" not in r.out + r.err
    return r


def commands(help_text: str) -> list[str]:
    body = help_text.split("Commands:", 1)[1]
    return [line.split()[0] for line in body.splitlines() if line.startswith("  ") and line.strip()]


# -- help ----------------------------------------------------------------------------------------------

def test_ultra3_help_lists_the_stages(cli):
    r = ok(cli("--help"))
    assert r.out.startswith("Usage: ultra3 ")
    assert commands(r.out) == ["pretrain", "sft", "quantize", "eval", "pipe", "data", "rl", "container", "convert"]
    assert "ultra3 pretrain -c tiny --dry-run" in r.out
    assert commands(ok(cli("container", "--help")).out) == ["build"]
    assert commands(ok(cli("data", "prep", "--help")).out) == ["pretrain", "sft", "rl"]
    assert commands(ok(cli("rl", "--help")).out) == ["rlvr", "teacher", "mopd"]
    assert commands(ok(cli("convert", "--help")).out) == ["hf-to-megatron", "megatron-to-hf"]
    assert ok(cli()).out == r.out  # no arguments: the same help, exit 0


def test_nemotron_help_lists_ultra3_and_jobs(cli):
    r = ok(cli("--help", prog="nemotron"))
    assert r.out.startswith("Usage: nemotron ")
    assert commands(r.out) == ["ultra3", "jobs"]
    assert "pretrain, sft, rl, data prep" in r.out


def test_nemotron_ultra3_help_lists_the_stages(cli):
    r = ok(cli("ultra3", "--help", prog="nemotron"))
    assert r.out.startswith("Usage: nemotron ultra3 ")
    assert commands(r.out) == ["pretrain", "sft", "quantize", "eval", "pipe", "data", "rl", "container", "convert"]


def test_stage_help_lists_configs_profiles_and_examples(cli, tmp_path):
    r = ok(cli("pretrain", "--help"))
    assert r.out.startswith("Usage: ultra3 pretrain [OPTIONS] [KEY=VALUE]...")
    assert "Configs (-c): default, long_context, smoke, tiny, tiny_phases\n" in r.out
    assert "Input phase 2 data: phase2.blend_path <- pretrain-data (when phase2.start_tokens is set, unless " \
           "dataset.mock)" in r.out
    assert (f"Profiles (--run/--batch): blackwell, ci, ci-cpu, hopper, workstation in {tmp_path / 'work' / 'env.toml'}"
            in r.out)
    examples = r.out.split("Examples:", 1)[1]
    assert "ultra3 pretrain -c tiny --dry-run" in examples
    assert "ultra3 pretrain --batch mycluster" in examples
    for option in ("--config", "--run", "--batch", "--dry-run", "--env-file"):
        assert option in r.out


def test_stage_help_without_env_toml(cli, tmp_path):
    (tmp_path / "work" / "env.toml").unlink()
    r = ok(cli("sft", "-h"))
    assert "Profiles (--run/--batch): none (no env.toml found)" in r.out
    assert "Configs (-c): default, tiny" in r.out


def test_help_says_what_the_code_does(cli_here):
    """data prep runs in a pool of processes unless Ray is asked for; --version is an option of both programs; pipe
    lists the profiles; container build says what its `default` config is."""
    for kind in ("pretrain", "sft", "rl"):
        said = ok(cli_here("data", "prep", kind, "--help")).out.split("Arguments:")[0]
        assert "(processes; Ray across nodes)" in " ".join(said.split()) and "on Ray" not in said, said
    assert "--version" in ok(cli_here("--help")).out and "--version" in ok(cli_here("--help", prog="nemotron")).out
    assert re.fullmatch(r"ultra3 \S+\n", ok(cli_here("-c", "tiny", "--version")).out)
    profiles = re.search(r"^  Profiles \(--run/--batch\): (.+) in \S+env.toml$", ok(cli_here("pipe", "-h")).out, re.M)
    assert profiles and set(profiles.group(1).split(", ")) == {"ci", "ci-cpu", "blackwell", "hopper", "workstation"}
    assert "default: the training image (pretrain, sft, quantize), built when no kind is named" in \
        ok(cli_here("container", "build", "--help")).out


def test_nvidia_s_image_build_command_names_ours(cli_here):
    r = cli_here("kit", "slurm", "build", prog="nemotron")
    assert r.rc == 2 and r.err_lines == [
        "error: No such command 'kit'; NVIDIA's `nemotron kit slurm build` is `ultra3 container build "
        "[training|rl|data] --run|--batch PROFILE` here (or `nemotron ultra3 container build ...`) (see 'nemotron "
        "--help')"], r.err


def test_data_prep_sft_help(cli):
    r = ok(cli("data", "prep", "sft", "--help"))
    assert r.out.startswith("Usage: ultra3 data prep sft [OPTIONS] [KEY=VALUE]...")
    assert "Configs (-c): default, tiny" in r.out
    assert "ultra3 data prep sft -c tiny --sample 100 --force" in r.out and "--sample N" in r.out
    nemotron = ok(cli("ultra3", "data", "prep", "sft", "--help", prog="nemotron"))
    assert nemotron.out.startswith("Usage: nemotron ultra3 data prep sft ")


# -- entry points and option placement -------------------------------------------------------------------

def test_nemotron_ultra3_prints_the_same_dry_run(cli, home):
    a = ok(cli("ultra3", "pretrain", "-c", "tiny", "--dry-run", prog="nemotron"))
    b = ok(cli("pretrain", "-c", "tiny", "--dry-run"))
    assert a.out == b.out
    assert a.out.startswith("ultra3 pretrain: config tiny (tiny.yaml), local (this machine), mode local\n")
    assert not home.exists()


def test_options_before_the_stage_equal_options_after(cli):
    after = ok(cli("pretrain", "-c", "tiny", "-d", "--full"))
    assert ok(cli("-c", "tiny", "-d", "--full", "pretrain")).out == after.out
    assert ok(cli("-d", "--full", "pretrain", "-c", "tiny")).out == after.out
    ckpt = "recipe.pretrained_checkpoint=/lustre/ckpt"  # a cluster path: a warning on this machine
    profile_after = ok(cli("sft", "-c", "tiny", "-b", "ci", "-d", "--full", "train.train_iters=3", ckpt))
    profile_before = ok(cli("--batch=ci", "--dry-run", "--full", "sft", "--config=tiny", "train.train_iters=3", ckpt))
    assert profile_before.out == profile_after.out
    assert "profile 'ci'" in profile_after.out
    assert compiled(profile_after.out)["train"]["train_iters"] == 3


def test_config_equals_form(cli):
    short = ok(cli("pretrain", "-c", "tiny", "-d", "--full"))
    assert ok(cli("pretrain", "--config=tiny", "-d", "--full")).out == short.out
    assert ok(cli("pretrain", "--config", "tiny", "--dry-run", "--full")).out == short.out
    assert compiled(short.out)["model"]["num_layers"] == 7  # the tiny model, not the default


def test_same_option_twice_with_the_same_value(cli):
    once = ok(cli("pretrain", "-c", "tiny", "-b", "ci", "-d"))
    assert ok(cli("-c", "tiny", "-b", "ci", "pretrain", "-c", "tiny", "--batch=ci", "-d")).out == once.out


# -- what the dry run prints --------------------------------------------------------------------------------

def test_dry_run_provenance_and_precedence(cli, home):
    # tiny.yaml sets run.time 00:30:00; profile ci sets time 00:05:00: the profile wins
    r = ok(cli("pretrain", "-c", "tiny", "--batch", "ci", "train.train_iters=20", "-d", "--full"))
    rows = provenance(r.out)
    assert rows["train.train_iters"] == ("20", "command line")
    assert rows["run.account"] == ("ultra3", "profile 'ci' (env.toml)")
    assert rows["run.partition"] == ("debug", "profile 'ci' (env.toml)")
    assert rows["run.time"] == ("00:05:00", "profile 'ci' (env.toml)")
    assert rows["cluster.gpu"] == ("h100", "profile 'ci' (env.toml)")
    assert rows["model.num_layers"] == ("7", "configs/_shared/tiny.yaml")
    cfg = compiled(r.out)
    assert cfg["run"]["time"] == "00:05:00"
    assert cfg["train"]["train_iters"] == 20
    assert "#SBATCH --time=00:05:00" in section(r.out, "sbatch script")

    # the command line wins over the profile, and says so
    r = ok(cli("pretrain", "-c", "tiny", "--batch", "ci", "run.time=01:00:00", "-d", "--full"))
    assert provenance(r.out)["run.time"] == ("01:00:00", "command line")
    assert compiled(r.out)["run"]["time"] == "01:00:00"
    assert "#SBATCH --time=01:00:00" in section(r.out, "sbatch script")
    assert "time 01:00:00" in section(r.out, "resources")
    assert not home.exists()


def test_slurm_time_without_leading_zero_stays_a_string(cli):
    r = ok(cli("pretrain", "-c", "tiny", "--batch", "ci", "run.time=4:00:00", "-d", "--full"))
    assert compiled(r.out)["run"]["time"] == "4:00:00"
    assert "#SBATCH --time=4:00:00" in section(r.out, "sbatch script")


def test_dry_run_with_a_slurm_profile_prints_the_sbatch_script(cli, home):
    r = ok(cli("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", "--full"))
    assert "profile 'ci' (slurm, " in r.out.splitlines()[0]
    assert r.out.splitlines()[0].endswith("mode detached")
    script = section(r.out, "sbatch script")
    assert script.startswith("#!/bin/bash")
    for line in ("#SBATCH --account=ultra3", "#SBATCH --partition=debug", "#SBATCH --nodes=1",
                 "#SBATCH --gpus-per-node=1", "#SBATCH --job-name=ultra3.pretrain"):
        assert line in script.splitlines()
    assert "python -m recipes.launch --config config.yaml" in script
    assert "== local command" not in r.out
    assert r.out.rstrip().endswith("Dry run: nothing was written or submitted.")
    assert "mode attached" in ok(cli("pretrain", "-c", "tiny", "--run", "ci", "-d", "--full")).out.splitlines()[0]
    assert not home.exists()


def test_dry_run_prints_a_summary_and_full_adds_the_config_and_script(cli, home):
    summary = ok(cli("rl", "rlvr", "-c", "tiny", "--batch", "ci", "--dry-run", "policy=/lustre/ckpt/sft-hf",
                     "data.dir=/lustre/data/rl")).out
    full = ok(cli("rl", "rlvr", "-c", "tiny", "--batch", "ci", "--dry-run", "--full", "policy=/lustre/ckpt/sft-hf",
                  "data.dir=/lustre/data/rl")).out
    for title in ("values not from the stage default", "inputs and outputs", "resources", "estimated cost"):
        assert section(summary, title) == section(full, title)
    for title in ("compiled config", "NeMo RL config", "sbatch script"):
        assert f"== {title}" not in summary and f"== {title}" in full
    assert "#SBATCH" not in summary and "#SBATCH --account=ultra3" in full
    hidden = re.search(r"^Not shown \((\d+) lines; add --full\): compiled config, NeMo RL config .*, "
                       r"sbatch script \(as NeMo-Run submits it\)\.$", summary, re.M)
    assert hidden, summary
    assert len(full.splitlines()) - len(summary.splitlines()) == int(hidden[1]) - 2  # less `Not shown`
    assert len(summary.splitlines()) < len(full.splitlines()) / 5  # 920 lines of the RL dry run are behind --full
    assert summary.rstrip().endswith("Dry run: nothing was written or submitted.")
    assert not home.exists()


@pytest.mark.parametrize("args", [("sft", "-c", "tiny", "--full"), ("pipe", "-c", "tiny", "--full")])
def test_full_without_dry_run_is_refused(cli, home, args):
    r = cli(*args)
    assert (r.rc, r.out) == (2, "")
    assert r.err.strip() == "error: --full shows more of a dry run: give it with --dry-run"
    assert not home.exists()


def test_pipe_dry_run_shows_its_scripts_with_full(cli, home):
    summary = ok(cli("pipe", "-c", "tiny", "--batch", "ci", "--dry-run")).out
    full = ok(cli("pipe", "-c", "tiny", "--batch", "ci", "--dry-run", "--full")).out
    assert "Not shown (add --full): the sbatch script of data-pretrain, pretrain, data-sft, sft, eval-sft, quantize, " \
           "eval-quantized." in summary
    assert "#SBATCH" not in summary
    assert full.count("#!/bin/bash") == 7 and "== sft: sbatch script ==" in full
    titles = [line for line in full.splitlines() if line.startswith("== ")]
    shown = [line for line in summary.splitlines() if line.startswith("== ")]
    assert shown == [t for t in titles if not t.endswith(": sbatch script ==")]
    assert shown == ["== graph (<- the steps each waits for; * on the critical path) ==", "== estimated cost =="]


def test_dry_run_without_a_profile_prints_the_local_command(cli, home):
    r = ok(cli("pretrain", "-c", "tiny", "-d", "--full"))
    assert "local (this machine), mode local" in r.out.splitlines()[0]
    assert " -m recipes.launch --config config.yaml" in section(r.out, "local command")
    assert "#SBATCH" not in r.out
    assert "== sbatch script" not in r.out
    assert r.err == ""
    assert not home.exists()


def test_config_path_outside_the_repo_with_defaults(cli, tmp_path):
    mine = tmp_path / "elsewhere" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text("# my variant of the stage's default\ndefaults: [default]\nlogger:\n  log_interval: 7\n")
    r = ok(cli("pretrain", "-c", str(mine), "--batch", "blackwell", "-d", "--full",
               "dataset.blend_path=/data/blend.json", "phase2.blend_path=/data/phase2/blend.json"))
    assert r.out.startswith(f"ultra3 pretrain: config {mine} (mine.yaml), profile 'blackwell'")
    rows = provenance(r.out)
    assert rows["logger.log_interval"] == ("7", str(mine))
    assert "model.num_layers" not in rows  # from the stage default: not a change
    cfg = compiled(r.out)
    assert cfg["logger"]["log_interval"] == 7
    assert cfg["model"]["num_layers"] == 108  # configs/pretrain/default.yaml -> configs/_shared/ultra.yaml
    assert cfg["train"]["global_batch_size"] == 3072


def test_override_values_are_typed(cli):
    r = ok(cli("pretrain", "-c", "tiny", "-d", "--full", "optimizer.lr=1e-4", "model.recompute_modules=[moe,layernorm]",
               "recipe.hf_model=null", "model.sequence_parallel=false", "logger.wandb_project=ultra3-tests"))
    cfg = compiled(r.out)
    assert cfg["optimizer"]["lr"] == 1e-4 and isinstance(cfg["optimizer"]["lr"], float)
    assert provenance(r.out)["optimizer.lr"] == ("0.0001", "command line")
    assert cfg["model"]["recompute_modules"] == ["moe", "layernorm"]
    assert cfg["recipe"]["hf_model"] is None
    assert cfg["model"]["sequence_parallel"] is False
    assert cfg["logger"]["wandb_project"] == "ultra3-tests"


def test_data_prep_dry_run_shows_the_tokenizer(cli):
    # `tokenizer` contains TOKEN but is a model name, not a secret: shown, not masked
    r = ok(cli("data", "prep", "sft", "--batch", "ci", "-d", "--full"))
    assert compiled(r.out)["tokenizer"] == "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"
    assert "#SBATCH --account=ultra3" in section(r.out, "sbatch script")


def test_data_prep_flags_are_their_config_keys(cli):
    # `--sample N` is sample=N and `--force` is force=true (NVIDIA's CLI turned `--sample 100` into sample=True)
    r = ok(cli("data", "prep", "sft", "-c", "tiny", "--sample", "100", "--force", "-d", "--full"))
    assert provenance(r.out)["sample"] == ("100", "command line")
    assert compiled(r.out)["sample"] == 100 and compiled(r.out)["force"] is True
    assert ok(cli("data", "prep", "pretrain", "-c", "tiny", "--sample=7", "-d", "--full")).out.count("sample: 7") == 1
    bad = cli("data", "prep", "sft", "-c", "tiny", "--sample", "many", "-d", "--full")
    assert bad.rc == 2 and "'--sample'" in bad.err and len(bad.err_lines) == 1
    assert cli("pretrain", "-c", "tiny", "--sample", "3", "-d", "--full").rc == 2  # a data-prep flag only


def test_version(cli):
    from ultra3 import __version__

    assert cli("--version").out == f"ultra3 {__version__}\n"
    assert cli("--version", prog="nemotron").out == f"nemotron {__version__}\n"


@pytest.mark.parametrize("args,prog,hint", [
    (["data", "pretrain"], "ultra3", "error: No such command 'pretrain'; did you mean 'ultra3 data prep pretrain'? "
                                     "(see 'ultra3 data --help')"),
    (["SFT"], "ultra3", "error: No such command 'SFT'; did you mean 'ultra3 sft'? (see 'ultra3 --help')"),
    (["nano3", "pretrain"], "nemotron", "error: No such command 'nano3'; this launcher has the Nemotron 3 Ultra stages "
                                        "only: nemotron ultra3 --help (see 'nemotron --help')"),
])
def test_unknown_command_gets_a_did_you_mean(cli, args, prog, hint):
    r = cli(*args, prog=prog)
    assert r.rc == 2 and r.err.splitlines() == [hint]


def test_stage_help_lists_the_profiles_of_the_env_file_given(cli, home, tmp_path):
    other = tmp_path / "other.toml"
    other.write_text('[elsewhere]\nexecutor = "local"\n')
    r = cli("pretrain", "--help", "--env-file", str(other))
    assert f"Profiles (--run/--batch): elsewhere in {other}" in r.out
