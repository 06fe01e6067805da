"""Secrets (HF_TOKEN, WANDB_API_KEY) reach a job through its environment only: never through the dry
run, the job dir, the sbatch script or its trace, the logs, the job registry or NeMo-Run's files. Real
jobs on the local Slurm cluster (and one on the local executor); the fake values come from conftest.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from pathlib import Path

import pytest

from conftest import SECRETS
from test_slurm_jobs import (  # noqa: F401 (_cancel_leftovers: the autouse fixture that scancels leftovers)
    PREFLIGHT, TERMINAL, _cancel_leftovers, add_profile, jobs, submit, wait_state)

pytestmark = pytest.mark.slurm


def _blobs(path: Path) -> list[bytes]:
    data = path.read_bytes()
    blobs = [data]
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):  # NeMo-Run's code package: look inside too
        with tarfile.open(path) as tar:
            blobs += [tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()]
    return blobs


def leaks_in_files(root: Path) -> tuple[list[str], list[Path]]:
    """(where a secret value occurs, every file read) for the whole tree under `root`."""
    found, files = [], []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files.append(path)
            for name, value in SECRETS.items():
                if any(value.encode() in blob for blob in _blobs(path)):
                    found.append(f"{path.relative_to(root)}: {name}")
    return found, files


def leaks_in_text(**texts: str) -> list[str]:
    return [f"{where}: {name}" for where, text in texts.items() for name, value in SECRETS.items() if value in text]


def hash_lines(proof: Path) -> list[str]:
    """Setup lines that prove the job got each secret, writing only its sha256 outside the job dir."""
    return [f'printf %s "${name}" | sha256sum | cut -d" " -f1 > {proof}/{name}.sha256' for name in SECRETS]


def assert_received(proof: Path) -> None:
    for name, value in SECRETS.items():
        got = (proof / f"{name}.sha256").read_text().strip()
        assert got == hashlib.sha256(value.encode()).hexdigest(), f"the job did not get {name} from its environment"


def test_dry_run_shows_no_secret(slurm, cli, home, tmp_path):
    add_profile("sec", setup=hash_lines(tmp_path))
    r = cli("pretrain", "-c", "tiny", "--batch", "sec", "--dry-run", "--full", env=SECRETS)
    assert r.rc == 0, r.err
    assert "sha256sum" in r.out  # the setup lines are there, naming the variables only
    assert not leaks_in_text(stdout=r.out, stderr=r.err)


def test_secrets_are_refused_in_config_and_env_toml(cli, home):
    r = cli("pretrain", "-c", "tiny", "logger.wandb_project=${oc.env:WANDB_API_KEY}", "--dry-run", env=SECRETS)
    assert r.rc == 2 and "WANDB_API_KEY" in r.err, r.out + r.err
    assert not leaks_in_text(stdout=r.out, stderr=r.err)

    add_profile("leaky", env={"HF_TOKEN": SECRETS["HF_TOKEN"]})
    r = cli("pretrain", "-c", "tiny", "--batch", "leaky", "--dry-run", env=SECRETS)
    assert r.rc == 2 and "env.HF_TOKEN" in r.err and "secrets don't belong in env.toml" in r.err, r.out + r.err
    assert not leaks_in_text(stdout=r.out, stderr=r.err)


def test_slurm_job_gets_secrets_from_its_environment_and_writes_them_nowhere(slurm, cli, home, tmp_path):
    proof = tmp_path / "proof"  # outside the job dir and $NEMOTRON_HOME
    proof.mkdir()
    add_profile("sec", setup=hash_lines(proof))

    sub = submit(cli, "--batch", "sec", env=SECRETS)
    st = wait_state(cli, sub.id, *TERMINAL)
    assert st["state"] == "FAILED" and PREFLIGHT.match(st["reason"]), st["text"]
    assert_received(proof)

    logs = jobs(cli, "logs", sub.id, env=SECRETS)
    listing = jobs(cli, "list", env=SECRETS)
    assert PREFLIGHT.search(logs.out)
    assert not leaks_in_text(submit_out=sub.out, submit_err=sub.err, status=st["text"], logs=logs.out + logs.err,
                             listing=listing.out + listing.err)

    # every file: the job dir (config, recipes, manifest, NeMo-Run's sbatch script, configs and code
    # package, the sbatch trace, the job log), NeMo-Run's home (.slurm_jobs) and the job registry
    found, files = leaks_in_files(home)
    assert not found, f"secret values written to: {found}"
    names = {str(p.relative_to(sub.job_dir)) for p in files if sub.job_dir in p.parents}
    assert {"pretrain_sbatch.sh", "_CONFIG", "_TASKS", "pretrain/code/config.yaml", "pretrain/code/manifest.json",
            f"pretrain/sbatch_ultra3.pretrain_{sub.slurm_id}.out",
            f"pretrain/log-ultra3.pretrain_{sub.slurm_id}_0.out"} <= names, sorted(names)
    assert home / "jobs" / f"{sub.id}.json" in files and home / "nemorun" / ".slurm_jobs" in files

    # the batch script runs under `set -x`: the setup lines that read the secrets ran and were logged,
    # but not traced with their values
    trace = (sub.task_dir / f"sbatch_ultra3.pretrain_{sub.slurm_id}.out").read_text()
    assert "sha256sum" in trace and "job exited with code 3" in trace


def test_local_job_gets_secrets_from_its_environment_and_writes_them_nowhere(cli, home, tmp_path):
    proof = tmp_path / "proof"
    proof.mkdir()
    setup = "[" + ", ".join("'" + line.replace("'", "''") + "'" for line in hash_lines(proof)) + "]"

    r = cli("pretrain", "-c", "tiny", f"run.setup={setup}", env=SECRETS)

    assert r.rc == 1 and PREFLIGHT.search(r.err), r.out + r.err
    assert_received(proof)
    job_id = re.search(r"^submitted (\S+) \(pid \d+\)$", r.out, re.M).group(1)
    logs = jobs(cli, "logs", job_id, env=SECRETS)
    assert not leaks_in_text(stdout=r.out, stderr=r.err, logs=logs.out + logs.err)
    found, files = leaks_in_files(home)
    assert not found, f"secret values written to: {found}"
    assert home / "jobs" / f"{job_id}.json" in files and any(p.name == "log-local.out" for p in files)
