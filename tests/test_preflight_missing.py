"""The in-job preflight in a Python without the runtime's packages (as the README's `pip install '.[data]'`
leaves it: no Megatron): `python -m recipes.launch` stops with its one PREFLIGHT FAILED line and exit 3, never
a traceback, for the config the launcher writes for `ultra3 pretrain -c tiny` and for every stage's checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipes import contract
from ultra3.stages import STAGES

MODULE_CHECKS = {"training_packages", "kernels", "quantize_packages", "data_prep_packages", "nemo_rl"}
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_", "PYTHON"))}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A virtual environment of this Python holding PyYAML only (the entry point reads its config with it)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "yaml").symlink_to(Path(yaml.__file__).parent)
    found = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('megatron'))"],
                           capture_output=True, text=True, env=ENV, check=True).stdout.strip()
    assert found == "None", f"the bare Python finds megatron: {found}"
    return python


def launch(python: str, code: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", contract.ENTRY_MODULE, "--config", contract.CONFIG_FILE], cwd=code,
                          env=ENV, capture_output=True, text=True, timeout=120)


def assert_preflight_failed(p: subprocess.CompletedProcess) -> str:
    """Exit 3, nothing on stderr, and one PREFLIGHT FAILED line (the last): its text."""
    assert p.returncode == contract.PREFLIGHT_EXIT, p.stdout + p.stderr
    assert p.stderr == "", p.stderr
    marked = [line for line in p.stdout.splitlines() if line.startswith(contract.PREFLIGHT_MARK)]
    assert len(marked) == 1 and p.stdout.splitlines()[-1] == marked[0], p.stdout
    return marked[0]


def test_the_tiny_pretraining_job_stops_in_its_preflight_without_megatron(cli, bare_python):
    r = cli("pretrain", "-c", "tiny")  # a real local job: its job dir holds the config the launcher wrote
    job_dir = Path(re.search(r"^job dir: (.+)$", r.err + r.out, re.M).group(1))
    line = assert_preflight_failed(launch(bare_python, job_dir / "pretrain" / "code"))
    assert "not importable: megatron.bridge (ModuleNotFoundError: No module named 'megatron')" in line, line
    assert "install the `train` extra" in line


def stage_config(tmp: Path, stage, **cfg) -> Path:
    code = tmp / "code"
    code.mkdir()
    (code / "recipes").symlink_to(Path(contract.__file__).parent)
    job = {"id": "job-1", "stage": stage.name, "dir": str(tmp), "launch": stage.launch,
           "recipe": f"recipes.{stage.recipe}", "checks": list(stage.checks), "inputs": []}
    config = {"run": {"nodes": 1, "gpus_per_node": 0}, "job": job, **cfg}
    (code / contract.CONFIG_FILE).write_text(yaml.safe_dump(config))
    return code


CASES = [*(pytest.param(s, {}, id=s.slug) for s in STAGES if MODULE_CHECKS & set(s.checks)),
         *(pytest.param(s, {"backend": "megatron"}, id=f"{s.slug}-megatron")
           for s in STAGES if "quantize_packages" in s.checks)]


@pytest.mark.parametrize("stage, cfg", CASES)
def test_every_stage_stops_in_its_preflight_on_a_missing_module(bare_python, tmp_path, stage, cfg):
    line = assert_preflight_failed(launch(bare_python, stage_config(tmp_path, stage, **cfg)))
    assert re.search(r"not (importable|installed)|NeMo RL is not importable", line), line


def test_a_check_that_crashes_stops_the_job_as_a_failed_one(bare_python, tmp_path):
    stage = next(s for s in STAGES if s.words == ("pretrain",))
    code = stage_config(tmp_path, stage)
    config = yaml.safe_load((code / contract.CONFIG_FILE).read_text())
    config["job"]["checks"], config["job"]["inputs"] = ["python_version", "inputs"], [{"name": "data"}]  # no key
    (code / contract.CONFIG_FILE).write_text(yaml.safe_dump(config))
    line = assert_preflight_failed(launch(bare_python, code))
    assert line.endswith(": the inputs check failed (KeyError: 'key')"), line
