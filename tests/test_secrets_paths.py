"""Secrets by any path: a secret-named key holding a value is refused at any depth of any section (NeMo RL's
`nemo_rl.*` and `nemo_rl_add.*` included), every section of the dry run masks such keys, setup lines may not
give a secret a literal value in any of the shell's ways, and SSH settings cannot reach ssh as options.
Through the CLI (dry runs, a local job and a Slurm submission that must not start), and the real ssh."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from conftest import SECRETS
from test_rl import RLVR
from test_secrets import leaks_in_files, leaks_in_text
from ultra3.ssh import ssh_argv
from ultra3.leaks import MASK, secret_name

TOKEN = SECRETS["HF_TOKEN"]
KEY = SECRETS["WANDB_API_KEY"]


def _refused(r, *keys: str) -> None:
    """Exit 2, one line per key naming it and the fix, nothing on stdout, no secret value anywhere."""
    assert r.rc == 2 and r.out == "", r.out[-2000:] + r.err
    for key in keys:
        line = next((line for line in r.err_lines if line.startswith(f"error: {key}: ")), None)
        assert line and "a secret would be written to the job dir (set in command line); remove it and" in line \
            and re.search(r"remove it and (export [A-Z_]+|keep the secret in the environment instead: export it) "
                          "where you submit from", line), r.err
    assert not leaks_in_text(stdout=r.out, stderr=r.err)


def test_nemo_rl_secrets_of_the_issue_are_refused_and_written_nowhere(cli, gb200):
    r = cli(*RLVR, f"nemo_rl_add.env.HF_TOKEN={TOKEN}", f"nemo_rl.policy.generation.vllm_kwargs.api_key={KEY}",
            "--dry-run")
    _refused(r, "nemo_rl_add.env.HF_TOKEN", "nemo_rl.policy.generation.vllm_kwargs.api_key")
    assert len(r.err_lines) == 2, r.err
    assert "export HF_TOKEN where you submit from" in r.err_lines[0]

    r = cli(*RLVR, f"nemo_rl_add.env.HF_TOKEN={TOKEN}")  # a submission: refused before anything is written
    _refused(r, "nemo_rl_add.env.HF_TOKEN")
    found, _ = leaks_in_files(gb200.parent)  # $NEMOTRON_HOME and the working directory
    assert not found and not (gb200 / "jobs").exists(), found


@pytest.mark.parametrize("override,key", [
    (f"nemo_rl.policy.generation.vllm_kwargs.api_key={KEY}", "nemo_rl.policy.generation.vllm_kwargs.api_key"),
    (f"nemo_rl_add.env.HF_TOKEN={TOKEN}", "nemo_rl_add.env.HF_TOKEN"),
    (f"nemo_rl_add.env={{HF_TOKEN: {TOKEN}}}", "nemo_rl_add.env.HF_TOKEN"),  # a table holding it
    (f"nemo_rl_add.servers=[{{name: a, api_key: {KEY}}}]", "nemo_rl_add.servers"),  # a table in a list
    (f"nemo_rl_add.credentials.path={KEY}", "nemo_rl_add.credentials.path"),  # under a secret-named table
    (f"nemo_rl_add.my_password=[{KEY}]", "nemo_rl_add.my_password"),  # a list of them
    ("nemo_rl_add.MY_SECRET=12345678", "nemo_rl_add.MY_SECRET"),  # a number
])
def test_a_secret_named_key_is_refused_at_any_depth(cli_here, gb200, override, key):
    r = cli_here(*RLVR, override, "--dry-run")
    _refused(r, key)
    assert len(r.err_lines) == 1 and "12345678" not in r.err, r.err


@pytest.mark.parametrize("override", ["nemo_rl_add.env.HF_TOKEN=", "nemo_rl_add.env.HF_TOKEN=null",
                                      "nemo_rl_add.use_token=false", "nemo_rl_add.env.TOKENIZERS_PARALLELISM=false",
                                      "nemo_rl_add.policy.tokenizer.pad_token='<pad>'",
                                      "nemo_rl_add.policy.tokenizer.eos_token='</s>'"])
def test_an_empty_or_boolean_secret_named_key_and_tokenizer_keys_are_not_secrets(cli_here, gb200, override):
    r = cli_here(*RLVR, override, "--dry-run")
    assert r.rc == 0, r.err


def test_every_section_of_the_dry_run_masks_secret_named_keys(cli, gb200):
    """NeMo RL's own YAML names an api_key (its judges' `dummy_key`): masked in the NeMo RL config section too."""
    r = cli(*RLVR, "nemo_rl_add.env.TOKENIZERS_PARALLELISM=false", "--dry-run", "--full")
    assert r.rc == 0, r.err
    sections = dict(re.findall(r"\n== (.+?) ==\n(.*?)(?=\n== |\nDry run: )", r.out, re.S))
    nemo_rl = next(text for title, text in sections.items() if title.startswith("NeMo RL config"))
    shown = 0
    for text in (sections["compiled config"], nemo_rl):
        for path, value in _leaves(yaml.safe_load(text)):
            if secret_name(path) and value not in (None, ""):
                assert value == MASK, f"{path} = {value!r}"
                shown += 1
    assert shown >= 1 and "dummy_key" not in r.out
    assert "TOKENIZERS_PARALLELISM: 'false'" in nemo_rl or "TOKENIZERS_PARALLELISM: false" in nemo_rl  # no secret


def _leaves(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(tree, list):
        for v in tree:
            yield from _leaves(v, path)
    else:
        yield path, tree


def test_a_local_job_with_a_secret_named_key_is_refused_and_writes_nothing(cli, home):
    """On the local executor the job would run here and write its config.yaml and manifest.json."""
    r = cli("pretrain", "-c", "tiny", f"logger.comet_api_key={KEY}")
    _refused(r, "logger.comet_api_key")
    found, files = leaks_in_files(home.parent)
    assert not found and not any(p.name in ("config.yaml", "manifest.json") for p in files), found


# Issue 26, item 4: the setup-line forms the check missed, and what it refused that it should not have
LITERAL_SETUPS = [
    [f"read HF_TOKEN <<< {TOKEN}"],
    [f"read -r HF_TOKEN <<< '{TOKEN}'"],
    [f"printf -v HF_TOKEN '%s' {TOKEN}"],
    [f"printf -vHF_TOKEN {TOKEN}"],
    [f"huggingface-cli login --token {TOKEN}"],
    [f"huggingface-cli login --token={TOKEN}"],
    [f"wandb login --api-key '{KEY}'"],
    [f"echo {TOKEN} > /tmp/t", "export HF_TOKEN=$(cat /tmp/t)"],
    [f"printf %s {TOKEN} > /tmp/t; read -r HF_TOKEN < /tmp/t"],
    [f"echo {TOKEN} | tee /tmp/t >/dev/null", "export HF_TOKEN=`cat /tmp/t`"],
    [f"echo {TOKEN} > ~/.cache/huggingface/token"],
    [f"T={TOKEN}", "export HF_TOKEN=$T"],
    [f"export HF_TOKEN=$(echo {TOKEN})"],
    [f"export HF_TOKEN=$'{TOKEN}'"],
    [f'export HF_TOKEN="{TOKEN}"'],
    [f"python train.py ++policy.api_key={KEY}"],
]
READING_SETUPS = [
    ["export HF_TOKEN=$HF_TOKEN"], ['export HF_TOKEN="$HF_TOKEN"'], ["module load cuda"],
    ["export TOKENIZERS_PARALLELISM=false"], ["export HF_TOKEN=$(cat ~/.secrets/hf)"],
    ["read -r HF_TOKEN < ~/.secrets/hf"], ['huggingface-cli login --token "$HF_TOKEN"'],
    ['printf -v HF_TOKEN %s "$(cat ~/.secrets/hf)"'], ['echo "$HF_TOKEN" > ~/.cache/huggingface/token'],
    ["echo done > /tmp/t", "export STATUS=$(cat /tmp/t)"], ["python x.py --max-new-tokens 10 > /tmp/log 2>&1"],
    ["python convert.py --eos-token '</s>' --pad-token=0"],
]


def _setup(lines: list[str]) -> str:
    return "run.setup=[" + ", ".join("'" + line.replace("'", "''") + "'" for line in lines) + "]"


@pytest.mark.parametrize("lines", LITERAL_SETUPS, ids=lambda lines: " / ".join(lines)[:60])
def test_a_setup_line_giving_a_secret_a_literal_value_is_refused(cli_here, home, lines):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", _setup(lines))
    assert r.rc == 2 and r.out == "" and len(r.err_lines) == 1, r.out[-2000:] + r.err
    assert re.match(r"error: run\.setup: a setup line (assigns the secret|passes the secret option|writes a literal "
                    r"value to the secret file) \S+ (a literal value )?\(set in command line\), which the batch script "
                    r"and its log would show; remove it and ", r.err_lines[0]), r.err
    assert not leaks_in_text(stderr=r.err)


@pytest.mark.parametrize("lines", READING_SETUPS, ids=lambda lines: " / ".join(lines)[:60])
def test_a_setup_line_reading_a_secret_is_accepted(cli_here, home, lines):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", "--full", _setup(lines))
    assert r.rc == 0, r.err
    assert lines[-1] in r.out.split("== sbatch script")[1]


def test_a_run_env_value_passed_on_to_a_secret_is_a_literal(cli_here, home):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", f"run.env.PLAIN={TOKEN}",
                 _setup(["export HF_TOKEN=$PLAIN"]))
    assert r.rc == 2 and r.err_lines[0].startswith("error: run.setup: a setup line assigns the secret HF_TOKEN"), r.err


HOSTILE = "-oProxyCommand=touch {marker}"


@pytest.mark.parametrize("key,what", [
    ("host", "must be a host name, an address or a ~/.ssh/config alias of letters, digits and '._:-', not starting "
             "with '-' or '.'"),
    ("user", "must be a user name of letters, digits and '._-', not starting with '-' or '.'")])
def test_an_option_like_ssh_host_or_user_is_refused_before_anything_runs(cli, home, tmp_path, key, what):
    marker = tmp_path / "pwned"
    ssh = {"host": "127.0.0.1", "user": "me", key: HOSTILE.format(marker=marker)}
    r = cli("pretrain", "-c", "tiny", "--batch", "ci", *(f"run.{k}={v}" for k, v in ssh.items()),
            f"run.job_dir={tmp_path}/jobs")
    assert r.rc == 2 and r.err_lines == [f"error: run.{key}: {what}, got '{ssh[key]}' (set in command line)"], r.err
    with open("env.toml", "a") as f:  # the same in a profile, and a dry run (which reads the store over ssh)
        f.write(f'\n[hostile]\nextends = "ci"\nhost = "{ssh["host"]}"\nuser = "{ssh["user"]}"\n'
                f'job_dir = "{tmp_path}/jobs"\n')
    r = cli("pretrain", "-c", "tiny", "--batch", "hostile", "--dry-run")
    assert r.rc == 2 and r.err_lines == [f"error: env.toml [hostile] {key}: {what}, got '{ssh[key]}'"], r.err
    assert not marker.exists() and not (home / "jobs").exists()


@pytest.mark.parametrize("name", ["login-01.cluster.example.com", "127.0.0.1", "::1", "my_cluster", "eos"])
def test_host_names_addresses_and_aliases_are_accepted(cli_here, home, name):
    # the dry run looks in the store over SSH: port 9 on loopback refuses at once, the names don't resolve
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", f"run.host={name}", "run.user=first.last", "run.port=9",
                 "run.job_dir=/lustre/jobs", "--dry-run")
    assert not any(line.startswith(("error: run.host", "error: run.user")) for line in r.err_lines), r.err


def test_ssh_argv_passes_each_setting_as_an_argument_and_the_host_after_a_double_dash():
    assert ssh_argv({"host": "login", "user": "me", "port": 2222, "identity": None}) == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-p", "2222", "-l", "me", "--", "login"]
    assert ssh_argv({"host": "login"})[-2:] == ["--", "login"]


@pytest.mark.parametrize("key", ["host", "user"])
def test_ssh_reads_no_setting_as_an_option(tmp_path, key):
    """The argv as the real ssh parses it, without the config checks: a ProxyCommand would run `touch` here."""
    marker = tmp_path / "pwned"
    ssh = {"host": "127.0.0.1", "user": "me", "port": 1, key: f"-oProxyCommand=touch {marker}"}
    p = subprocess.run([*ssh_argv(ssh), "true"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 255, p.stderr
    assert not list(tmp_path.iterdir()), p.stderr  # no marker (`touch ...@127.0.0.1` with the old user@host form)
