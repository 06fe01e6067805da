"""The dry run: the compiled job as it would be submitted, and nothing written anywhere."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import yaml

from .compile import JOB_DIR_PLACEHOLDER, Job, changed_keys
from .launch.plan import job_command, local_command, slurm_spec, task_name
from .launch.sbatch import render_sbatch
from .profiles import SECRET_NAME

MASK = "******"


def mask(tree: Any, key: str = "") -> Any:
    if isinstance(tree, dict):
        return {k: mask(v, k) for k, v in tree.items()}
    if isinstance(tree, list):
        return [mask(v, key) for v in tree]
    return MASK if key and SECRET_NAME.search(key) and tree not in (None, "") else tree


def _section(out: TextIO, title: str) -> None:
    out.write(f"\n== {title} ==\n")


def print_dry_run(job: Job, out: TextIO = sys.stdout) -> None:
    run = job.config["run"]
    where = f"profile '{job.profile.name}' ({job.executor}, {job.profile.file})" if job.profile else "local (this machine)"
    out.write(f"ultra3 {job.stage.name}: config {job.options.config} ({job.config_path.name}), {where}, "
              f"mode {job.mode}\n")

    for finding in job.report.findings:
        out.write(f"{finding.line()}\n")

    _section(out, "values not from the stage default (stage config < profile < command line)")
    changed = changed_keys(job)
    flat = job.flat
    if not changed:
        out.write("(none)\n")
    width = max((len(k) for k in changed), default=0)
    for key in sorted(changed):
        value = MASK if SECRET_NAME.search(key) else flat.get(key)
        out.write(f"{key:<{width}} = {_inline(value)}  <- {changed[key]}\n")

    _section(out, "compiled config")
    config = {"run": job.config["run"], **{k: v for k, v in job.config.items() if k != "run"}}
    out.write(yaml.safe_dump(mask(config), sort_keys=False))

    _section(out, "resources")
    gpus = run.get("gpus_per_node") or 0
    nodes = run.get("nodes") or 1
    gpu = job.config["cluster"].get("gpu")
    total = f"{nodes * gpus} GPU{'s' if nodes * gpus != 1 else ''}{f' ({gpu})' if gpu else ''}"
    out.write(f"nodes {nodes} x gpus_per_node {gpus} = {total}, time {run.get('time') or '-'}\n")
    for name, rows in job.report.tables.items():
        _section(out, name)
        label_width = max((len(label) for label, _ in rows), default=0)
        for label, value in rows:
            out.write(f"{label:<{label_width}}  {value}\n")

    if job.executor == "slurm":
        spec = slurm_spec(job, job_dir=JOB_DIR_PLACEHOLDER)
        _section(out, "sbatch script (as NeMo-Run submits it)")
        out.write(render_sbatch(spec) + "\n")
    elif job.executor == "ray":
        _section(out, f"Ray job (Jobs API at {run['address']})")
        out.write(f"entrypoint:  {' '.join(job_command())}\nworking_dir: {JOB_DIR_PLACEHOLDER}/{task_name(job)}/code\n"
                  f"env_vars:    {_inline(mask(run.get('env') or {}))}\n")
    else:
        _section(out, "local command")
        out.write(" ".join(local_command(job)) + "\n")
    out.write("\nDry run: nothing was written or submitted.\n")


def _inline(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
