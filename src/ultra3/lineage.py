"""`nemotron jobs lineage JOB`: the jobs and artifacts that led to a job's outputs, read from the
artifact manifests (each names the job that made it and the artifacts that job consumed)."""

from __future__ import annotations

import sys
from typing import TextIO

import yaml

from .artifacts import Store, read_files
from .contract import NAME, SMALL_FILE_MAX, small_text
from .executors import for_record
from .records import JobRecord, load

CONFIG_MAX = 16 * SMALL_FILE_MAX  # bytes of a job's config.yaml


def job_config(record: JobRecord) -> dict:
    """The job's resolved config from its job dir (empty when it cannot be read)."""
    from .errors import ClusterError

    try:
        found = read_files(f"{record.task_dir}/code/config.yaml", ["-maxdepth", "0"], for_record(record).remote(record),
                           CONFIG_MAX)
        config = yaml.safe_load(small_text(found[0][1], CONFIG_MAX)) if found else None
    except (ClusterError, ValueError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def said(fork: dict) -> str:
    """A forked run's origin (ultra3.fork): its source run, the iteration and the changed keys."""
    changed = fork.get("changed") if isinstance(fork.get("changed"), dict) else {}
    return f"forked from {fork['from']} at iteration {fork.get('iteration')}, changed: " \
           f"{', '.join(f'{k}={v}' for k, v in changed.items()) or 'nothing'}"


def print_lineage(record: JobRecord, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # the stream of the moment, not the one at import
    job = job_config(record).get("job") or {}
    if not job.get("artifacts_root"):
        out.write(f"{record.id}: its job dir holds no artifact record (submitted before artifacts, or not "
                  "readable from here)\n")
        return
    store = Store(job["artifacts_root"], for_record(record).remote(record))
    out.write(f"{record.id}  ({record.stage} -c {record.config})\n")
    made = _made_by(store, record.id)
    inputs = (made[0].get("inputs") or []) if made else [i for i in job.get("inputs") or [] if i.get("path")]
    _walk(store, made, inputs, job.get("fork"), out, "  ", {record.id})


def _made_by(store: Store, job_id: str) -> list[dict]:
    return [m for m in store.manifests() if m.get("producer") == job_id]


def _walk(store: Store, made: list[dict], inputs: list[dict], fork: dict | None, out: TextIO, indent: str,
          seen: set[str]) -> None:
    if isinstance(fork, dict) and isinstance(fork.get("from"), str):  # a manifest's, as the store holds it
        out.write(f"{indent}{said(fork)}\n")
        _upstream(store, fork["from"], out, indent + "  ", seen)
    for m in made:
        out.write(f"{indent}produced {m['name']}:v{m['version']}  {m['path']}\n")
    for inp in inputs:
        producer = inp.get("producer")
        via = f" <- {producer}" + (f" ({inp['artifact']})" if inp.get("artifact") else "") if producer else \
            "  (given as a path)"
        out.write(f"{indent}consumed {inp.get('key')} = {inp.get('path')}{via}\n")
        if producer:
            _upstream(store, producer, out, indent + "  ", seen)


def _upstream(store: Store, job_id: str, out: TextIO, indent: str, seen: set[str]) -> None:
    """A job the walk came to, once: from its published manifests, or, for one that published nothing (a run
    stopped before its end, as the source of a fork often is), from its record and job dir."""
    if job_id in seen:
        return
    seen.add(job_id)
    made = _made_by(store, job_id)
    if made:
        stage, config, inputs, fork = made[0].get("stage"), made[0].get("config"), made[0].get("inputs"), \
            made[0].get("fork")
    else:
        record = load(job_id) if isinstance(job_id, str) and NAME.match(job_id) else None  # a name, not a path
        job = (job_config(record).get("job") or {}) if record else {}
        stage, config, fork = (record.stage, record.config, job.get("fork")) if record else ("?", "?", None)
        inputs = [i for i in job.get("inputs") or [] if i.get("path")]
    out.write(f"{indent}{job_id}  ({stage} -c {config})\n")
    _walk(store, made, inputs or [], fork, out, indent + "  ", seen)
