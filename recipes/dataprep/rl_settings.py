"""The settings of `ultra3 data prep rl`: its config, read as the launcher compiled and checked it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DataPrepError
from .settings import NAME, Run, fields, run_given, take

PROG = "ultra3 data prep rl"
SOURCES = ("dapo", "skywork")  # the placeholder sources NVIDIA's fill_placeholders.py restores from


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
    raw = take(cfg, "placeholders", dict)
    if set(raw) - set(SOURCES):
        raise DataPrepError(f"placeholders must map {' and '.join(SOURCES)} to {{path, split, revision}}, not {raw!r}")
    given = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or set(entry) - {"path", "split", "revision"}:
            raise DataPrepError(f"placeholders.{name} must be a mapping of path, split and revision, not {entry!r}")
        where = f"placeholders.{name}."
        if path := take(entry, "path", str | None, where):
            given[name] = Source(path, take(entry, "split", str, where), take(entry, "revision", str | None, where))
    return given


def parse_settings(cfg: dict) -> Settings:
    if not isinstance(cfg, dict):
        raise DataPrepError("the config is not a mapping")
    return Settings(**fields(cfg, Settings, blends=_blends(cfg), placeholders=_placeholders(cfg), **run_given(cfg)))
