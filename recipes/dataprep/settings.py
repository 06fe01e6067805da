"""What the data-prep runtimes share before the work starts: the command line (`cli`), reading the config,
typed config values, the keys of every run (`Run`), the settings of the tokenizing two (`Common`), and finding
the input files of the blend (local first, then the hub)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass

from ..contract import ATTEMPTS_FILE, INPUT_ERROR_EXIT, NAME, ledger_entries  # NAME: what a dataset name may be
from .. import quiet
from . import inputs, stop
from .cluster import ClusterError
from .errors import DISK_FULL, DataPrepError, HubUnreachable


def cli(prog: str, description: str, run: Callable[[str], int], argv: list[str] | None = None,
        stops: bool = False) -> int:
    """`--config PATH` to `run`; config and input errors, and a full disk: one line, INPUT_ERROR_EXIT; Ray, or the
    Hugging Face Hub, out of reach: one line, 1. `stops`: the run keeps its finished tasks, so the time-limit signal
    ends it with CONTINUE_EXIT, or 1 when no task finished in this allocation (stop.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="the resolved stage config (YAML)")
    args = parser.parse_args(argv)
    quiet.install()
    try:
        with stop.armed() if stops else contextlib.nullcontext():
            return run(args.config)
    except stop.TimeLimit:
        return stop.stopped(prog)
    except DataPrepError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return INPUT_ERROR_EXIT
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        where = f" in {os.path.dirname(e.filename)}" if e.filename else ""
        print(f"{prog}: error: {e.strerror}{where}: the filesystem of output_dir (or hf_cache_dir) is full; free "
              "space or choose another output_dir and run again (what is finished is kept)", file=sys.stderr,
              flush=True)
        return INPUT_ERROR_EXIT
    except (ClusterError, HubUnreachable) as e:  # Ray or the Hub could not be reached: the machine's, not a traceback
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130


def load_config(path: str) -> dict:
    try:
        import yaml
    except ImportError:
        raise DataPrepError(f"PyYAML is not installed in this Python ({sys.executable})") from None
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except OSError as e:
        raise DataPrepError(f"config {path} is not readable ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise DataPrepError(f"config {path} is not valid YAML ({str(e).splitlines()[0]})") from None


def take(cfg: dict, key: str, kind, where: str = ""):
    """The config's `key` (under `where`, a dotted prefix), of `kind` (a type, or a union with None), as the launcher
    compiled and checked it: the stage's YAML holds every default and the launcher every range, so the one check
    here is for a config written by hand: a key missing, or a value not of its kind, is one line naming it."""
    if key not in cfg:
        raise DataPrepError(f"{where}{key} is not set; set it: the config the launcher compiles has every key, with "
                            "its default from the stage's YAML (the dry run prints it)")
    value = cfg[key]
    kinds = typing.get_args(kind) or (kind,)
    if not any(value is None if k is type(None) else _is(value, k) for k in kinds):
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
                 dict: "a mapping", type(None): "null"}
        raise DataPrepError(f"{where}{key} must be {' or '.join(names[k] for k in kinds)}, not {value!r}")
    return float(value) if kind is float else value


def _is(value, kind) -> bool:
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def fields(cfg: dict, settings: type, **given) -> dict:
    """The fields of the `settings` dataclass: those `given` (derived by the caller), the others taken from the
    config by their names and declared types (`take`)."""
    hints = typing.get_type_hints(settings)
    return {f.name: given[f.name] if f.name in given else take(cfg, f.name, hints[f.name])
            for f in dataclasses.fields(settings)}


@dataclass
class Dataset:
    """One dataset of the blend; `field` is the column read (text_field, or messages_field for SFT)."""

    name: str
    path: str
    field: str
    weight: float
    split: str
    subset: str | None
    revision: str | None


@dataclass
class Run:
    """The keys of every data prep (configs/_shared/data_prep.yaml): where its output goes and how the run goes."""

    output_dir: str
    sample: int | None
    force: bool
    strict: bool
    max_bad_fraction: float
    max_record_bytes: int
    job: str | None  # the job's id (job.id of its config): who holds the output dir's lock
    workers: int | None
    hf_cache_dir: str | None
    progress_interval: float
    backend: str  # cluster.BACKENDS: where the tasks run
    object_store_mb: int

    @property
    def out(self) -> str:
        return os.path.join(self.output_dir, f"sample-{self.sample}") if self.sample else self.output_dir


@dataclass
class Common(Run):
    """The settings of the two tokenizing runtimes (each adds its own in a subclass)."""

    datasets: list
    tokenizer: str
    num_shards: int


def run_given(cfg: dict) -> dict:
    """The fields of Run that are not config keys as they stand: output_dir made absolute, the job's id, and
    `force` for the run's first attempt only."""
    job = cfg.get("job")
    return {"output_dir": os.path.abspath(os.path.expanduser(take(cfg, "output_dir", str))),
            "job": job.get("id") if isinstance(job, dict) else None,
            "force": take(cfg, "force", bool) and not _continued(job)}


def _continued(job) -> bool:
    """Whether this is a later attempt of the run (the job requeued: recipes/attempts.py's ledger in the job dir
    names an earlier start): the first attempt redid everything, and what it and the others since finished is
    kept, or a forced run stopped at every time limit would start over in every allocation."""
    folder = job.get("dir") if isinstance(job, dict) else None
    try:
        with open(os.path.join(folder, ATTEMPTS_FILE), encoding="utf-8") as f:
            return sum(e.get("event") == "start" for e in ledger_entries(f.read())) > 1
    except (OSError, TypeError, ValueError):
        return False


def resolve_files(settings) -> dict:
    """{dataset name: ([(path, format)], hub provenance or None)}; local paths are checked before anything
    is downloaded."""
    found: dict = {}
    for d in settings.datasets:
        if d.path.startswith("hf://"):
            continue
        paths = inputs.expand(d.path)
        if not paths:
            raise DataPrepError(f"dataset {d.name}: {d.path} matches no input file")
        found[d.name] = ([(p, inputs.detect_format(p)) for p in paths], None)
    for d in settings.datasets:
        if d.path.startswith("hf://"):
            from . import hub

            paths, provenance = hub.resolve_dataset(d.path, d.split, d.subset, d.revision, settings.hf_cache_dir)
            found[d.name] = ([(p, inputs.detect_format(p)) for p in paths], provenance)
    return {d.name: found[d.name] for d in settings.datasets}


def dataset_entries(cfg: dict, field: str, default_field: str, what: str) -> list[tuple]:
    """The blend's datasets, checked: (name, path, <field>, weight, split, subset, revision) each."""
    raw = cfg.get("datasets")
    if not raw or not isinstance(raw, list):
        raise DataPrepError(f"datasets is empty: list {what}")
    keys = ("name", "path", field, "weight", "split", "subset", "revision")
    entries, seen = [], set()
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            raise DataPrepError(f"datasets[{i}] must be a mapping with name and path, not {d!r}")
        unknown = set(d) - set(keys)
        if unknown:
            raise DataPrepError(f"datasets[{i}] has unknown key(s) {', '.join(sorted(unknown))} (known: "
                                f"{', '.join(keys)})")
        name = d.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise DataPrepError(f"datasets[{i}].name must be letters, digits, '.', '_' or '-', not {name!r}")
        if name in seen:
            raise DataPrepError(f"datasets[{i}].name {name!r} is used twice")
        seen.add(name)
        path = d.get("path")
        if not isinstance(path, str) or not path:
            raise DataPrepError(f"dataset {name}: path is not set")
        weight = d.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise DataPrepError(f"dataset {name}: weight must be a number > 0, not {weight!r}")
        for key in (field, "split", "subset", "revision"):
            if d.get(key) is not None and not isinstance(d.get(key), str):
                raise DataPrepError(f"dataset {name}: {key} must be a string, not {d.get(key)!r}")
        entries.append((name, path, d.get(field) or default_field, float(weight), d.get("split") or "train",
                        d.get("subset"), d.get("revision")))
    return entries
