"""What the launcher knows of NeMo RL's Nemotron 3 Ultra configs without NeMo RL installed: record.json, read
from a NeMo RL repository at the pinned commit by scripts/nemo_rl_record.py.

`known` says whether a dotted key is one of a recorded config's (or lies in a table NeMo RL passes on
unchecked, such as vLLM's engine arguments); `suggest` finds the key a misspelt one meant; `tree` is the
recorded config as nested tables, for the dry run to show with our values merged in."""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("record.json")
# MOPD's teacher panel in the Ultra recipe: the general teacher (the Student RLVR policy), then one a role
TEACHER_ROLES = ("general", "rlhf", "ifbench", "reasoning", "swe")


@cache
def record() -> dict:
    return json.loads(RECORD.read_text())


def commit() -> str:
    return record()["commit"]


def files() -> dict[str, str]:
    """The pinned commit and, relative to a checkout, the recipes' folder, the entry point and the converter."""
    r = record()
    return {k: r[k] for k in ("commit", "directory", "entry", "converter")}


def names() -> list[str]:
    return list(record()["configs"])


def keys(config: str) -> dict[str, Any]:
    """The recorded config's dotted keys and values."""
    return record()["configs"][config]


def yaml_path(config: str) -> str:
    return f"{record()['directory']}/{config}.yaml"


def is_open(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in record()["open"])


def known(config: str, key: str) -> bool:
    """A recorded key, a table of them, or a key under a table NeMo RL passes on as it is."""
    flat = keys(config)
    return key in flat or is_open(key) or any(k.startswith(key + ".") for k in flat)


def suggest(config: str, key: str) -> str:
    close = difflib.get_close_matches(key, list(keys(config)), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def type_clash(config: str, key: str, value: Any) -> str | None:
    """Why `value` cannot replace the recorded value of `key` (a number for a string, a table for a number),
    or None. A recorded null or interpolation takes anything."""
    old = keys(config).get(key)
    if old is None or value is None or (isinstance(old, str) and old.startswith("${")):
        return None
    if isinstance(value, str) and value.startswith("${"):
        return None
    if _kind(old) != _kind(value):
        return f"NeMo RL's {config}.yaml has a {_kind(old)} here ({_short(old)}), not a {_kind(value)}"
    return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "list" if isinstance(value, list) else "string"  # a recorded long string is {"elided_chars": N}


def tree(config: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in keys(config).items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = f"<{value['elided_chars']} characters>" if isinstance(value, dict) and "elided_chars" in value \
            else value
    return out


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
