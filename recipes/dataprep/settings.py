"""What the data-prep runtimes share before the work starts: the command line (`cli`), reading the config,
typed config values, the keys of every run (`Run`), the settings of the tokenizing two (`Common`), and finding
the input files of the blend (local first, then the hub)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..contract import INPUT_ERROR_EXIT, NAME  # NAME: what a dataset's name may be (its output directory)
from . import inputs, line_reader
from .cluster import BACKENDS, ClusterError
from .errors import DISK_FULL, DataPrepError


def cli(prog: str, description: str, run: Callable[[str], int], argv: list[str] | None = None) -> int:
    """`--config PATH` to `run`; config and input errors, and a full disk: one line, INPUT_ERROR_EXIT; Ray's: one
    line, 1."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="the resolved stage config (YAML)")
    args = parser.parse_args(argv)
    try:
        return run(args.config)
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
    except ClusterError as e:  # Ray could not be started or reached: not a traceback
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


def int_value(cfg: dict, key: str, default, low: int, allow_none: bool = False):
    value = cfg.get(key, default)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DataPrepError(f"{key} must be an integer >= {low}{' or null' if allow_none else ''}, not {value!r}")
    return value


def _share(cfg: dict, key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise DataPrepError(f"{key} must be a number from 0 to 1, not {value!r}")
    return float(value)


def bool_value(cfg: dict, key: str, default: bool = False) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise DataPrepError(f"{key} must be true or false, not {value!r}")
    return value


def str_value(cfg: dict, key: str, default=None, required: bool = False) -> str | None:
    value = cfg.get(key, default)
    if value is None or value == "":
        if required:
            raise DataPrepError(f"{key} is not set")
        return None
    if not isinstance(value, str):
        raise DataPrepError(f"{key} must be a string, not {value!r}")
    return value


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
    """The keys of every data prep (`run_values`): where its output goes and how the run goes."""

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

    @property
    def out(self) -> str:
        return os.path.join(self.output_dir, f"sample-{self.sample}") if self.sample else self.output_dir


@dataclass
class Common(Run):
    """The settings of the two tokenizing runtimes (each adds its own in a subclass)."""

    datasets: list
    tokenizer: str
    num_shards: int


def common_values(cfg: dict, datasets: list, num_shards: int) -> dict:
    """The fields of Common from the config, checked (`num_shards`: its default)."""
    return {
        "datasets": datasets,
        "tokenizer": str_value(cfg, "tokenizer", required=True),
        "num_shards": int_value(cfg, "num_shards", num_shards, 1),
        **run_values(cfg),
    }


def run_values(cfg: dict) -> dict:
    """The keys every data prep has (where its output goes and how the run goes), checked."""
    interval = cfg.get("progress_interval", 30)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise DataPrepError(f"progress_interval must be a number of seconds > 0, not {interval!r}")
    return {
        "output_dir": os.path.abspath(os.path.expanduser(str_value(cfg, "output_dir", required=True))),
        "sample": int_value(cfg, "sample", None, 1, allow_none=True),
        "force": bool_value(cfg, "force"),
        "strict": bool_value(cfg, "strict"),
        "max_bad_fraction": _share(cfg, "max_bad_fraction", 0.01),
        "max_record_bytes": int_value(cfg, "max_record_bytes", line_reader.MAX_RECORD_BYTES, 1),
        "job": (cfg.get("job") or {}).get("id") if isinstance(cfg.get("job"), dict) else None,
        "workers": int_value(cfg, "workers", None, 1, allow_none=True),
        "hf_cache_dir": str_value(cfg, "hf_cache_dir"),
        "progress_interval": float(interval),
        "backend": _backend(cfg),
    }


def _backend(cfg: dict) -> str:
    backend = cfg.get("backend") or "auto"
    if backend not in BACKENDS:
        raise DataPrepError(f"backend must be {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, not {backend!r}")
    return backend


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
