"""The dry run: the compiled job as it would be submitted, a summary first, and nothing written anywhere."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import yaml

from .. import cost, run_plan
from ..artifacts import optional, source_line

from ..compile import changed_keys
from ..compile_cache import dry_run_line
from ..job import Job
from ..executors import executor
from ..leaks import masked
from ..lineage import said


def _section(out: TextIO, title: str) -> None:
    out.write(f"\n== {title} ==\n")


def _table(out: TextIO, title: str, rows: list[tuple[str, str]]) -> None:
    _section(out, title)
    width = max((len(label) for label, _ in rows), default=0)
    for label, value in rows:
        out.write(f"{label:<{width}}  {value}\n")


def print_dry_run(job: Job, out: TextIO | None = None, show_full: bool = False) -> None:
    """The summary (where it runs, findings, changed values, artifacts, resources, tables, cost); with
    `show_full` also the compiled config, the long blocks and the job's script."""
    out = out or sys.stdout  # the stream of the moment, not the one at import
    run = job.config["run"]
    where = (f"profile '{job.profile.name}' ({job.executor}, {job.profile.file})" if job.profile
             else "local (this machine)")
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
        value = masked(flat.get(key), key)
        out.write(f"{key:<{width}} = {_inline(value)}  <- {changed[key]}\n")

    _section(out, "inputs and outputs (artifacts)")
    for inp, src in zip(job.stage.inputs, job.sources):
        if src:
            out.write(source_line(inp.key, src) + "\n")
        else:
            why = f"{inp.unless} is set" if inp.unless and job.flat.get(inp.unless) else \
                f"{inp.when} is null" if inp.when and job.flat.get(inp.when) in (None, "") else \
                f"none yet, optional: {inp.optional_when} is set" if optional(inp, job.config) else "optional, unset"
            out.write(f"{inp.key}: not needed ({why})\n")
    if fork := job.config["job"].get("fork"):
        out.write(f"checkpoint.load = {fork['path']} at iteration {fork['iteration']}  ({said(fork)})\n")
    for made in job.config["job"]["produces"]:
        out.write(f"produces {made['name']} ({made['kind']}) at {made['path']}\n")
    if not job.stage.inputs and not job.config["job"]["produces"]:
        out.write("(none)\n")

    _section(out, "resources")
    gpus = run.get("gpus_per_node") or 0
    nodes = run.get("nodes") or 1
    gpu = job.config["cluster"].get("gpu")
    total = f"{nodes * gpus} GPU{'s' if nodes * gpus != 1 else ''}{f' ({gpu})' if gpu else ''}"
    out.write(f"nodes {nodes} x gpus_per_node {gpus} = {total}, time {run.get('time') or '-'}\n")
    if cache := dry_run_line(job):
        out.write(cache + "\n")
    run_keys = sorted(k for k in job.origin if k.startswith(("run.", "cluster.")) and k in flat)
    width = max((len(k) for k in run_keys), default=0)
    for key in run_keys:  # where each value of the job's shape and placement came from
        value = masked(flat[key], key)
        out.write(f"{key:<{width}} = {_inline(value)}  <- {job.origin[key]}\n")
    for name, rows in job.report.tables.items():
        _table(out, name, rows)

    if plan := run_plan.rows(job):  # a Slurm job of many allocations
        _table(out, "long run", plan)

    if estimate := cost.estimate(job):
        _section(out, "estimated cost")
        out.write(cost.format_line(estimate) + "\n")

    where = executor(job.executor)
    config = {"run": job.config["run"], **{k: v for k, v in job.config.items() if k != "run"}}
    full = {"compiled config": yaml.safe_dump(masked(config), sort_keys=False), **job.report.blocks}
    if shown := where.render(job, None):
        full[where.shown_as] = shown
    if show_full:
        for title, text in full.items():
            _section(out, title)
            out.write(text if text.endswith("\n") else text + "\n")
    else:
        lines = sum(len(text.splitlines()) + 2 for text in full.values())  # with each title and its blank line
        out.write(f"\nNot shown ({lines} lines; add --full): {', '.join(full)}.\n")
    out.write("\nDry run: nothing was written or submitted.\n")


def _inline(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
