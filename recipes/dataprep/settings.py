"""What both data-prep runtimes share before the work starts: reading the config, typed config values,
and finding the input files of the blend (local first, then the hub)."""

from __future__ import annotations

import re
import sys

from . import inputs
from .errors import DataPrepError


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


def str_value(cfg: dict, key: str, default=None, required: bool = False) -> str | None:
    value = cfg.get(key, default)
    if value is None or value == "":
        if required:
            raise DataPrepError(f"{key} is not set")
        return None
    if not isinstance(value, str):
        raise DataPrepError(f"{key} must be a string, not {value!r}")
    return value


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


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
