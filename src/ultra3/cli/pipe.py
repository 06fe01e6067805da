"""`ultra3 pipe`: stages as one graph, each input wired to the output of an earlier stage.

The whole pipe is compiled and checked before anything is submitted. A step waits only for the steps whose
outputs it reads and those its `after:` names; a step whose config digest already completed for this profile,
its outputs still there, is skipped and its artifacts reused (--force re-runs it). On Slurm every step is
submitted at once, each after the steps it waits for (afterok; Slurm cancels it when one of those fails), so
independent steps run side by side; elsewhere the steps run one at a time in an order of the graph. A failed
step stops only the steps that wait for it, directly or through others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataclasses import replace

from .. import artifacts, pipe_graph
from ..artifact_check import gone
from ..artifacts import Source
from ..compile import compile_job
from ..job import Job, Options
from ..config import CLI_SOURCE, Layer, find_config, flatten, read_yaml
from ..errors import InvalidConfig, UserError
from ..findings import Finding
from ..jobprep.jobdir import new_job_id
from ..profiles import load_profile
from ..schema import did_you_mean, suggest
from ..stage import Stage
from ..stages import find_stage

CONFIG_DIR = "pipe"


@dataclass
class Entry:
    id: str  # its name in the pipe config, the prefix of its command-line overrides
    stage: Stage
    config: str
    overrides: dict[str, Any]  # flat, from the pipe config
    after: tuple[str, ...] = ()  # the steps its `after:` names: waited for though no output of theirs is read
    when: str | None = None  # STEP.KEY: in the pipe only when the pipe config or the command line sets that key


@dataclass
class Step:
    entry: Entry
    job: Job | None  # None when its config has errors (the pipe is then not submitted)
    reused: list[dict] = field(default_factory=list)  # the artifacts of an earlier identical run: skipped
    again: str = ""  # why it runs although an identical run completed (its outputs are gone)
    job_id: str = ""
    reads: list[str] = field(default_factory=list)  # the steps whose outputs it reads
    after: list["Step"] = field(default_factory=list)  # the steps it waits for (those that run)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # `after:` steps it does not wait for, and why
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
    full: bool = False  # the dry run with each step's script
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
        _known(spec, ("stage", "config", "overrides", "after", "when"), f"{where} stages.{step_id}.")
        stage = find_stage(spec["stage"])
        if stage is None:
            raise UserError(f"{where} stages.{step_id}.stage: no stage '{spec['stage']}'")
        overrides = spec.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise UserError(f"{where} stages.{step_id}.overrides: must be a mapping of key: value")
        entries.append(Entry(str(step_id), stage, str(spec.get("config") or "default"), flatten(overrides),
                             _after(spec.get("after"), f"{where} stages.{step_id}.after", list(stages)),
                             _when(spec.get("when"), f"{where} stages.{step_id}.when", list(stages))))
    return path, entries


def _when(value: object, where: str, ids: list[str]) -> str | None:
    if value is None:
        return None
    step, _, key = str(value).partition(".")
    if not isinstance(value, str) or not key:
        raise UserError(f"{where}: must be STEP.KEY, a key of a step that turns this one on, e.g. {ids[0]}.datasets")
    if step not in ids:
        raise UserError(f"{where}: no step '{step}'; {suggest(step, ids).replace('known keys', 'the steps')}")
    return value


def _wanted(entries: list[Entry], per_step: dict[str, list[str]]) -> tuple[list[Entry], list[Entry]]:
    """(the steps whose `when:` key the pipe config or the command line sets, or that have none; those left out)."""
    by_id = {e.id: e for e in entries}

    def wanted(entry: Entry) -> bool:
        step, _, key = (entry.when or "").partition(".")
        return not entry.when or key in by_id[step].overrides or \
            any(token.split("=", 1)[0] == key for token in per_step[step])

    return [e for e in entries if wanted(e)], [e for e in entries if not wanted(e)]


def left_out_lines(left: list[Entry]) -> list[str]:
    return [f"{e.id}: left out; set {e.when}=... to run it" for e in left]


def _after(value: object, where: str, ids: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: must be a list of step ids, e.g. after: [{ids[0]}]")
    for name in value:
        if name not in ids:
            raise UserError(f"{where}: no step '{name}'; {suggest(name, ids).replace('known keys', 'the steps')}")
    return tuple(value)


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
            close = did_you_mean(value, ids)
            raise UserError(f"{flag} {value}: no such step; {f'{close} ' if close else ''}the pipe's steps are "
                            f"{', '.join(ids)}")
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
            close = did_you_mean(step, list(out)) if "=" in rest else ""
            said = f"no step {step!r}; {close} " if close else ""
            raise UserError(f"{token}: {said}a pipe override is STEP.key=value with STEP one of {', '.join(out)}")
        out[step].append(rest)
    return out


def plan(options: PipeOptions) -> tuple[Path, list[Step], list[Entry]]:
    """Compile every step, wired to the outputs of the ones before it, and draw the graph; every error of every
    step, or the steps ready to submit, in an order of the graph."""
    path, entries = load(options.config)
    profile_errors: list[Finding] = []  # reported once, not once per step
    if options.run or options.batch:
        profile_errors = load_profile(options.run or options.batch, options.env_file,
                                      "--run" if options.run else "--batch").errors
    per_step = _split_overrides(options.overrides, entries)
    wanted, left = _wanted(entries, per_step)
    before, chosen = _select(wanted, options.start, options.stop)
    made: dict[str, Source] = {}  # artifact kind -> the newest maker in the pipe so far
    made_as: dict[tuple[str, str | None], Source] = {}  # (kind, config) -> the same, for an input of one config
    unmade: dict[str, str] = {}  # artifact kind -> the step that would make it but declares no output
    findings: list[Finding] = list(profile_errors)
    every: list[Step] = []
    for entry in before + chosen:
        offered = {**{(kind, None): src for kind, src in made.items()}, **made_as}
        stage_options = Options(config=entry.config, run=options.run, batch=options.batch, dry_run=options.dry_run,
                                env_file=options.env_file, overrides=per_step[entry.id], offered=offered,
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
            step.reused, step.again = _completed(job)
        if job:
            findings += _unmade_inputs(entry, job, unmade, stage_options.pipe_layer.source)
            step.reads = list(dict.fromkeys(src.step for src in job.sources if src and src.step))
        if job and not step.skipped:
            step.job_id = new_job_id(job)
        step.outputs = _outputs(step)
        made.update(step.outputs)
        made_as.update({(kind, entry.config): src for kind, src in step.outputs.items()})
        for kind in {o.kind for o in entry.stage.outputs}:  # kinds this step could make but does not
            if kind in step.outputs:
                unmade.pop(kind, None)
            elif job:
                unmade[kind] = entry.id
                made.pop(kind, None)
        every.append(step)
    waits = {s.entry.id: list(dict.fromkeys([*s.reads, *s.entry.after])) for s in every}
    if loop := pipe_graph.cycle(waits):
        findings.append(_cycle(loop, path, {s.entry.id: s for s in every}))
    findings += _not_done(every[:len(before)], every[len(before):], waits, options.start)
    if findings and any(f.level == "error" for f in findings):
        raise InvalidConfig([f for f in findings if f.level == "error"])
    steps = every[len(before):]
    _edges(steps, every, waits, options)
    ids = pipe_graph.order([s.entry.id for s in steps], waits)
    return path, sorted(steps, key=lambda s: ids.index(s.entry.id)), left


def _not_done(before: list[Step], chosen: list[Step], waits: dict[str, list[str]], start: str | None) -> list[Finding]:
    """A step before --from that a chosen step waits for must have completed, its outputs still there."""
    needed = {w for s in chosen for w in waits[s.entry.id]}
    return [Finding("error", s.entry.id, f"--from {start}: "
                                         + (f"this earlier step must run again ({s.again})" if s.again else
                                            "this earlier step has no completed run of this config")
                                         + "; start from it or leave --from out")
            for s in before if s.job and not s.reused and s.entry.id in needed]


def _cycle(loop: list[str], path: Path, by_id: dict[str, Step]) -> Finding:
    """One line: the cycle, each edge said with why it is one, under the first `after:` that closes it."""
    hops = list(zip(loop, loop[1:]))
    said = ", ".join(f"{a} reads {b}'s output" if b in by_id[a].reads else f"{a} is after {b} (after:)"
                     for a, b in hops)
    first = next(a for a, b in hops if b in by_id[a].entry.after and b not in by_id[a].reads)
    return Finding("error", f"{path.name} stages.{first}.after", f"{' -> '.join(loop)} is a cycle ({said}); remove "
                                                                  "one of these after: entries")


def _edges(steps: list[Step], every: list[Step], waits: dict[str, list[str]], options: PipeOptions) -> None:
    """Each step that runs waits for the steps of `waits` that run too; an `after:` step that does not run is
    dropped, with why."""
    by_id = {s.entry.id: s for s in every}
    chosen = {s.entry.id for s in steps}
    for step in steps:
        if step.skipped or not step.job:
            continue
        step.after = [s for s in every if s.entry.id in waits[step.entry.id] and s.entry.id in chosen
                      and not s.skipped]
        for name in step.entry.after:
            if name not in by_id:
                step.dropped.append((name, f"not selected: --to {options.stop}"))
            elif by_id[name].skipped:
                step.dropped.append((name, f"done by {by_id[name].reused[0].get('producer')}"))


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


def _completed(job: Job) -> tuple[list[dict], str]:
    """(the artifacts of the newest completed job of this config digest, when they are all still there; why
    they cannot be taken, when they are not)."""
    found = job.store.completed_with(job.digest, job.profile.name if job.profile else None)
    kinds = {o["kind"] for o in job.config["job"]["produces"]}
    if not kinds or not kinds <= {m.get("type") for m in found}:
        return [], ""
    why = gone(found, job.store.ssh)
    return ([], why) if why else (found, "")


def _outputs(step: Step) -> dict[str, Source]:
    name = step.entry.id
    if step.reused:
        return {m["type"]: replace(artifacts.from_manifest(m), step=name) for m in step.reused}
    if step.job is None:  # its errors are reported; later steps are checked against a stand-in
        return {o.kind: Source(f"<{name} {o.kind}>", f"from pipe step {name}", pending=True, step=name)
                for o in step.entry.stage.outputs}
    from ..executors import executor

    job_dir = executor(step.job.executor).job_dir(step.job, step.job_id)
    return {o["kind"]: Source(step.job.placed(o["path"], job_dir), f"from pipe step {name} ({step.job_id})",
                              step.job_id, o["name"], step.job.digest, pending=True, step=name)
            for o in step.job.config["job"]["produces"]}
