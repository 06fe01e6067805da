"""No config string reaches a shell unchecked: what a shell would read unquoted (a job name, the job dir, the names
of exported variables) is refused unless it has a safe form, everything else appears in the batch script quoted;
secrets are refused however a reference to them is spelt. Through the CLI, on the shipped profiles of the tests;
the real jobs that would leave a marker file are in test_slurm_jobs.py."""

from __future__ import annotations

import json
import shlex
import pytest

PAYLOADS = ("x;touch /tmp/ultra3-pwned", "$(touch /tmp/ultra3-pwned)", "`touch /tmp/ultra3-pwned`",
            "a b' \"c\" && touch /tmp/ultra3-pwned")


def _profile(text: str) -> None:
    with open("env.toml", "a") as f:
        f.write(f"\n[hostile]\nextends = \"ci\"\n{text}\n")


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("key,what", [("job_name_prefix", "must be letters, digits, '.', '_' and '-' only"),
                                      ("job_dir", "must be a path of letters, digits and '._/~+-' only"),
                                      ("container_image", "must be a .sqsh path or an image reference of letters")])
def test_what_a_shell_reads_unquoted_is_refused(cli_here, home, key, what, payload):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", f"run.{key}={json.dumps(payload)}")  # a YAML string
    assert r.rc == 2 and len(r.err_lines) == 1 and r.err_lines[0].startswith(f"error: run.{key}: {what}"), r.err
    _profile(f"{key} = {payload!r}".replace("'", '"') if '"' not in payload else f"{key} = '''{payload}'''")
    r = cli_here("pretrain", "-c", "tiny", "--batch", "hostile")
    assert r.rc == 2 and len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith(f"error: env.toml [hostile] {key}: {what}"), r.err
    assert not (home / "state").exists() or not any((home / "state").rglob("config.yaml"))  # nothing written


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_mount_a_shell_would_read_is_refused(cli_here, home, payload):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", f"run.mounts={json.dumps(['/a:' + payload])}")
    assert r.rc == 2 and len(r.err_lines) == 1 and r.err_lines[0].startswith("error: run.mounts: must be a list, "
                                                                              "each SRC:DST[:FLAGS] of letters"), r.err


@pytest.mark.parametrize("name", ["A=B", "1BAD", "BAD-NAME", "X;touch /tmp/ultra3-pwned", "A B"])
def test_exported_variable_names_must_be_names(cli_here, home, name):
    _profile(f'[hostile.env]\n"{name}" = "1"')
    r = cli_here("pretrain", "-c", "tiny", "--batch", "hostile", "--dry-run")
    assert r.rc == 2 and r.err_lines == [f"error: env.toml [hostile] env.{name}: not an environment variable name; use "
                                         "letters, digits and '_', not starting with a digit"], r.err


def test_an_unsafe_nemorun_home_is_refused(cli_here, home, tmp_path):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", env={"NEMORUN_HOME": f"{tmp_path}/a;b"})
    assert r.rc == 2, r.err
    assert r.err_lines[0].startswith(f"error: NEMORUN_HOME: '{tmp_path}/a;b': job dirs go under it"), r.err


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_other_string_appears_in_the_batch_script_quoted(cli_here, home, payload):
    keys = {"account": payload, "partition": payload, "qos": payload, "constraint": payload,
            "reservation": payload}  # (mem, time, the image and mounts have a checked form)
    _profile("\n".join(f"{k} = '''{v}'''" for k, v in keys.items()) + f"\n[hostile.env]\nX = '''{payload}'''")
    r = cli_here("pretrain", "-c", "tiny", "--batch", "hostile", "--dry-run", "--full")
    assert r.rc == 0, r.err
    script = r.out.split("== sbatch script")[1]
    lines = [line for line in script.splitlines() if "ultra3-pwned" in line]
    assert len(lines) >= len(keys) + 1, script
    for line in lines:  # the payload is one shell word: single-quoted where a shell reads the line
        words = shlex.split(line.split("=", 1)[1] if line.startswith("#SBATCH") else line)
        assert any(payload in word for word in words), line
        assert line.startswith("#SBATCH") or shlex.quote(payload) in line, line


@pytest.mark.parametrize("override", [
    "logger.wandb_project=${oc.env:'ULTRA3_T_TOKEN'}",
    'logger.wandb_project=${oc.env:"ULTRA3_T_TOKEN"}',
    "logger.wandb_project=${ oc.env:ULTRA3_T_TOKEN}",
    "logger.wandb_project=${oc.env:${oc.env:ULTRA3_T_NAME}}",
    "logger.wandb_project=prefix-${oc.env:ULTRA3_T_NAME_X,secretvalue-0123456789}",
    "run.setup=['echo secretvalue-0123456789']",
])
def test_a_secret_is_refused_however_it_is_spelt(cli_here, home, override):
    env = {"ULTRA3_T_TOKEN": "secretvalue-0123456789", "ULTRA3_T_NAME": "ULTRA3_T_TOKEN"}
    r = cli_here("pretrain", "-c", "tiny", "--dry-run", override, env=env)
    assert r.rc == 2 and r.out == "", r.out[:2000]
    assert "secretvalue-0123456789" not in r.err
    # a variable's name read from another variable is refused before anything is resolved
    why = "is known only once resolved" if "${oc.env:${" in override else "the secret ULTRA3_T_TOKEN"
    assert len(r.err_lines) == 1 and why in r.err_lines[0], r.err


@pytest.mark.parametrize("line", ["export HF_TOKEN=hf_abcdef123456", "WANDB_API_KEY=abc123 python x.py",
                                  "module load x && export MY_PASSWORD=hunter2"])
def test_a_setup_line_assigning_a_secret_a_literal_is_refused(cli_here, home, line):
    _profile(f"setup = ['''{line}''']")
    r = cli_here("pretrain", "-c", "tiny", "--batch", "hostile", "--dry-run")
    assert r.rc == 2 and len(r.err_lines) == 1 and "a setup line assigns the secret" in r.err_lines[0], r.err
    ok = cli_here("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", "run.setup=['export HF_TOKEN=$HF_TOKEN']")
    assert ok.rc == 0, ok.err
