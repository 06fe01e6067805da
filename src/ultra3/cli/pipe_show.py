"""`ultra3 pipe --dry-run`: the pipe as it would be submitted: steps, the graph of what each waits for with its
critical path, where every input comes from, the pipe's estimated cost, and with --full each job's script.
Nothing is written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from .. import pipe_graph
from ..config import CLI_SOURCE

STEP_TABLES = ("phases",)  # the dry-run tables a pipe shows under its step (a pretraining run's token accounting)


def print_plan(path: Path, steps: list, options, left_out: list[str], out: TextIO | None = None) -> None:
    out = out or sys.stdout  # the stream of the moment, not the one at import
    from ..cost import estimate
    from ..executors import executor

    first = next(s.job for s in steps if s.job)
    where = f"profile '{first.profile.name}' ({first.executor})" if first.profile else "local (this machine)"
    chains = executor(first.executor).chains
    out.write(f"ultra3 pipe: config {path.stem} ({path.name}), {where}, mode {options.mode}\n")
    order = ("submitted at once, each after the steps it waits for: afterok; independent steps run side by side"
             if chains else "run one at a time in this order")
    out.write(f"steps ({order}; a step that fails stops only the steps that wait for it):\n")
    width = max(len(s.entry.id) for s in steps)
    for n, step in enumerate(steps, 1):
        job = step.job
        what = f"ultra3 {step.entry.stage.name} -c {step.entry.config}"
        if step.skipped:
            done = ", ".join(f"{m['name']}:v{m['version']}" for m in step.reused)
            state = f"skip: done by {step.reused[0].get('producer')} ({done}); --force re-runs it"
        else:
            state = (f"runs again: {step.again}; " if step.again else "") + f"run as {step.job_id}" + \
                (f", after {', '.join(s.entry.id for s in step.after)}" if step.after else "")
        out.write(f"  {n}. {step.entry.id:<{width}}  {what}  [{state}]\n")
        inputs = {inp.key for inp in step.entry.stage.inputs}
        for key, src in sorted(job.origin.items()):  # what the pipe config and the command line set
            if key not in inputs and (src == CLI_SOURCE or src.startswith(f"{path.name} [")):
                out.write(f"       {key} = {job.flat.get(key)!r}  <- {src}\n")
        for inp, src in zip(step.entry.stage.inputs, job.sources):
            if src:
                out.write(f"       {inp.key} = {src.path}  ({src.how})\n")
        for finding in job.report.findings:
            if finding.level != "note" or finding.key in {i.key for i in step.entry.stage.inputs}:
                out.write(f"       {finding.line()}\n")
        rows = [row for name in STEP_TABLES for row in job.report.tables.get(name, [])]
        for label, value in rows:
            out.write(f"       {label:<{max(len(r[0]) for r in rows)}}  {value}\n")
    for line in left_out:
        out.write(f"  {line}\n")
    estimates = {s.entry.id: found for s in steps if not s.skipped and (found := estimate(s.job)) is not None}
    critical = _graph(steps, estimates, width, out)
    _cost(estimates, critical, out)
    scripts = {}
    for step in steps:
        after = [f"<Slurm job of {s.entry.id}>" for s in step.after]
        if not step.skipped and (script := executor(step.job.executor).render(step.job, step.job_id, after)):
            scripts[f"{step.entry.id}: {'sbatch script' if chains else 'command'}"] = script.rstrip()
    if options.full:
        for title, script in scripts.items():
            out.write(f"\n== {title} ==\n{script}\n")
    elif scripts:
        out.write(f"\nNot shown (add --full): the {'sbatch script' if chains else 'command'} of "
                  f"{', '.join(t.split(':')[0] for t in scripts)}.\n")
    out.write("\nDry run: nothing was written or submitted.\n")


def _graph(steps: list, estimates: dict, width: int, out: TextIO) -> list[str]:
    """Each step with the steps it waits for (`(after:)` where it reads none of their outputs), `after:` steps
    dropped and why, and the critical path by the estimated wall times, which it returns."""
    todo = [s for s in steps if not s.skipped]
    waits = {s.entry.id: [a.entry.id for a in s.after] for s in todo}
    hours = {name: e.wall_hours or 0.0 for name, e in estimates.items() if not e.unknown}
    critical = pipe_graph.critical_path(list(waits), waits, hours)
    out.write("\n== graph (<- the steps each waits for; * on the critical path) ==\n")
    for step in steps:
        mark = "*" if step.entry.id in critical else " "
        if step.skipped:
            out.write(f"{mark} {step.entry.id:<{width}}  done, skipped\n")
            continue
        edges = [a.entry.id + ("" if a.entry.id in step.reads else " (after:)") for a in step.after]
        dropped = [f"after: {name} dropped ({why})" for name, why in step.dropped]
        line = "; ".join(filter(None, [f"<- {', '.join(edges)}" if edges else "", *dropped]))
        out.write(f"{mark} {step.entry.id:<{width}}  {line}".rstrip() + "\n")
    unknown = [s for s in critical if s not in hours]
    out.write(f"critical path: {' -> '.join(critical)}"
              + (f" (no estimate for {', '.join(unknown)})" if unknown else "") + "\n")
    return critical


def _cost(estimates: dict, critical: list[str], out: TextIO) -> None:
    from ..cost import format_line, total

    out.write("\n== estimated cost ==\n")
    for name, found in estimates.items():
        found.stage = name
        out.write(format_line(found) + "\n")
    if estimates:
        out.write(format_line(total(list(estimates.values()), critical)) + "\n")
