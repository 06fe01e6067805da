"""Where the shipped configs and runtime recipes are (inside an installed wheel, or at the top of a
source checkout), and where the launcher keeps its own state."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    installed = _PACKAGE / name  # pip install . puts configs/ and recipes/ inside the package
    return installed if installed.is_dir() else _PACKAGE.parents[1] / name


CONFIGS_DIR = _shipped("configs")
RECIPES_DIR = _shipped("recipes")
JOB_DIR_PLACEHOLDER = "@JOB_DIR@"  # ${job.dir} until the submission makes the job's dir


def config_names(config_dir: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS_DIR / config_dir).glob("*.yaml"))


def state_home() -> Path:
    """$NEMOTRON_HOME (default ~/.nemotron): the job registry and the job dirs of local runs. Absolute: a relative
    value means the directory it names from where the launcher started, never from a job's own code dir."""
    return Path(os.environ.get("NEMOTRON_HOME") or Path.home() / ".nemotron").expanduser().absolute()


def nemorun_home() -> Path:
    # not ".../nemo_run": NeMo-Run rewrites "/nemo_run" in container-less scripts
    return Path(os.environ.get("NEMORUN_HOME") or state_home() / "nemorun").expanduser().absolute()
