"""`ultra3 pipe`: stages chained into one submission, each input wired to the output of an earlier stage.

The whole chain is compiled and checked before anything is submitted. A stage whose config digest
already completed for this profile is skipped and its artifacts reused (--force re-runs it). On Slurm
every stage is submitted at once, each after the step before it and the steps whose outputs it reads
(afterok; Slurm cancels it when one of those fails); elsewhere the stages run one after another and the
pipe stops at the first failure.
"""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import artifacts, pipe_records
from ..artifacts import Source
from ..compile import compile_job
from ..job import Job, Options
from ..config import CLI_SOURCE, Layer, find_config, flatten, read_yaml
from ..errors import InvalidConfig, JobFailed, UserError
from ..findings import Finding
from ..jobprep.jobdir import new_job_id
from ..profiles import load_profile
from ..schema import suggest
from ..stage import Stage
from ..stages import find_stage

CONFIG_DIR = "pipe"


@dataclass
class Entry:
    id: str  # its name in the pipe config, the prefix of its command-line overrides
    stage: Stage
    config: str
    overrides: dict[str, Any]  # flat, from the pipe config


@dataclass
class Step:
    entry: Entry
    job: Job | None  # None when its config has errors (the chain is then not submitted)
    reused: list[dict] = field(default_factory=list)  # the artifacts of an earlier identical run: skipped
    job_id: str = ""
    after: list["Step"] = field(default_factory=list)  # the steps it waits for
    outputs: dict[str, Source] = field(default_factory=dict)  # artifact kind -> what it makes (or made)

    @property
    def skipped(self) -> bool:
        return bool(self.reused)


@dataclass
class PipeOptions:
    config: str = "default"
    run: str | None = None
    batch: str | None = None
    dry_run: bool = False
    env_file: str | None = None
    start: str | None = None  # --from
    stop: str | None = None  # --to
    force: bool = False
    overrides: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "attached" if self.run else "detached" if self.batch else "local"


def load(name: str) -> tuple[Path, list[Entry]]:
    path = find_config(CONFIG_DIR, name)
    data = read_yaml(path)
    stages = data.get("stages")
    where = path.name
    _known(data, ("stages",), f"{where} ")
    if not isinstance(stages, dict) or not stages:
        raise UserError(f"{where}: `stages` must map each step's id to {{stage, config, overrides}}")
    entries = []
    for step_id, spec in stages.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("stage"), str):
            raise UserError(f"{where} stages.{step_id}: needs `stage: <name>` (e.g. `stage: data prep sft`)")
        _known(spec, ("stage", "config", "overrides"), f"{where} stages.{step_id}.")
        stage = find_stage(spec["stage"])
        if stage is None:
            raise UserError(f"{where} stages.{step_id}.stage: no stage '{spec['stage']}'")
        overrides = spec.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise UserError(f"{where} stages.{step_id}.overrides: must be a mapping of key: value")
        entries.append(Entry(str(step_id), stage, str(spec.get("config") or "default"), flatten(overrides)))
    return path, entries


def _known(table: dict, keys: tuple[str, ...], where: str) -> None:
    """A pipe config has these keys only: another one (`defaults:`, a misspelt `overides:`) would be dropped."""
    for key in table:
        if key not in keys:
            raise UserError(f"{where}{key}: unknown key; {suggest(str(key), list(keys))}")


def _select(entries: list[Entry], start: str | None, stop: str | None) -> tuple[list[Entry], list[Entry]]:
    """(the steps before --from, whose outputs are taken from the store, the steps to run)."""
    ids = [e.id for e in entries]
    for flag, value in (("--from", start), ("--to", stop)):
        if value is not None and value not in ids:
            raise UserError(f"{flag} {value}: no such step; the pipe's steps are {', '.join(ids)}")
    first = ids.index(start) if start else 0
    last = ids.index(stop) if stop else len(ids) - 1
    if last < first:
        raise UserError(f"--to {stop} comes before --from {start}")
    return entries[:first], entries[first:last + 1]


def _split_overrides(tokens: list[str], entries: list[Entry]) -> dict[str, list[str]]:
    """`pretrain.train.train_iters=20` reaches the step `pretrain` as `train.train_iters=20`."""
    ids = {e.id for e in entries}
    out: dict[str, list[str]] = {e.id: [] for e in entries}
    for token in tokens:
        step, _, rest = token.partition(".")
        if step not in ids or "=" not in rest:
            raise UserError(f"{token}: a pipe override is STEP.key=value with STEP one of {', '.join(out)}")
        out[step].append(rest)
    return out


def plan(options: PipeOptions) -> tuple[Path, list[Step]]:
    """Compile every step, wired to the outputs of the ones before it; every error of every step, or the
    chain ready to submit."""
    path, entries = load(options.config)
    profile_errors: list[Finding] = []  # reported once, not once per step
    if options.run or options.batch:
        profile_errors = load_profile(options.run or options.batch, options.env_file,
                                      "--run" if options.run else "--batch").errors
    before, chosen = _select(entries, options.start, options.stop)
    per_step = _split_overrides(options.overrides, entries)
    made: dict[str, Source] = {}  # artifact kind -> the newest maker in the chain so far
    made_as: dict[tuple[str, str], Source] = {}  # (kind, config) -> the same, for inputs of one config's output
    unmade: dict[str, str] = {}  # artifact kind -> the step that would make it but declares no output
    findings: list[Finding] = list(profile_errors)
    steps: list[Step] = []
    for entry in before + chosen:
        wired = {inp.key: src for inp in entry.stage.inputs for kind in reversed(inp.kinds)
                 if (src := next((made_as[kind, c] for c in inp.configs if (kind, c) in made_as), None)
                     if inp.configs else made.get(kind))}
        stage_options = Options(config=entry.config, run=options.run, batch=options.batch, dry_run=options.dry_run,
                                env_file=options.env_file, overrides=per_step[entry.id], wired=wired,
                                pipe_layer=Layer(f"{path.name} [{entry.id}]", entry.overrides))
        try:
            job = compile_job(entry.stage, stage_options)
        except InvalidConfig as e:
            unmade_keys = {inp.key: unmade[k] for inp in entry.stage.inputs for k in inp.kinds if k in unmade}
            findings += [Finding(f.level, f"{entry.id}: {f.key}", _unmade(unmade_keys[f.key], entry, f.key)
                                 if f.key in unmade_keys and f.message.startswith("no ") else f.message)
                         for f in e.findings if f not in profile_errors]
            job = None
        except UserError as e:
            findings.append(Finding("error", entry.id, str(e)))
            job = None
        step = Step(entry, job)
        if job and (entry in before or not options.force):
            step.reused = _completed(job, entry.stage)
        if entry in before and job and not step.reused:
            findings.append(Finding("error", entry.id, f"--from {options.start}: this earlier step has no completed "
                                                       "run of this config; start from it or leave --from out"))
        if job:
            findings += _unmade_inputs(entry, job, unmade, stage_options.pipe_layer.source)
        if job and not step.skipped:
            step.job_id = new_job_id(job)
            # after the nearest earlier step that runs (the chain's order), and after every step whose
            # output it consumes (a skipped step in between must not cut that edge)
            running = [s for s in steps if not s.skipped and s.job]
            consumed = {src.producer for src in job.sources if src and src.pending}
            step.after = [s for s in running if s.job_id in consumed or s is running[-1]]
        step.outputs = _outputs(step)
        made.update(step.outputs)
        made_as.update({(kind, entry.config): src for kind, src in step.outputs.items()})
        for kind in {o.kind for o in entry.stage.outputs}:  # kinds this step could make but does not
            if kind in step.outputs:
                unmade.pop(kind, None)
            elif job:
                unmade[kind] = entry.id
                made.pop(kind, None)
        if entry in chosen:
            steps.append(step)
    if findings and any(f.level == "error" for f in findings):
        raise InvalidConfig([f for f in findings if f.level == "error"])
    return path, steps


def _unmade_inputs(entry: Entry, job: Job, unmade: dict[str, str], pipe_source: str) -> list[Finding]:
    """A needed input whose nearest maker in the chain declares no output of its kind (checkpoint.save
    unset) must not quietly fall back to an older artifact of the store."""
    found = []
    for inp, src in zip(entry.stage.inputs, job.sources):
        step = next((unmade[k] for k in inp.kinds if k in unmade), None)
        explicit = job.origin.get(inp.key) in (CLI_SOURCE, pipe_source)
        if step and (artifacts.needed(inp, job.config) or artifacts.optional(inp, job.config)) and not explicit \
                and not (src and src.pending):
            found.append(Finding("error", f"{entry.id}: {inp.key}", _unmade(step, entry, inp.key)))
    return found


def _unmade(step: str, entry: Entry, key: str) -> str:
    return f"step {step} declares no output for it (its output key, e.g. checkpoint.save, is unset); set that, " \
           f"or set {entry.id}.{key}"


def _completed(job: Job, stage: Stage) -> list[dict]:

    found = job.store.completed_with(job.digest, job.profile.name if job.profile else None)
    kinds = {o["kind"] for o in job.config["job"]["produces"]}
    return found if kinds and kinds <= {m.get("type") for m in found} else []


def _outputs(step: Step) -> dict[str, Source]:
    if step.reused:
        return {m["type"]: artifacts.from_manifest(m) for m in step.reused}
    if step.job is None:  # its errors are reported; later steps are checked against a stand-in
        return {o.kind: Source(f"<{step.entry.id} {o.kind}>", f"from pipe step {step.entry.id}", pending=True)
                for o in step.entry.stage.outputs}
    from ..executors import executor

    job_dir = executor(step.job.executor).job_dir(step.job, step.job_id)
    return {o["kind"]: Source(step.job.placed(o["path"], job_dir), f"from pipe step {step.entry.id} ({step.job_id})",
                              step.job_id, o["name"], step.job.digest, pending=True)
            for o in step.job.config["job"]["produces"]}


# -- running it -----------------------------------------------------------------------------------

def run_pipe(options: PipeOptions) -> None:
    if options.run and options.batch:
        raise UserError("--run and --batch: choose one (--run follows the pipe, --batch returns after submitting)")
    path, steps = plan(options)
    todo = [s for s in steps if not s.skipped]
    from ..executors import executor

    chains = bool(todo) and executor(todo[0].job.executor).chains
    if todo and not chains and options.mode == "detached":  # the dry run refuses it too
        raise UserError(f"--batch {options.batch}: the {todo[0].job.executor} executor cannot chain jobs; run the "
                        f"pipe with --run {options.batch} (it runs the steps one after another)")
    if options.dry_run:
        from .pipe_show import print_plan

        print_plan(path, steps, options)
        return
    for step in steps:
        if step.skipped:
            done = ", ".join(f"{m['name']}:v{m['version']}" for m in step.reused)
            print(f"{step.entry.id}: skipped, done by {step.reused[0].get('producer')} ({done})")
    if not todo:
        print("every step already completed with this config; --force re-runs them")
        return
    pipe_id = f"pipe-{path.stem}_{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    if chains:
        _submit_chain(pipe_id, path, todo, options)
    else:
        _run_in_turn(pipe_id, path, todo)


def _submit(step: Step, pipe_id: str, records: dict[str, Any]):
    from ..executors import executor
    from ..records import save

    for finding in step.job.report.findings:
        print(f"{step.entry.id}: {finding.line()}", file=sys.stderr)
    where = executor(step.job.executor)
    after = [records[s.entry.id] for s in step.after] if where.chains else []  # else: run in turn
    record = where.submit(step.job, step.job_id, after)
    record.submitted, record.argv, record.pipe = time.time(), sys.argv, pipe_id
    save(record)
    records[step.entry.id] = record
    return record


def _submit_chain(pipe_id: str, path: Path, todo: list[Step], options: PipeOptions) -> None:
    from .. import jobs
    from ..executors import executor

    records: dict[str, Any] = {}
    try:
        for step in todo:
            record = _submit(step, pipe_id, records)
            where = executor(record.executor)
            waits = ", ".join(str(where.scheduler_id(records[s.entry.id])) for s in step.after)
            waiting = f", after {waits}" if waits else ""
            print(f"{step.entry.id}: submitted {record.id} ({where.where(record)}{waiting})", flush=True)
    finally:
        _save_pipe(pipe_id, path, todo, records)
    if options.mode == "detached":
        _next(pipe_id, records)
        return
    try:
        for step in todo:
            record = records[step.entry.id]
            print(f"== {step.entry.id}: {record.id} ==", flush=True)
            final = jobs.follow(record, sys.stdout)
            if final.state != "COMPLETED":
                _fail(step, record, final, [records[s.entry.id] for s in todo[todo.index(step) + 1:]])
    except KeyboardInterrupt:
        print(f"\ndetached; the jobs of {pipe_id} keep running in order", file=sys.stderr)
        _next(pipe_id, records)
        raise SystemExit(130) from None
    print(f"{pipe_id} COMPLETED")


def _run_in_turn(pipe_id: str, path: Path, todo: list[Step]) -> None:
    from .. import jobs

    records: dict[str, Any] = {}
    try:
        for step in todo:
            record = _submit(step, pipe_id, records)
            _save_pipe(pipe_id, path, todo, records)
            print(f"== {step.entry.id}: {record.id} ==", flush=True)
            final = jobs.follow(record, sys.stdout)
            if final.state != "COMPLETED":
                _fail(step, record, final, [])
    except KeyboardInterrupt:
        done = ", ".join(records) or "none"
        print(f"\nstopped; started: {done}. Re-run the same command to resume where it stopped", file=sys.stderr)
        raise SystemExit(130) from None
    print(f"{pipe_id} COMPLETED")


def _fail(step: Step, record, final, rest: list) -> None:
    from .. import jobs

    reason = final.reason or jobs.failure_reason(record)
    for later in rest:  # Slurm cancels them (kill-on-invalid-dep); report what it says
        print(f"{later.id}: {_wait_terminal(later)}", file=sys.stderr)
    error = JobFailed(f"pipe step {step.entry.id} ({record.id}) {final.state}: {reason}")
    error.exit_code = final.exit_code or 1
    raise error


def _wait_terminal(record, timeout: float = 60) -> str:
    from .. import jobs

    deadline = time.monotonic() + timeout
    while True:
        st = jobs.state(record)
        if st.done or time.monotonic() > deadline:
            return f"{st.state}{f' ({st.reason})' if st.reason else ''}"
        time.sleep(1)


def _next(pipe_id: str, records: dict[str, Any]) -> None:
    print("next:")
    print(f"  nemotron jobs status {pipe_id}")
    last = list(records.values())[-1]
    print(f"  nemotron jobs logs {last.id} --follow")
    print(f"  nemotron jobs cancel {pipe_id}")


def _save_pipe(pipe_id: str, path: Path, todo: list[Step], records: dict[str, Any]) -> None:
    if records:  # else nothing was submitted
        pipe_records.save(pipe_id, path, [{"id": s.entry.id, "stage": s.entry.stage.name,
                                           "job": records[s.entry.id].id} for s in todo if s.entry.id in records])
