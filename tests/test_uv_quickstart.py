"""NVIDIA's quick start as its docs write it, `uv run nemotron ultra3 ...`, from a copy of this repo: uv builds the
project's environment from uv.lock (which must match pyproject.toml: --locked) and the dry runs print the job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_nvidia_profile import QUICK_START

pytestmark = pytest.mark.heavy  # downloads the launcher's dependencies

REPO = Path(__file__).resolve().parents[1]


def test_uv_run_nemotron_from_a_fresh_copy(tmp_path):
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv, "uv is in the test extra"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    clone = tmp_path / "clone"
    for name in files:
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    (clone / "env.toml").write_text(QUICK_START)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "NEMOTRON_ENV_FILE")}
    env["NEMOTRON_HOME"] = str(tmp_path / "home")
    for stage in ("pretrain", "sft"):
        r = subprocess.run([uv, "run", "--locked", "nemotron", "ultra3", stage, "-c", "tiny", "--run", "YOUR-CLUSTER",
                            "--dry-run", "--full"], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "#SBATCH --nodes=1\n" in r.stdout and "#SBATCH --gpus-per-node=1\n" in r.stdout
        assert "#SBATCH --account=YOUR-ACCOUNT\n" in r.stdout
    assert (clone / ".venv" / "bin" / "nemotron").exists()  # uv's own environment, not this test's
