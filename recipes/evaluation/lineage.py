"""The evaluated checkpoint's lineage as the artifact store records it: its artifact, the job that made it, and
every artifact that job consumed, back to the first (each manifest's `inputs`)."""

from __future__ import annotations

import os

from .. import contract, publish

FIELDS = ("name", "version", "type", "producer", "stage", "config", "path")
DEPTH = 32  # a chain is far shorter; a damaged store never loops us


def lineage(cfg: dict, key: str) -> list[dict]:
    """The manifests (their FIELDS) behind the input that filled config key `key`, nearest first; [] for a path
    no store artifact names."""
    job = cfg.get("job") or {}
    root = job.get("artifacts_root")
    entry = next((i for i in job.get("inputs") or [] if i.get("key") == key), None)
    if not root or not entry:
        return []
    found, seen = [], set()
    todo = [publish.versioned(root, entry)]
    while todo and len(found) < DEPTH:
        ref = todo.pop(0)
        if not ref or ":" not in ref or ref in seen:
            continue
        seen.add(ref)
        manifest = contract.resolve_ref(root, ref)
        if not manifest:
            continue
        found.append({k: manifest.get(k) for k in FIELDS})
        todo += [i.get("artifact") for i in manifest.get("inputs") or []]
    return found


def kind(path: str, chain: list[dict]) -> str:
    """The checkpoint's artifact kind from the store, else what its directory holds."""
    if chain:
        return str(chain[0]["type"])
    folder = os.path.expanduser(path)
    if any(os.path.isfile(os.path.join(folder, t)) for t in contract.CHECKPOINT_TRACKERS):
        return "megatron-checkpoint"
    if contract.quantization(folder):
        return "quantized-checkpoint"
    return "hf-checkpoint" if os.path.isfile(os.path.join(folder, "config.json")) else "hub model"
