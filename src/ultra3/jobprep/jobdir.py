"""What every job directory holds: the resolved config, the runtime recipes and a provenance manifest.
Secrets are never written here: the job reads them from its environment."""

from __future__ import annotations

import hashlib
import json
import platform
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .. import __version__
from ..job import Job
from ..paths import RECIPES_DIR
from .plan import CONFIG_FILE

PACKAGES = ("ultra3-launcher", "nemo_run", "leptonai", "omegaconf", "typer", "PyYAML")


def new_job_id(job: Job) -> str:
    # NeMo-Run derives the experiment title from the part before the last "_"
    return f"{job.stage.slug}_{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def write_code_dir(job: Job, job_id: str, job_dir: str, code_dir: Path) -> dict:
    """Fill `code_dir` (the job's working directory); returns the manifest."""
    config = job.with_job({"id": job_id, "dir": job_dir})
    text = yaml.safe_dump(config, sort_keys=False)
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / CONFIG_FILE).write_text(text)
    # the runtimes with their modules, templates and the tiny samples
    shutil.copytree(RECIPES_DIR, code_dir / "recipes", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    dirs_exist_ok=True)
    manifest = {
        "job_id": job_id,
        "stage": job.stage.name,
        "config": job.options.config,
        "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "profile": job.profile.name if job.profile else None,
        "executor": job.executor,
        "mode": job.mode,
        "argv": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "launcher": __version__,
        "packages": {name: _version(name) for name in PACKAGES},
        "git": _git_state(Path(__file__).resolve().parents[3]),
        **({"fork": job.config["job"]["fork"]} if job.config["job"].get("fork") else {}),
    }
    (code_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _version(name: str) -> str | None:
    from importlib import metadata  # 30 ms: only when a job dir is written

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_state(repo: Path) -> dict | None:
    """Commit and uncommitted diff of the launcher's checkout (None for an installed wheel)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10).stdout

    if not (repo / ".git").exists():
        return None
    try:
        diff = git("diff", "HEAD")
        return {"commit": git("rev-parse", "HEAD").strip(), "dirty": bool(diff.strip()), "diff": diff}
    except (OSError, subprocess.SubprocessError):
        return None
