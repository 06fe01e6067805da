"""`ultra3 pipe --dry-run`: the chain as it would be submitted: steps, their dependency edges, where
every input comes from, each job's script and the chain's estimated cost. Nothing is written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..config import CLI_SOURCE


def print_plan(path: Path, steps: list, options, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # the stream of the moment, not the one at import
    from ..executors import executor

    first = next(s.job for s in steps if s.job)
    where = f"profile '{first.profile.name}' ({first.executor})" if first.profile else "local (this machine)"
    chains = executor(first.executor).chains
    out.write(f"ultra3 pipe: config {path.stem} ({path.name}), {where}, mode {options.mode}\n")
    order = ("submitted at once, each after the step before it and those it reads from: afterok" if chains
             else "run one after another, stopping at the first failure")
    out.write(f"steps, in order ({order}):\n")
    width = max(len(s.entry.id) for s in steps)
    for n, step in enumerate(steps, 1):
        job = step.job
        what = f"ultra3 {step.entry.stage.name} -c {step.entry.config}"
        if step.skipped:
            done = ", ".join(f"{m['name']}:v{m['version']}" for m in step.reused)
            state = f"skip: done by {step.reused[0].get('producer')} ({done}); --force re-runs it"
        else:
            state = f"run as {step.job_id}" + (f", after {', '.join(s.entry.id for s in step.after)}"
                                               if step.after else "")
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
    _cost(steps, out)
    for step in steps:
        if step.skipped:
            continue
        after = [f"<Slurm job of {s.entry.id}>" for s in step.after]
        script = executor(step.job.executor).render(step.job, step.job_id, after)
        if script:
            out.write(f"\n== {step.entry.id}: {'sbatch script' if chains else 'command'} ==\n{script.rstrip()}\n")
    out.write("\nDry run: nothing was written or submitted.\n")


def _cost(steps: list, out: TextIO) -> None:
    from ..cost import estimate, format_line, total

    out.write("\n== estimated cost ==\n")
    estimates = []
    for step in steps:
        if step.skipped or (found := estimate(step.job)) is None:
            continue
        found.stage = step.entry.id
        estimates.append(found)
        out.write(format_line(found) + "\n")
    if estimates:
        out.write(format_line(total(estimates)) + "\n")
