"""What both data-prep runtimes share before the work starts: reading the config, typed config values,
and finding the input files of the blend (local first, then the hub)."""

from __future__ import annotations

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
