"""The settings of `ultra3 data prep rl`: its config, checked, with one line per bad value."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DataPrepError
from .settings import NAME, Run, int_value, run_values, str_value

PROG = "ultra3 data prep rl"
# the placeholder sources NVIDIA's fill_placeholders.py restores from, with the split of each it indexes
SOURCES = {"dapo": "train", "skywork": "math"}


@dataclass
class Source:
    """A dataset placeholder rows are restored from (a local file, directory or glob, or hf://org/name)."""

    path: str
    split: str
    revision: str | None


@dataclass
class Settings(Run):
    source: str  # hf://org/name or a local directory holding <blend>.jsonl
    revision: str | None
    blends: list
    val_rows: int
    placeholders: dict  # {source name: Source}, only those given
    object_store_mb: int


def _blends(cfg: dict) -> list:
    blends = cfg.get("blends")
    if not blends or not isinstance(blends, list):
        raise DataPrepError("blends is empty: list the blends to prepare (rlvr1, rlvr2, ifbench, rlhf, reasoning, "
                            "swe, mopd)")
    for i, name in enumerate(blends):
        if not isinstance(name, str) or not NAME.match(name):
            raise DataPrepError(f"blends[{i}] must be letters, digits, '.', '_' or '-', not {name!r}")
        if blends.index(name) != i:
            raise DataPrepError(f"blends[{i}] {name!r} is listed twice")
    return list(blends)


def _placeholders(cfg: dict) -> dict:
    raw = cfg.get("placeholders") or {}
    if not isinstance(raw, dict) or set(raw) - set(SOURCES):
        raise DataPrepError(f"placeholders must map {' and '.join(SOURCES)} to {{path, split, revision}}, not {raw!r}")
    given = {}
    for name, entry in raw.items():
        entry = entry or {}
        if not isinstance(entry, dict) or set(entry) - {"path", "split", "revision"}:
            raise DataPrepError(f"placeholders.{name} must be a mapping of path, split and revision, not {entry!r}")
        path = str_value(entry, "path")
        if path:
            given[name] = Source(path, str_value(entry, "split") or SOURCES[name], str_value(entry, "revision"))
    return given


def parse_settings(cfg: dict) -> Settings:
    if not isinstance(cfg, dict):
        raise DataPrepError("the config is not a mapping")
    return Settings(
        source=str_value(cfg, "source", required=True),
        revision=str_value(cfg, "revision"),
        blends=_blends(cfg),
        val_rows=int_value(cfg, "val_rows", 100, 1),
        placeholders=_placeholders(cfg),
        object_store_mb=int_value(cfg, "object_store_mb", 256, 80),
        **run_values(cfg),
    )
