"""`ultra3 pipe` run: the planned steps submitted (on Slurm all at once, each after the steps it waits for) or run
one at a time, followed, and a failed step's dependents stopped; the pipe's record keeps every step."""

from __future__ import annotations

import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .. import pipe_graph, pipe_records
from ..errors import JobFailed, UserError
from .pipe import PipeOptions, Step, left_out_lines, plan


def run_pipe(options: PipeOptions) -> None:
    if options.full and not options.dry_run:
        raise UserError("--full shows more of a dry run: give it with --dry-run")
    if options.run and options.batch:
        raise UserError("--run and --batch: choose one (--run follows the pipe, --batch returns after submitting)")
    path, steps, left = plan(options)
    todo = [s for s in steps if not s.skipped]
    from ..executors import executor

    chains = bool(todo) and executor(todo[0].job.executor).chains
    if todo and not chains and options.mode == "detached":  # the dry run refuses it too
        raise UserError(f"--batch {options.batch}: the {todo[0].job.executor} executor cannot chain jobs; run the "
                        f"pipe with --run {options.batch} (it runs the steps one after another)")
    if options.dry_run:
        from .pipe_show import print_plan

        print_plan(path, steps, options, left_out_lines(left))
        return
    for line in left_out_lines(left):
        print(line)
    for step in steps:
        if step.skipped:
            done = ", ".join(f"{m['name']}:v{m['version']}" for m in step.reused)
            print(f"{step.entry.id}: skipped, done by {step.reused[0].get('producer')} ({done})")
        elif step.again:
            print(f"{step.entry.id}: runs again: {step.again}")
    if not todo:
        print("every step already completed with this config; --force re-runs them")
        return
    pipe_id = f"pipe-{path.stem}_{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    print(f"pipe: {pipe_id}", flush=True)
    pipe = _Pipe(pipe_id, path, steps)
    if chains:
        _submit_all(pipe, todo)
        if options.mode == "detached":
            _next(pipe)
            return
    try:
        _attend(pipe, todo, options, submit=not chains)
    except KeyboardInterrupt:
        if chains:
            print(f"\ndetached; the jobs of {pipe_id} keep running, each after the steps it waits for",
                  file=sys.stderr)
            _next(pipe)
        else:
            pipe.not_run([s for s in todo if s.entry.id not in pipe.records], "the pipe was stopped")
            print(f"\nstopped; started: {', '.join(pipe.records) or 'none'}. Re-run the same command to resume where "
                  f"it stopped; `nemotron jobs status {pipe_id}` shows every step", file=sys.stderr)
        raise SystemExit(130) from None


class _Pipe:
    """One submission of a pipe: the jobs of its steps so far and its record, which holds every step (those
    skipped, and those not started yet or never, with why)."""

    def __init__(self, pipe_id: str, path: Path, steps: list[Step]) -> None:
        self.id, self.path, self.steps = pipe_id, path, steps
        self.records: dict[str, Any] = {}  # step id -> its job's record
        self.held = {s.entry.id: ("SKIPPED", f"done by {s.reused[0].get('producer')}") if s.skipped else
                     ("WAITING", "not submitted yet") for s in steps}

    def not_run(self, steps: list[Step], why: str) -> None:
        self.held.update({s.entry.id: ("NOT RUN", why) for s in steps})
        self.save()

    def save(self) -> None:
        pipe_records.save(self.id, self.path, [
            {"id": s.entry.id, "stage": s.entry.stage.name, "after": [a.entry.id for a in s.after],
             **({"job": self.records[s.entry.id].id} if s.entry.id in self.records else
                dict(zip(("job", "state", "reason"), ("", *self.held[s.entry.id]))))} for s in self.steps])


def _submit(step: Step, pipe: _Pipe):
    from ..executors import executor
    from ..records import save

    for finding in step.job.report.findings:
        print(f"{step.entry.id}: {finding.line()}", file=sys.stderr)
    where = executor(step.job.executor)
    after = [pipe.records[s.entry.id] for s in step.after] if where.chains else []  # else: run in turn
    record = where.submit(step.job, step.job_id, after)
    record.submitted, record.argv, record.pipe = time.time(), sys.argv, pipe.id
    save(record)
    pipe.records[step.entry.id] = record
    return record


def _submit_all(pipe: _Pipe, todo: list[Step]) -> None:
    """Every step at once, each after the steps it waits for (`todo` is in an order of the graph)."""
    from ..executors import executor

    try:
        for step in todo:
            record = _submit(step, pipe)
            where = executor(record.executor)
            waits = ", ".join(str(where.scheduler_id(pipe.records[s.entry.id])) for s in step.after)
            waiting = f", after {waits}" if waits else ""
            print(f"{step.entry.id}: submitted {record.id} ({where.where(record)}{waiting})", flush=True)
    finally:
        if pipe.records:  # else nothing was submitted
            pipe.not_run([s for s in todo if s.entry.id not in pipe.records], "the pipe's submission stopped "
                                                                              "before it")


def _attend(pipe: _Pipe, todo: list[Step], options: PipeOptions, submit: bool) -> None:
    """Follow each step in turn (submitting it first where nothing chains them); a failed step stops the steps
    that wait for it, directly or through others (on Slurm, Slurm cancels them), and the others go on. Raises
    JobFailed at the end, naming each failure and the steps it stopped."""
    from .. import jobs

    waits = {s.entry.id: [a.entry.id for a in s.after] for s in todo}
    failed: list[tuple[Step, Any, Any]] = []
    lost: dict[str, str] = {}  # step id -> the failed step it waits for
    if submit:
        pipe.save()  # every step, before the first starts
    for step in todo:
        name = step.entry.id
        if name in lost:
            if name not in pipe.records:
                pipe.not_run([step], f"waits for {lost[name]}, which failed")
            what = _wait_terminal(pipe.records[name]) if name in pipe.records else "not run"
            print(f"{name}: {what}: it waits for {lost[name]}, which failed", file=sys.stderr)
            continue
        if submit:
            _submit(step, pipe)
            pipe.save()
        record = pipe.records[name]
        print(f"== {name}: {record.id} ==", flush=True)
        final = jobs.follow(record, sys.stdout)
        if final.state != "COMPLETED":
            print(f"{name}: {record.id} {final.state}", file=sys.stderr)
            failed.append((step, record, final))
            for later in pipe_graph.dependents(name, waits):
                lost.setdefault(later, name)
    if failed:
        _fail(pipe.id, failed, lost, options, cancelled=not submit)
    print(f"{pipe.id} COMPLETED")
    for line in _ends(pipe, completed=True):
        print(line)


def _ends(pipe: _Pipe, completed: bool) -> list[str]:
    """What the stages of the pipe's steps say at its end (the evaluations side by side), from each step's job or,
    for a skipped one, the output it reused."""
    by_stage: dict[Any, list[str]] = {}
    for step in pipe.steps:
        made = pipe.records[step.entry.id].id if step.entry.id in pipe.records else \
            step.reused[0]["path"] if step.reused else None
        if made and step.entry.stage.parts().pipe_end:
            by_stage.setdefault(step.entry.stage, []).append(made)
    return [line for stage, made in by_stage.items() for line in stage.parts().pipe_end(made, completed)]


def _fail(pipe_id: str, failed: list, lost: dict[str, str], options: PipeOptions, cancelled: bool) -> None:
    from .. import jobs

    parts = []
    for step, record, final in failed:
        stopped = [name for name, cause in lost.items() if cause == step.entry.id]
        reason = final.reason or jobs.failure_reason(record)
        parts.append(f"pipe step {step.entry.id} ({record.id}) {final.state}: {reason}"
                     + (f"; {'cancelled' if cancelled else 'not run'} because of it: {', '.join(stopped)}"
                        if stopped else ""))
    first = failed[0][0].entry.id
    error = JobFailed(f"{'; '.join(parts)}. Fix it, then `{_command(options)}` again resumes (completed steps are "
                      f"skipped), --from {first} starts at it, --force re-runs every step; "
                      f"`nemotron jobs status {pipe_id}` shows every step")
    error.exit_code = failed[0][2].exit_code or 1
    raise error


def _command(options: PipeOptions) -> str:
    """The pipe's own command line, to run again: the same config, profile, selection and overrides."""
    flags = [("-c", options.config), ("--run", options.run), ("--batch", options.batch),
             ("--env-file", options.env_file), ("--from", options.start), ("--to", options.stop)]
    return shlex.join(["ultra3", "pipe", *(x for flag, value in flags if value for x in (flag, value)),
                       *options.overrides])


def _wait_terminal(record, timeout: float = 60) -> str:
    from .. import jobs

    deadline = time.monotonic() + timeout
    while True:
        st = jobs.state(record)
        if st.done or time.monotonic() > deadline:
            return f"{st.state}{f' ({st.reason})' if st.reason else ''}"
        time.sleep(1)


def _next(pipe: _Pipe) -> None:
    print("next:")
    print(f"  nemotron jobs status {pipe.id}")
    last = list(pipe.records.values())[-1]
    print(f"  nemotron jobs logs {last.id} --follow")
    print(f"  nemotron jobs cancel {pipe.id}")
    for line in _ends(pipe, completed=False):
        print(line)

