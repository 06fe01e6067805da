"""Shared fixtures: the real CLI in a subprocess, a private state dir per test, sample profiles,
and the local Slurm cluster (scripts/slurm-local/start.sh)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the CLI runs in hundreds of subprocesses: let them compile the launcher once and reuse it, as an install does
# (a machine that exports PYTHONDONTWRITEBYTECODE makes each start recompile every module, 0.2 s)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
BIN = Path(sys.executable).parent
SECRETS = {"HF_TOKEN": "hf_FAKEtoken1234567890abcdef", "WANDB_API_KEY": "wandbFAKEkey0987654321fedcba"}

SAMPLE_ENV_TOML = """
[ci]
executor = "slurm"
account = "ultra3"
partition = "debug"
gpu = "h100"
gpus_per_node = 1
time = "00:05:00"
container_image = ""            # the nodes' own Python: the launcher's venv on this machine

[ci-cpu]
extends = "ci"
gpus_per_node = 0

[blackwell]
executor = "slurm"
account = "ultra3"
partition = "batch"
gpu = "b200"
gpus_per_node = 8
time = "04:00:00"
container_image = "/lustre/images/ultra3-train.sqsh"
mounts = ["/lustre:/lustre"]
exclusive = true
build_cache_dir = "/lustre/images/ultra3"
[blackwell.env]
NCCL_DEBUG = "WARN"

[hopper]
extends = "blackwell"
gpu = "h100"

[workstation]
executor = "local"
gpu = "h100"
"""
# the RL stages' cluster: a GB200 Slurm profile, added to env.toml by the `gb200` fixture
GB200 = """
[gb200]
executor = "slurm"
account = "ultra3"
partition = "batch"
gpu = "gb200"
gpus_per_node = 4
time = "04:00:00"
container_image = "/lustre/images/nemo-rl.sqsh"
mounts = ["/lustre:/lustre"]
"""


MODULE_MARKS = re.compile(r"^pytestmark = \[?(pytest\.mark\.\w+(?:, pytest\.mark\.\w+)*)", re.M)


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """A module whose every test carries a mark the -m expression excludes (`not slurm and not heavy`, the
    fast tier) is not even imported: its imports (torch, Ray) cost seconds."""
    expr = config.getoption("markexpr") or ""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    found = MODULE_MARKS.search(collection_path.read_text())
    marks = re.findall(r"pytest\.mark\.(\w+)", found.group(1)) if found else []
    return True if any(f"not {mark}" in expr for mark in marks) else None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """The Slurm tests share one cluster and time what it does: under xdist (`--dist loadgroup`, the README's
    test command) they run one after another on one worker while the others take the rest."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private NEMOTRON_HOME and a working directory holding the sample env.toml."""
    state = tmp_path / "state"
    work = tmp_path / "work"
    work.mkdir()
    (work / "env.toml").write_text(SAMPLE_ENV_TOML)
    monkeypatch.setenv("NEMOTRON_HOME", str(state))
    monkeypatch.delenv("NEMORUN_HOME", raising=False)
    monkeypatch.delenv("NEMOTRON_ENV_FILE", raising=False)
    monkeypatch.chdir(work)
    return state


@pytest.fixture
def gb200(home) -> Path:
    """The working directory's env.toml with a GB200 Slurm profile (4 GPUs a node) added: the RL stages' cluster."""
    Path("env.toml").write_text(Path("env.toml").read_text() + GB200)
    return home


@pytest.fixture
def cli_here(home, capsys, monkeypatch):
    """The same commands run in this process (the console scripts' own entry points, without an interpreter
    start-up each): for the long tables of bad input."""
    from ultra3 import findings
    from ultra3.cli.app import nemotron_main, ultra3_main

    def run(*args: str, prog: str = "ultra3", env: dict | None = None) -> Result:
        monkeypatch.setenv("ULTRA3_VERBOSE", "")  # recorded, so that what `-v` sets in the process goes after the test
        monkeypatch.delenv("ULTRA3_VERBOSE")
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(findings, "_skipped", set())  # a new process names each damaged file again
        monkeypatch.setattr(sys, "argv", [prog, *args])
        with pytest.raises(SystemExit) as exit_:
            (ultra3_main if prog == "ultra3" else nemotron_main)()
        out = capsys.readouterr()
        return Result(exit_.value.code or 0, out.out, out.err)

    return run


@pytest.fixture
def cli(home):
    """Run the installed console script (`ultra3 ...` or `nemotron ...`) as a user would."""

    def run(*args: str, prog: str = "ultra3", env: dict | None = None, timeout: float = 300) -> Result:
        full_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}
        p = subprocess.run([str(BIN / prog), *args], capture_output=True, text=True, env=full_env, timeout=timeout)
        return Result(p.returncode, p.stdout, p.stderr)

    return run


def slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return p.returncode == 0 and any(s in p.stdout for s in ("idle", "mixed", "allocated", "completing"))


@pytest.fixture(scope="session")
def slurm():
    """The local cluster. Skips where none is reachable, except in CI, where that is a failure."""
    if not slurm_up():
        if os.environ.get("CI"):
            pytest.fail("no Slurm cluster in CI: scripts/slurm-local/start.sh should have started one")
        pytest.skip("no Slurm cluster reachable (run scripts/slurm-local/start.sh as root)")
    return True


def squeue_ids() -> set[str]:
    if shutil.which("squeue") is None:
        return set()
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    return set(out.split())


def kill_session(sid: int, keep: int | None = None) -> None:
    """SIGKILL every live process of session `sid` but `keep`, as a node failure or `scancel --signal=KILL` does
    (a run's pool workers and embedded Ray sit in process groups of their own); a zombie left unreaped stays."""
    def live(pid: int) -> bool:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return False
        return fields[0] not in ("Z", "X") and int(fields[3]) == sid and pid != keep

    while pids := [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if live(pid)]:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def our_jobs(where: Path | str) -> set[str]:
    """The queued Slurm jobs a test submitted itself: their work dir or output file is under `where` (its tmp dir,
    which holds its NEMOTRON_HOME). On a shared cluster a test waits for, cancels and counts only these."""
    if shutil.which("squeue") is None:
        return set()
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z %o"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if f"{where}/" in line}


def wait_for(predicate, timeout: float = 60, interval: float = 0.5):
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A directory no one may write in: a read-only tmpfs as root (who writes anywhere else), else mode 555."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=True)


def free_ports(n: int) -> list[int]:
    """n TCP ports free on 127.0.0.1 right now (for servers a test starts)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# The inputs of the shipped training configs that no artifact store holds in a test: paths on a cluster
# (for a Slurm profile, a path missing on this machine is a warning).
INPUTS = {("pretrain", "default"): ["dataset.blend_path=/lustre/data/blend.json",
                                    "phase2.blend_path=/lustre/data/phase2/blend.json"],
          ("pretrain", "long_context"): ["dataset.blend_path=/lustre/data/long/blend.json",
                                         "dataset.mix.blend_path=/lustre/data/phase2/blend.json",
                                         "recipe.pretrained_checkpoint=/lustre/ckpt/pretrain"],
          ("data prep pretrain", "long_context"): ["datasets=[{name: books, path: /lustre/corpus/books, weight: 1}]"],
          ("sft", "default"): ["dataset.packed_dir=/lustre/data/sft",
                               "recipe.pretrained_checkpoint=/lustre/ckpt/pretrain"],
          ("sft", "tiny"): ["recipe.pretrained_checkpoint=/lustre/ckpt/pretrain-tiny"],
          ("convert megatron-to-hf", "default"): ["megatron_checkpoint=/lustre/ckpt/sft"],
          ("convert megatron-to-hf", "tiny"): ["megatron_checkpoint=/lustre/ckpt/sft-tiny"],
          ("eval", "default"): ["checkpoint=/lustre/ckpt/sft-hf"]}
SANDBOX = "sandbox.image=/lustre/images/nemo-skills-sandbox.sqsh"
RL_INPUTS = {"rl rlvr": ["policy=/lustre/ckpt/sft-hf", "data.dir=/lustre/data/rl", SANDBOX],
             "rl teacher": ["policy=/lustre/ckpt/rlvr-hf", "data.dir=/lustre/data/rl"],
             "rl mopd": ["policy=/lustre/ckpt/rlvr-hf", "data.dir=/lustre/data/rl",
                         "teachers.general=/lustre/ckpt/rlvr-hf", SANDBOX]}
RL_EXTRA = {("rl teacher", "swe"): ["sif_dir=/lustre/sif"]}
RL_JUDGES = ["judges.genrm_model=/lustre/models/genrm"]  # GenRM has no public default


def inputs(stage: str, config: str) -> list[str]:
    """What the stage's inputs need on the command line for a dry run with an empty artifact store."""
    return (INPUTS.get((stage, config), []) + RL_INPUTS.get(stage, []) + RL_EXTRA.get((stage, config), [])
            + (RL_JUDGES if stage in RL_INPUTS else []))


def stage_config(config_dir: str, name: str = "tiny") -> dict:
    """A shipped stage config with its `defaults:` chain, as the launcher layers it before the profile and the
    command line: every key a runtime takes (a data prep's `run` and `job` aside), for configs tests hand to it."""
    from ultra3.config import find_config, load_layers, merge, unflatten

    flat, _ = merge(load_layers(find_config(config_dir, name), config_dir))
    return {k: v for k, v in unflatten(flat).items() if k != "run"}
