"""Dotted keys ("model.seq_length") over nested config dicts. Stdlib only, no imports: any module may use it."""

from __future__ import annotations

from typing import Any


def get(tree: object, dotted: str, default: Any = None) -> Any:
    """tree["a"]["b"] for "a.b". `default` when a key is missing, a level (a section or the value itself) is
    None, or a section is not a dict (a list is a value: no indices). Falsy values (0, False, "") come back."""
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return default
        node = node.get(part)
        if node is None:
            return default
    return node


def put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Sets tree["a"]["b"] = value for "a.b", making each missing section; a section that is not a dict (None,
    a value, a list) is replaced by an empty one."""
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    tree[last] = value
