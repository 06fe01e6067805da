"""What the launcher knows of the released Megatron-Bridge API, without importing it: record.json, read
from the wheels' source by scripts/megatron_api_record.py (the versions are in the record).

`section_schema` turns a recorded config class into a schema of ultra3.schema (so any real key is
accepted with its type, and a misspelt one is an error with a did-you-mean); `signature` and
`constant` let tests check every call the runtime makes on Megatron-Bridge against the record.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("record.json")
_SCALARS: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list,
                            "list[int]": list[int], "list[str]": list[str], "list[float]": list[float],
                            "any": object}
UNSETTABLE = ("callable", "dtype")  # set by the recipe or the precision preset, not from YAML


@cache
def record() -> dict:
    return json.loads(RECORD.read_text())


def versions() -> dict[str, str]:
    return record()["versions"]


def section_class(section: str) -> str:
    """The recorded class of a ConfigContainer section (`model` -> HybridModelProvider)."""
    return record()["sections"][section]


def class_fields(name: str) -> dict[str, str]:
    return record()["classes"][name]


def section_schema(name: str) -> dict[str, Any]:
    """The schema of a recorded class: its settable fields with their types; a field typed as another
    recorded class is a nested table."""
    classes = record()["classes"]
    schema: dict[str, Any] = {}
    for key, t in classes[name].items():
        parts = t.split("|")
        if any(p in UNSETTABLE for p in parts):
            continue
        if t in classes:
            schema[key] = section_schema(t)
        elif all(p in _SCALARS for p in parts):
            types = tuple(_SCALARS[p] for p in parts)
            schema[key] = types[0] if len(types) == 1 else types
        else:  # a union with a class: any value, Megatron-Bridge checks it
            schema[key] = object
    return schema


def container_sections() -> dict[str, dict[str, Any]]:
    """Every ConfigContainer section that is a config class, as a schema."""
    classes = record()["classes"]
    return {s: section_schema(c) for s, c in record()["sections"].items() if c in classes}


def signature(function: str) -> dict:
    """`{"params": [...], "kwonly": [...], "varargs": bool, "varkw": bool}` of a recorded function."""
    return record()["functions"][function]


def accepts(function: str, *keywords: str) -> bool:
    sig = signature(function)
    return sig["varkw"] or all(k in sig["params"] or k in sig["kwonly"] for k in keywords)


def constant(name: str) -> Any:
    return record()["constants"][name]


def hf_config_mapping() -> list[tuple[str, str]]:
    """The NemotronH bridge's (HF config key, Megatron model key) pairs, base mapping first."""
    return [tuple(pair) for pair in record()["hf_config_mapping"]]


def mixed_precision_presets() -> list[str]:
    return record()["mixed_precision_presets"]
