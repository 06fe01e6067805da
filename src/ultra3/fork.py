"""`--fork RUN[@ITERATION]` (the training stages' `fork` key): a new run that starts from another run's checkpoint at
an iteration (its newest by default), with the changes given beside it, e.g. an earlier start of the LR decay after a
divergence. Megatron-Bridge loads `checkpoint.load` at `checkpoint.ckpt_step` with its optimizer and scheduler
state; the new run saves to its own checkpoint dir, never into the source's, and goes on from there in its later
allocations (recipes.training.plan.fork_resumed). The source's data inputs are kept unless given. `job.fork` records
the source, the iteration and the changed keys: the job's manifest and `nemotron jobs lineage` (ultra3.lineage) say
them."""

from __future__ import annotations

import os
import re
from typing import Any

from .config import flatten
from .dotted import get
from .errors import ClusterError, UserError
from .executors import for_record
from .ssh import run

KEY = "fork"
ITERATION_DIR = re.compile(r"iter_(\d{7})")
SCHEDULE = ("scheduler.", "optimizer.lr", "optimizer.min_lr", "optimizer.weight_decay")  # what the scheduler holds
SAME = ("job.", "run.", "cluster.", "logger.", "fork", "checkpoint.load", "checkpoint.ckpt_step", "checkpoint.save")
# Megatron-Core keeps the schedule saved in the checkpoint with these values (or refuses one that differs: neither set)
KEEPS_SCHEDULE = (("scheduler.override_opt_param_scheduler", False),
                  ("scheduler.use_checkpoint_opt_param_scheduler", True))
SUPERSEDED = "checkpoint"  # the source's own starting checkpoint (an SFT input): the fork's checkpoint replaces it


def derive(flat: dict[str, Any], origin: dict[str, str], report) -> None:
    """checkpoint.load and checkpoint.ckpt_step from the fork, and the source's data inputs, before the inputs are
    resolved."""
    ref = flat.get(KEY)
    if not ref:
        return
    where = origin.get(KEY)
    found = _source(ref, where, flat, origin, report)
    if not found:
        return
    source, config, save, iteration = found
    said = f"fork {ref} ({where})"
    flat.update({"checkpoint.load": save, "checkpoint.ckpt_step": iteration})
    origin.update({"checkpoint.load": said, "checkpoint.ckpt_step": said})
    inputs = {i["key"]: i for i in get(config, "job.inputs") or []
              if isinstance(i, dict) and isinstance(i.get("key"), str) and isinstance(i.get("path"), str) and i["path"]}
    for key, inp in inputs.items():  # unset: the data the source trained on, not the store's newest
        if flat.get(key) in (None, "") and inp.get("name") != SUPERSEDED:
            flat[key] = inp["path"]
            origin[key] = f"{said}: {source.id}'s input" + (f", {inp['artifact']}" if inp.get("artifact") else "")
    before = flatten(config)
    changed = {k: v for k, v in flat.items() if not k.startswith(SAME) and before.get(k, object()) != v
               and not (k in inputs and v in (None, ""))}
    if schedule := sorted(k for k in changed if k.startswith(SCHEDULE) and k not in dict(KEEPS_SCHEDULE)):
        for key, keeps in KEEPS_SCHEDULE:
            if flat.get(key) is None:
                flat[key], origin[key] = not keeps, f"{said}: the schedule changed"
            elif flat[key] == keeps:
                report.error(key, f"{keeps} (set in {origin[key]}) keeps the schedule saved at iteration {iteration}, "
                                  f"so the fork's {', '.join(schedule)} would be ignored or refused by Megatron-Core; "
                                  "leave it unset")
    if flat.get("checkpoint.load_optim") is False and not flat.get("checkpoint.finetune"):
        report.warn("checkpoint.load_optim", f"false (set in {origin['checkpoint.load_optim']}): Megatron-Bridge "
                                             "then loads no scheduler state either, so the LR schedule starts again "
                                             f"from its warmup at iteration {iteration}")
    if (ran := get(config, "job.config")) != flat.get("job.config"):
        report.warn(KEY, f"{source.id} ran config '{ran}', this run '{flat.get('job.config')}': each of the "
                         f"{len(changed)} keys that differ is a change; give -c {ran} to change only the keys given")
    flat["job.fork"] = {"from": source.id, "iteration": iteration, "path": save,
                        "changed": {k: _plain(v) for k, v in sorted(changed.items())}}


def _source(ref: Any, where: str | None, flat: dict[str, Any], origin: dict[str, str], report):
    """The source run, its config, checkpoint dir and the iteration to start from; None after an error."""
    if not isinstance(ref, str) or not re.fullmatch(r"[\w.-]+(@(\d+|latest))?", ref):
        report.error(KEY, f"{ref!r} is not RUN or RUN@ITERATION (set in {where}); e.g. --fork "
                          "ultra3-pretrain_20261128-101500-abc123@4000")
        return None
    for key in ("checkpoint.load", "checkpoint.ckpt_step"):
        if flat.get(key) is not None:
            report.error(key, f"set in {origin[key]} beside fork={ref} (set in {where}); the fork sets it: give one")
            return None
    from . import jobs
    from .lineage import job_config

    name, _, wanted = ref.partition("@")
    try:
        source = jobs.find(name)
    except UserError as e:
        report.error(KEY, f"{e} (fork={ref}, set in {where})")
        return None
    config, stage = job_config(source), flat["job.stage"]
    save = get(config, "checkpoint.save")
    if not config:
        report.error(KEY, f"cannot read {source.id}'s config ({source.task_dir}/code/config.yaml) from here, so not "
                          "its checkpoint dir either; fork it from a machine that reads its job dir")
    elif source.stage != stage:
        start = f" (sft starts from a pretrain checkpoint with recipe.pretrained_checkpoint=job:{source.id})" \
            if stage == "sft" and source.stage == "pretrain" else ""
        report.error(KEY, f"{source.id} is a {source.stage} run, not {stage}; fork a {stage} run{start}")
    elif not save:
        report.error(KEY, f"{source.id} saved no checkpoints (its checkpoint.save is unset); fork a run that saves")
    elif isinstance(flat.get("checkpoint.save"), str) and _same(flat["checkpoint.save"], save):
        report.error("checkpoint.save", f"{save} (set in {origin['checkpoint.save']}) is {source.id}'s own checkpoint "
                                        "dir; a fork saves to its own: leave checkpoint.save to the config, or give "
                                        "another dir")
    else:
        try:
            found = iterations(save, for_record(source).remote(source))
        except ClusterError as e:
            report.error(KEY, f"cannot list {source.id}'s checkpoints in {save}: {e}")
            return None
        iteration = found[-1] if found and wanted in ("", "latest") else int(wanted or 0)
        if not found:
            report.error(KEY, f"{source.id} saved no checkpoint in {save} yet; fork it once it has saved one "
                              "(checkpoint.save_interval)")
        elif iteration not in found:
            report.error(KEY, f"{source.id} has no checkpoint at iteration {iteration}; it has "
                              f"{', '.join(map(str, found))} (in {save})")
        else:
            return source, config, save, iteration
    return None


def iterations(save: str, ssh: dict | None) -> list[int]:
    """The iterations checkpointed in `save` (its iter_NNNNNNN directories), oldest first; none when it does not
    exist yet (Megatron-Bridge makes it at the first save)."""
    done = run(["find", save, "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-name", "iter_*"], ssh)
    if done.returncode and "No such file or directory" not in done.stderr:
        raise ClusterError((done.stderr.strip().splitlines() or [f"find exited {done.returncode}"])[-1])
    return sorted(int(m.group(1)) for line in done.stdout.splitlines()
                  if (m := ITERATION_DIR.fullmatch(line.rstrip("/").rsplit("/", 1)[-1])))


def _same(a: str, b: str) -> bool:
    return os.path.normpath(os.path.expanduser(a)) == os.path.normpath(os.path.expanduser(b))


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
