"""Evaluation results (`eval-results` artifacts, results.json): the scores under `nemotron jobs status JOB`, and
`nemotron jobs compare RESULT...` printing several side by side, each task's difference to the first and whether
it is inside their combined standard error (sqrt(se_a² + se_b²)). A RESULT is a job id (or a unique prefix), an
artifact NAME:latest / NAME:vN of this machine's store, or a path to a results.json (or the directory holding it)."""

from __future__ import annotations

import json
import math
import os

from .contract import RESULTS_FILE, read_small, resolve_ref, score_lines, small_text
from .errors import ClusterError, UserError
from .records import JobRecord

KIND = "eval-results"


def _job_results(record: JobRecord) -> tuple[str, dict] | None:
    """The path and content of a job's results.json; None when it declares none or it is not written (yet)."""
    from .artifacts import read_files
    from .executors import for_record
    from .lineage import job_config

    made = [o for o in (job_config(record).get("job") or {}).get("produces") or [] if o.get("kind") == KIND]
    if not made:
        return None
    try:
        found = read_files(made[0]["path"], ["-maxdepth", "0"], for_record(record).remote(record))
        return (made[0]["path"], json.loads(small_text(found[0][1]))) if found else None
    except (ClusterError, ValueError):
        return None


def status_lines(record: JobRecord) -> list[str]:
    """`scores:` and one line per task, for an eval job whose results are written."""
    found = _job_results(record)
    if not found or not isinstance(found[1], dict):
        return []
    return [f"scores:    {found[0]}", *(f"  {line}" for line in score_lines(found[1]))]


def load(ref: str) -> tuple[str, dict]:
    """(a label, the results) of a RESULT; UserError saying what the reference names instead."""
    if os.path.exists(ref):
        return load_path(ref, os.path.join(ref, RESULTS_FILE) if os.path.isdir(ref) else ref)
    if ":" in ref:
        from .executors.base import home_artifacts

        manifest = resolve_ref(str(home_artifacts()), ref)
        if not manifest or manifest.get("type") != KIND:
            raise UserError(f"{ref}: no {KIND} artifact of that name and version in {home_artifacts()}; see "
                            "`nemotron jobs list --stage eval`, or give the job id")
        return load_path(ref, manifest["path"])
    from . import jobs

    record = jobs.find(ref)
    found = _job_results(record)
    if not found:
        raise UserError(f"{ref}: job {record.id} ({record.stage}) has no results.json to read; give an eval job that "
                        "completed")
    return _checked(record.id, found[0], found[1])


def load_path(label: str, path: str) -> tuple[str, dict]:
    try:
        return _checked(label, path, json.loads(read_small(path)))
    except (OSError, ValueError) as e:
        raise UserError(f"{label}: its results {path} are not readable ({e})") from None


def _checked(label: str, path: str, results: object) -> tuple[str, dict]:
    if not isinstance(results, dict) or not isinstance(results.get("tasks"), dict):
        raise UserError(f"{label}: {path} holds no per-task scores (not an ultra3 eval results.json)")
    return label, results


def compare_lines(loaded: list[tuple[str, dict]]) -> list[str]:
    """The results side by side: a header naming each (its checkpoint and kind), then per task and metric each
    score ± stderr, and for every result after the first its difference to the first and whether that is inside
    their combined stderr."""
    lines = [f"[{i}] {label}: {(r.get('checkpoint') or {}).get('given') or (r.get('checkpoint') or {}).get('path')} "
             f"({(r.get('checkpoint') or {}).get('kind') or '?'}{', emulated' if r.get('emulation') else ''})"
             for i, (label, r) in enumerate(loaded, 1)]
    tasks = list(dict.fromkeys(name for _, r in loaded for name in r["tasks"]))
    rows = [("task", "metric", *(f"[{i}]" for i in range(1, len(loaded) + 1)),
             *(f"[{i}]-[1]" for i in range(2, len(loaded) + 1)))]
    for name in tasks:
        found = [task if isinstance(task := r["tasks"].get(name), dict) else {} for _, r in loaded]
        first = found[0]
        metric = str(first.get("metric") or next((f.get("metric") for f in found if f.get("metric")), "?"))
        rows.append((name, metric.removesuffix(",none"), *(_score(f) for f in found),
                     *(_difference(first, f) for f in found[1:])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return lines + [""] + ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _score(task: dict) -> str:
    score, stderr = _number(task.get("score")), _number(task.get("stderr"))
    if score is None:
        return "-"
    return f"{score:.4f}" + (f" ± {stderr:.4f}" if stderr is not None else "")


def _difference(first: dict, other: dict) -> str:
    a, b = _number(first.get("score")), _number(other.get("score"))
    if a is None or b is None:
        return "-"
    se_a, se_b = _number(first.get("stderr")), _number(other.get("stderr"))
    if se_a is None or se_b is None:
        return f"{b - a:+.4f} (no stderr)"
    combined = math.sqrt(se_a ** 2 + se_b ** 2)
    inside = abs(b - a) <= combined
    return f"{b - a:+.4f} ({'inside' if inside else 'outside'} stderr {combined:.4f})"
