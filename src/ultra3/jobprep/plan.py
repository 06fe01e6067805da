"""From a compiled job to what runs: the in-job command, and the Slurm request that wraps it.

The same SlurmSpec builds NeMo-Run's SlurmExecutor at submission and our rendering of its sbatch
script in the dry run, so the two cannot drift apart (tests compare them on a real cluster).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from ..contract import CONFIG_FILE, CONTINUE_SIGNAL, ENTRY_MODULE, HEAD_NODE_VAR
from ..forms import IMAGE, MOUNT
from ..job import Job
from ..paths import JOB_DIR_PLACEHOLDER


def task_name(job: Job) -> str:
    return "-".join(job.stage.words)


def job_command(python: str = "python") -> list[str]:
    """The in-job entry point, run in the code dir on every node: preflight, then torchrun / Ray."""
    return [python, "-m", ENTRY_MODULE, "--config", CONFIG_FILE]


@dataclass
class SlurmSpec:
    task: str
    job_name: str
    account: str
    nodes: int
    ntasks_per_node: int
    time: str
    partition: str | None = None
    qos: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    exclusive: bool | None = None
    constraint: str | None = None
    additional: dict[str, str] = field(default_factory=dict)
    container_image: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)  # values already shell-quoted
    setup_lines: str | None = None
    command: list[str] = field(default_factory=job_command)
    job_dir: str = ""  # the experiment dir: <job_dir>/<task>/code is the working directory

    def __post_init__(self) -> None:
        """NeMo-Run writes the image and the mounts into the srun line unquoted, as our rendering does: the
        config's checks (forms.IMAGE, forms.MOUNT) admit only single words that need no quoting."""
        bad = [v for v in [self.container_image or ""] if not IMAGE(v)] + \
              [v for v in self.container_mounts if not MOUNT(v)]
        if bad:
            raise ValueError(f"{bad[0]!r} would reach the batch script's srun line unquoted; "
                             "the config's checks should have refused it")


def slurm_spec(job: Job, job_dir: str) -> SlurmSpec:
    run: dict[str, Any] = job.config["run"]
    env = {k: shlex.quote(str(v)) for k, v in (run.get("env") or {}).items()}
    # Multi-node torchrun/Ray need the first node's address; NeMo-Run's script computes it.
    env[HEAD_NODE_VAR] = "$head_node_ip"
    gpus = run.get("gpus_per_node") or None
    return SlurmSpec(
        task=task_name(job),
        job_name=f"{run.get('job_name_prefix') or 'ultra3.'}{task_name(job)}",
        account=run["account"],
        nodes=run.get("nodes") or 1,
        ntasks_per_node=1,  # one launcher per node; it starts the per-GPU ranks
        time=run.get("time") or "04:00:00",
        partition=run.get("partition"),
        qos=run.get("qos"),
        gpus_per_node=gpus,
        cpus_per_task=run.get("cpus_per_task"),
        mem=run.get("mem"),
        exclusive=True if run.get("exclusive") else None,
        constraint=run.get("constraint"),
        additional={**{k: run[k] for k in ("reservation", "segment") if run.get(k)}, **_signal(job)},
        container_image=run.get("container_image") or None,  # "": no container, on purpose
        container_mounts=list(run.get("mounts") or []),
        env_vars=env,
        setup_lines=_untraced([line.replace(JOB_DIR_PLACEHOLDER, job_dir) for line in run.get("setup") or []]),
        job_dir=job_dir,
    )


def _signal(job: Job) -> dict[str, str]:
    """Slurm signals the job's steps job.grace_s before its time limit: the stage saves and stops, and the
    job is requeued (recipes/attempts.py)."""
    grace = job.config["job"].get("grace_s")
    return {"signal": f"{CONTINUE_SIGNAL.removeprefix('SIG')}@{grace}"} if grace else {}


def _untraced(lines: list[str]) -> str | None:
    """NeMo-Run's batch script runs under `set -x`: a setup line reading a secret from the environment
    would be traced with its value into the log, so tracing is off around the profile's setup lines."""
    if not lines:
        return None
    return "\n".join(["{ set +x; } 2>/dev/null", *lines, "set -x"])


def local_command(job: Job) -> list[str]:
    return job_command(sys.executable)  # the launcher's own Python, which has PyYAML
