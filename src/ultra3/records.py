"""The job registry ($NEMOTRON_HOME/jobs/<id>.json): one record per submitted job, so status, logs and
cancel work from any later shell; and the State a job is in."""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

from . import record_index
from .contract import read_json
from .errors import UserError
from .findings import skipped
from .paths import state_home

# a record of an older launcher had these fields of its executor's beside the others: they are its handle's
OLD_HANDLE = ("slurm_id", "pid", "started", "ssh", "ray_address")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


@dataclass
class JobRecord:
    id: str
    stage: str
    config: str
    executor: str  # local | slurm | ray
    mode: str  # attached | detached | local
    submitted: float
    job_dir: str  # the experiment dir (on the cluster for SSH submissions)
    task: str
    log_glob: str  # the job's log file(s), relative to job_dir
    profile: str | None = None
    # what its executor finds the job by, in the executor's own fields (Executor.handle_types): Slurm's job id
    # and SSH settings, a local process's pid and start time, a Ray cluster's address and submission id
    handle: dict[str, object] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)  # ids of the jobs it waits for (Slurm afterok)
    pipe: str | None = None  # the pipe run it belongs to

    @property
    def task_dir(self) -> str:
        return f"{self.job_dir}/{self.task}"


Checker = Callable[[JobRecord], "str | None"]  # what is wrong with a record beyond its fields' types


@dataclass
class State:
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... or UNKNOWN
    exit_code: int | None = None
    reason: str = ""  # why it is pending, or why it failed
    source: str = ""  # sacct, squeue, job dir, process
    upstream: str | None = None  # the job of `after` that holds it back or cancelled it

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def label(self) -> str:
        """The state, with the upstream job that decides it: `CANCELLED (upstream <id> FAILED)`."""
        return f"{self.state} ({self.reason})" if self.upstream else self.state


def registry_dir() -> Path:
    home = state_home()
    if home.exists() and not home.is_dir():
        raise UserError(f"NEMOTRON_HOME: {home} is a file, not a directory; point NEMOTRON_HOME at a directory "
                        "(default ~/.nemotron)")
    return home / "jobs"


def save(record: JobRecord, alias: str | None = None) -> None:
    """`alias`: the id its scheduler knows it by, which `nemotron jobs` takes too (record_index)."""
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True)
    indexed = record_index.current(folder)  # else the next look rebuilds it
    path = folder / f"{record.id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2))
    tmp.replace(path)
    if indexed and (line := record_index.entry(path.stem, record.submitted, alias)):
        record_index.add(folder, line)


def _read(path: Path, check: Checker | None = None) -> JobRecord | None:
    try:
        data = read_json(str(path))
    except FileNotFoundError:
        return None  # removed meanwhile
    except (OSError, ValueError) as e:
        skipped(str(path), "job record", str(e))
        return None
    if why := _problem(data := _upgraded(data)):
        skipped(str(path), "job record", why)
        return None
    record = JobRecord(**data)
    if check and (why := check(record)):
        skipped(str(path), "job record", why)
        return None
    return record


def _upgraded(data: object) -> object:
    """A record of an older launcher in this one's shape: its executor's fields moved into the handle (unset
    ones left out)."""
    if not isinstance(data, dict) or "handle" in data:
        return data
    rest = {k: v for k, v in data.items() if k not in OLD_HANDLE}
    return {**rest, "handle": {k: v for k, v in data.items() if k in OLD_HANDLE and v is not None}}


def _problem(data: object) -> str | None:
    """What keeps a record's JSON from being a JobRecord the commands can rely on; None when nothing does."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    if unknown := sorted(set(data) - set(_checks())):
        return f"unknown field {unknown[0]!r} (written by a newer launcher?)"
    for name, (f, fits) in _checks().items():
        if name not in data and f.default is f.default_factory is MISSING:
            return f"no {name}"
        if name in data and not fits(data[name]):
            return f"{name} is {json.dumps(data[name])[:40]}, not {f.type}"
    return None


@functools.cache
def _checks() -> dict[str, tuple[Field, Callable[[object], bool]]]:
    """Each field of JobRecord, with the check that a JSON value is of its type."""
    hints = typing.get_type_hints(JobRecord)
    return {f.name: (f, _check(hints[f.name])) for f in fields(JobRecord)}


def _check(hint: object) -> Callable[[object], bool]:
    """Whether a JSON value is of type `hint` (a bool is no number, a float finite)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        either = [_check(a) for a in args]
        return lambda v: any(fits(v) for fits in either)
    if origin in (list, dict):
        item = _check(args[-1])
        return lambda v: isinstance(v, origin) and all(map(item, v.values() if origin is dict else v))
    if hint is float:
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v)
    return lambda v: isinstance(v, hint) and not (isinstance(v, bool) and hint is int)


def handle_problem(handle: dict[str, object], types: dict[str, object]) -> str | None:
    """What keeps a record's handle from being one its executor reads: `types` maps each of its fields to its type."""
    for name, value in handle.items():
        if name not in types:
            return f"unknown handle field {name!r} (written by a newer launcher?)"
        if not _check(types[name])(value):
            hint = types[name]
            return f"{name} is {json.dumps(value)[:40]}, not {hint.__name__ if isinstance(hint, type) else hint}"
    return None


def _finite(number: int | float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int past float's range
        return False


def load(job_id: str) -> JobRecord | None:
    return _read(registry_dir() / f"{job_id}.json")


Alias = Callable[[JobRecord], "str | None"]  # the id its scheduler knows a (checked) record by


def newest(n: int, check: Checker, alias: Alias) -> list[JobRecord]:
    """The n newest readable records, newest first, reading only those (and the damaged ones, to name them)."""
    folder = registry_dir()
    found: list[JobRecord] = []
    names = _index(folder, check, alias).newest(n)
    for name in names:  # some may have been damaged since the index was written: the next ones then
        if len(found) < n and (record := _read(folder / f"{name}.json", check)):
            found.append(record)
    if len(found) < n and len(names) > n:  # beyond the index's margin
        return all_records(check)[:n]
    return found


def matching(ref: str, check: Checker, alias: Alias) -> tuple[list[JobRecord], list[JobRecord]]:
    """The readable records `ref` names exactly (its id or its scheduler's id), and those whose id, or the part
    after its first `_`, starts with it; each newest first."""
    folder = registry_dir()
    exact, prefixed = _index(folder, check, alias).matching(ref) if ref else ([], [])
    return tuple([r for n in names if (r := _read(folder / f"{n}.json", check))]  # type: ignore[return-value]
                 for names in (exact, prefixed))


def _index(folder: Path, check: Checker, alias: Alias) -> record_index.Index:
    """The index of the registry (rebuilt where it does not vouch for it); each damaged record named."""
    if not folder.is_dir():
        return record_index.Index(b"")
    index = record_index.read(folder) or _rebuild(folder, check, alias)
    if any(_read(folder / f"{name}.json", check) for name in index.damaged()):  # repaired by hand
        index = _rebuild(folder, check, alias)
    return index


def _rebuild(folder: Path, check: Checker, alias: Alias) -> record_index.Index:
    as_of = record_index.stamp(folder)
    entries, damaged = [], []
    for path in folder.glob("*.json"):
        record = _read(path, check)
        if (name := record_index.name(path.stem)) is None:
            skipped(str(path), "job record", "its file name holds a tab or a line break")
        elif record:
            entries.append((record.submitted, record_index.entry(path.stem, record.submitted, alias(record))))
        elif path.exists() or path.is_symlink():  # not removed meanwhile
            damaged.append(name)
    return record_index.write(folder, entries, damaged, as_of)


def all_records(check: Checker | None = None) -> list[JobRecord]:
    """Every readable record, newest first; `check` (what its executor finds wrong with it) skips more."""
    records = [r for r in (_read(path, check) for path in registry_dir().glob("*.json")) if r]
    return sorted(records, key=lambda r: r.submitted, reverse=True)
