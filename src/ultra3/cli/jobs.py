"""`nemotron jobs list | status | logs | cancel | lineage | compare | plot | goodput`; status, cancel and goodput
also take a pipe id."""

from __future__ import annotations

import sys
import time
from collections import Counter
from itertools import islice
from pathlib import Path

from .. import jobs, ledger, pipe_records, progress, records
from ..errors import LauncherError, UserError
from ..executors import for_record
from ..job_filter import JobFilter
from ..pipe_records import find_pipe


def _age(ts: float) -> str:
    s = int(time.time() - ts)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


def list_jobs(limit: int, where: JobFilter | None = None) -> None:
    where = where or JobFilter()
    found = where.pick(jobs.all_records()) if where.any() else jobs.newest(limit)
    shown, states = where.states(found, limit)
    if not shown:
        print(f"no jobs {where.said()}(registry: {records.registry_dir()})" if where.any() else
              f"no jobs yet (registry: {records.registry_dir()})")
        return
    rows = [("JOB", "STAGE", "CONFIG", "WHERE", "SLURM", "STATE", "AGE")]
    for r in shown:
        st = states.get(r.id, records.State("UNKNOWN"))
        stage = r.stage.replace(" ", "-")  # one word per column
        rows.append((r.id, stage, r.config, r.profile or "local", for_record(r).scheduler_id(r) or "-", _short(st),
                     _age(r.submitted)))
    _table(rows)


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _short(st: records.State) -> str:
    """The state for a column: the upstream that decides it by its state only (`CANCELLED (upstream FAILED)`);
    `nemotron jobs status` names the job."""
    return st.label.replace(f" {st.upstream}", "") if st.upstream else st.label


def _newest_or(ref: str | None) -> str:
    """No id: the newest job, said on stderr so the output stays the job's."""
    if ref:
        return ref
    newest = jobs.newest(1)
    if not newest:
        raise UserError(f"no jobs yet (registry: {records.registry_dir()}); submit one, e.g. ultra3 pretrain -c tiny")
    print(f"(the newest job: {newest[0].id})", file=sys.stderr)
    return newest[0].id


def show_status(ref: str | None) -> None:
    ref = _newest_or(ref)
    if pipe := _pipe(ref):
        return _pipe_status(pipe)
    r = jobs.find(ref)
    st = jobs.state(r)
    tried = ledger.attempts(r)
    if len(tried) > 1 and st.done and tried[-1].outcome in ("failed", "stopped", "lost"):
        st.reason = tried[-1].why  # why the run stopped after requeues, over the scheduler's word or the log's
    print(f"job:       {r.id}")
    print(f"stage:     {r.stage} (config {r.config}, {r.profile or 'local'}, {r.mode})")
    print(f"state:     {st.label}{f' (exit code {st.exit_code})' if st.exit_code is not None else ''}"
          f"{f' [{st.source}]' if st.source else ''}")
    if st.reason and not st.upstream:
        print(f"reason:    {st.reason}")
    where = for_record(r)
    if scheduler_id := where.scheduler_id(r):
        print(f"slurm id:  {scheduler_id}")
    host = f" on {remote['host']}" if (remote := where.remote(r)) else ""
    print(f"job dir:   {r.job_dir}{host}")
    print(f"log:       {where.log_at(r)}")
    for line in _progress(r):
        print(line)
    from ..eval_results import status_lines  # an eval job's scores

    for line in status_lines(r):
        print(line)
    if len(tried) > 1:
        _attempt_table(tried)


def _progress(r: records.JobRecord) -> list[str]:
    """Where the run is, from its log: iterations, losses, speed and ETA; a data prep's shards."""
    from ..contract import phase2_start
    from ..dotted import get
    from ..lineage import job_config
    from ..model_math import slurm_seconds

    attempts = progress.parse(jobs.log_text(r))
    cfg = job_config(r)
    limit = slurm_seconds(str(get(cfg, "run.time") or "")) if r.executor == "slurm" else None
    factor = get(cfg, "rerun_state_machine.spiky_loss_factor") or progress.SPIKY_LOSS_FACTOR
    run = (get(cfg, "train.train_iters"), phase2_start(cfg))  # the whole run's end, its phase switch
    return progress.status_lines(attempts, get(cfg, "model.seq_length"), limit, factor, run)


def _attempt_table(tried: list[ledger.Attempt]) -> None:
    print(f"attempts:  {len(tried)}")
    for a in tried:
        began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.start)) if a.start else "-"
        print(f"  {a.number:>3}  {began}  {_duration(a.seconds):>8}  {a.outcome:<8}  {a.why}")


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def show_logs(ref: str | None, follow: bool) -> None:
    r = jobs.find(_newest_or(ref))
    if follow:
        final = jobs.follow(r, sys.stdout)
        code = f" (exit code {final.exit_code})" if final.exit_code is not None else ""
        said = final.reason and final.state != "COMPLETED" and not final.upstream and \
            final.reason not in jobs.log_text(r)  # a reason the log just said (its preflight's) is not repeated
        why = f": {final.reason}" if said else ""
        print(f"{r.id} ended {final.label}{code}{why}" if final.done else
              f"{r.id}: its state is no longer known ({final.state}{why})", file=sys.stderr)
        return
    text = jobs.log_text(r)
    sys.stdout.write(text)
    if not text:  # pending, or still in its setup lines (which write to the batch output, not the job's log)
        st = jobs.state(r)
        setup = for_record(r).setup_output(r)
        where = f"; the batch script's own output is {setup}" if setup else ""
        print(f"(the job ended {st.state} before writing a log{where})" if st.done else
              f"(no log yet: the job is {st.state}{where}; `nemotron jobs logs {r.id} -f` waits for it)",
              file=sys.stderr)


def cancel_job(ref: str) -> None:
    if pipe := _pipe(ref):
        for step in pipe["steps"]:  # every step, even when one of them cannot be
            print(f"{step['id']}: ", end="")
            if not step["job"]:
                print(f"no job: {step['state']} ({step['reason']})")
                continue
            try:
                cancel_job(step["job"])
            except LauncherError as e:
                print(f"not cancelled: {e}")
        return
    r = jobs.find(ref)
    before = jobs.state(r)
    if before.done:
        print(f"{r.id} already ended: {before.state}")
        return
    jobs.cancel(r)
    where = for_record(r)
    print(f"cancelled {r.id}{f' ({where.where(r)})' if where.scheduler_id(r) else ''}")


def _pipe(ref: str) -> dict | None:
    return find_pipe(ref) if ref.startswith("pipe-") else None


def _pipe_status(pipe: dict) -> None:
    """Each step with its job, what it waits for (a record of a pipe submitted as a chain does not say) and its
    state; a step without a job (skipped, not started yet, never run) with the record's state and why."""
    steps = _step_states(pipe)
    print(f"pipe:      {pipe['id']} ({pipe['config']})")
    waits = {step["id"]: f"after {', '.join(step['after'])}" if step["after"] else "-"
             for step, _ in steps if "after" in step}
    width = max(len(step["id"]) for step, _ in steps)
    job_width = max(len(step["job"] or "-") for step, _ in steps)
    after_width = max(map(len, waits.values()), default=0)
    for step, st in steps:
        after = f"{waits[step['id']]:<{after_width}}  " if step["id"] in waits else ""
        label = st.label if step["job"] else f"{st.state} ({st.reason})"
        print(f"  {step['id']:<{width}}  {step['job'] or '-':<{job_width}}  {after}{label}")


def _step_states(pipe: dict) -> list[tuple[dict, records.State]]:
    """Each step of a pipe with its state: its job's, or the record's for a step without a job."""
    found = {step["job"]: jobs.find(step["job"]) for step in pipe["steps"] if step["job"]}
    states = jobs.states(list(found.values()))
    return [(step, states.get(found[step["job"]].id, records.State("UNKNOWN")) if step["job"] else
             records.State(step["state"], reason=step["reason"])) for step in pipe["steps"]]


def list_pipes(limit: int) -> None:
    """The newest pipes: each with its steps counted by state."""
    rows = [("PIPE", "CONFIG", "STATE", "STEPS", "AGE")]
    for pipe in islice(pipe_records.pipes(), limit):
        counts = Counter(st.state for _, st in _step_states(pipe))
        overall = "RUNNING" if set(counts) & {"PENDING", "RUNNING", "WAITING", "UNKNOWN"} else \
            "COMPLETED" if set(counts) <= {"COMPLETED", "SKIPPED"} else "FAILED"
        rows.append((pipe["id"], Path(pipe["config"]).stem, overall,
                     ", ".join(f"{n} {state}" for state, n in counts.items()), _age(pipe["submitted"])))
    if len(rows) == 1:
        print(f"no pipes yet ({pipe_records.pipes_dir()})")
        return
    _table(rows)


def show_lineage(ref: str) -> None:
    from ..lineage import print_lineage

    print_lineage(jobs.find(ref))


def compare_results(refs: list[str]) -> None:
    from ..eval_results import compare_lines, load

    for line in compare_lines([load(ref) for ref in refs]):
        print(line)


def show_plot(ref: str | None, output: str | None) -> None:
    from ..dotted import get
    from ..lineage import job_config
    from ..plot import loss_png

    r = jobs.find(_newest_or(ref))
    attempts = progress.parse(jobs.log_text(r))
    if not any(a.iterations for a in attempts):
        raise UserError(f"{r.id}: its log has no training iteration yet (a {r.stage} job); plot a pretrain or sft "
                        "job once it has trained")
    factor = get(job_config(r), "rerun_state_machine.spiky_loss_factor") or progress.SPIKY_LOSS_FACTOR
    path = output or f"{r.id}-loss.png"
    loss_png(attempts, path, f"{r.id} ({r.stage} -c {r.config})", factor)
    print(f"wrote {path}")


def show_goodput(ref: str) -> None:
    """Each run's productive time against its start-ups and lost work, attempt by attempt."""
    from ..dotted import get
    from ..goodput import lines
    from ..lineage import job_config

    pipe = _pipe(ref)
    found = [jobs.find(step["job"]) for step in pipe["steps"] if step["job"]] if pipe else [jobs.find(ref)]
    for r in found:
        runs = ledger.attempts(r)
        if not runs:
            print(f"{r.id}: no attempt recorded (not started, or its job dir is not readable from here)")
            continue
        logs = progress.parse(jobs.log_text(r))
        per_node = get(job_config(r), "run.gpus_per_node") or 0
        for line in lines(r.id, runs, logs, progress.step_seconds(logs), per_node):
            print(line)


def prune_jobs(older_than: str, yes: bool) -> None:
    """What goes and what stays, each with why; removed only with --yes."""
    from .. import prune

    verdicts, newer = prune.plan(prune.seconds(older_than))
    going = [v for v in verdicts if not v.kept]
    total = sum(v.size for v in going)
    print(f"{'removed' if yes else 'would remove'} {len(going)} job(s), {total / 1e6:.1f} MB (job dirs and records):")
    for v in going:
        print(f"  {v.record.id}  {v.state.state}  {v.size / 1e6:.1f} MB  {v.record.job_dir}")
    kept = [v for v in verdicts if v.kept]
    if kept:
        print(f"kept {len(kept)} job(s):")
        for v in kept:
            print(f"  {v.record.id}  {v.state.state}  {v.kept}")
    if newer:
        print(f"kept {newer} job(s) newer than {older_than}")
    if not yes:
        print(f"dry run: nothing removed; `nemotron jobs prune --older-than {older_than} --yes` removes them")
        return
    for pipe_id in prune.remove(verdicts):
        print(f"removed pipe record {pipe_id} (none of its jobs is left)")
