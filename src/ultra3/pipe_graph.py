"""A pipe's steps as a graph: `waits` maps each step id to the ids of the steps it waits for (those whose outputs
it reads, and those its `after:` names). Ids are kept in the pipe config's order wherever an order is free."""

from __future__ import annotations

Waits = dict[str, list[str]]


def cycle(waits: Waits) -> list[str] | None:
    """A cycle as [a, b, ..., a] (a waits for b, ...), the first one found in the config's order; None if none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for nxt in waits.get(node, []):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done and (found := visit(nxt)):
                return found
        path.pop()
        done.add(node)
        return None

    return next((found for node in waits if node not in done and (found := visit(node))), None)


def order(ids: list[str], waits: Waits) -> list[str]:
    """`ids` with every step after the ones it waits for (the config's order where that leaves a choice); edges to
    ids not in `ids` do not count. The graph has no cycle."""
    out: list[str] = []
    while len(out) < len(ids):
        out.append(next(i for i in ids if i not in out and all(w in out or w not in ids for w in waits.get(i, []))))
    return out


def dependents(step: str, waits: Waits) -> list[str]:
    """The steps that wait for `step`, directly or through others, in the order of `waits`."""
    found = {step}
    grew = True
    while grew:
        more = {s for s, before in waits.items() if s not in found and found.intersection(before)}
        found |= more
        grew = bool(more)
    return [s for s in waits if s in found and s != step]


def critical_path(ids: list[str], waits: Waits, hours: dict[str, float]) -> list[str]:
    """The chain of waits that takes longest: the wall time of the whole graph when independent steps run side by
    side. A step without `hours` may take any time, so the chain with the most of those comes first, then the one
    whose hours add up to the most, then the one of more steps. `ids` in an order from `order`."""
    best: dict[str, tuple[int, float, list[str]]] = {}
    for i in ids:
        unknown, total, path = max((best[w] for w in waits.get(i, []) if w in best), key=_weight, default=(0, 0.0, []))
        best[i] = (unknown + (i not in hours), total + hours.get(i, 0.0), [*path, i])
    return max(best.values(), key=_weight)[2] if best else []


def _weight(entry: tuple[int, float, list[str]]) -> tuple[int, float, int]:
    return entry[0], entry[1], len(entry[2])
