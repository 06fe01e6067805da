"""`--fork RUN[@ITERATION]` (the training stages' `fork` key): a new run that starts from another run's checkpoint at
an iteration (its newest by default), with the changes given beside it, e.g. an earlier start of the LR decay after a
divergence. Megatron-Bridge loads `checkpoint.load` at `checkpoint.ckpt_step` with its optimizer and scheduler
state; the new run saves to its own checkpoint dir, never into the source's. `job.fork` records the source, the
iteration and the changed keys: the job's manifest and `nemotron jobs lineage` (ultra3.lineage) say them."""

from __future__ import annotations

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


def derive(flat: dict[str, Any], origin: dict[str, str], report) -> None:
    """checkpoint.load and checkpoint.ckpt_step from the fork, before the inputs are resolved."""
    ref = flat.get(KEY)
    if not ref:
        return
    where = origin.get(KEY)
    if not isinstance(ref, str) or not re.fullmatch(r"[\w.-]+(@(\d+|latest))?", ref):
        report.error(KEY, f"{ref!r} is not RUN or RUN@ITERATION (set in {where}); e.g. --fork "
                          "ultra3-pretrain_20261128-101500-abc123@4000")
        return
    for key in ("checkpoint.load", "checkpoint.ckpt_step"):
        if flat.get(key) is not None:
            report.error(key, f"set in {origin[key]} beside fork={ref} (set in {where}); the fork sets it: give one")
            return
    from . import jobs
    from .lineage import job_config

    name, _, wanted = ref.partition("@")
    try:
        source = jobs.find(name)
    except UserError as e:
        report.error(KEY, f"{e} (fork={ref}, set in {where})")
        return
    config = job_config(source)
    save = get(config, "checkpoint.save")
    if not save or get(config, "job.stage") != flat["job.stage"]:
        report.error(KEY, f"{source.id} ({source.stage}) has no checkpoint dir this machine can read (its "
                          f"config.yaml); fork a {flat.get('job.stage') or 'training'} run with checkpoint.save set")
        return
    found = iterations(save, for_record(source).remote(source))
    if not found:
        report.error(KEY, f"{source.id} saved no checkpoint in {save} yet; fork it once it has saved one "
                          "(checkpoint.save_interval)")
        return
    iteration = found[-1] if wanted in ("", "latest") else int(wanted)
    if iteration not in found:
        report.error(KEY, f"{source.id} has no checkpoint at iteration {iteration}; it has "
                          f"{', '.join(map(str, found))} (in {save})")
        return
    said = f"fork {ref} ({where})"
    flat.update({"checkpoint.load": save, "checkpoint.ckpt_step": iteration})
    origin.update({"checkpoint.load": said, "checkpoint.ckpt_step": said})
    changed = {k: v for k, v in flat.items() if not k.startswith(SAME) and flatten(config).get(k, object()) != v}
    if any(k.startswith(SCHEDULE) for k in changed):
        # Megatron-Core's scheduler takes its values from the checkpoint unless told to override them
        for key, value in (("scheduler.override_opt_param_scheduler", True),
                           ("scheduler.use_checkpoint_opt_param_scheduler", False)):
            if flat.get(key) is None:
                flat[key], origin[key] = value, f"{said}: the schedule changed"
    flat["job.fork"] = {"from": source.id, "iteration": iteration, "path": save,
                        "changed": {k: _plain(v) for k, v in sorted(changed.items())}}


def iterations(save: str, ssh: dict | None) -> list[int]:
    """The iterations checkpointed in `save` (its iter_NNNNNNN directories), oldest first."""
    try:
        out = run(["find", save, "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-name", "iter_*"], ssh).stdout
    except ClusterError:
        return []
    return sorted(int(m.group(1)) for line in out.splitlines()
                  if (m := ITERATION_DIR.fullmatch(line.rstrip("/").rsplit("/", 1)[-1])))


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
