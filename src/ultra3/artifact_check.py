"""Whether what a completed job published is still there, checked cheaply against its manifests: a pipe takes a
step as done only when it is. On this machine: the path exists (a directory not empty), a blend's shards exist,
a checkpoint's tracker names an iteration directory that exists, a data prep's summary file is there when the
manifest counted its tokens. Over SSH: the paths exist. Sizes are not compared: a later run may add to the same
directory, or prune it (an RL experiment's checkpoints)."""

from __future__ import annotations

import os

from .input_paths import blend_problem
from .contract import CHECKPOINT_TRACKERS, checkpoint_iteration
from .errors import ClusterError
from .ssh import run

SUMMARIES = ("manifest.json", "metadata.json")  # what contract.describe counted the tokens from


def gone(manifests: list[dict], ssh: dict | None) -> str | None:
    """Why these outputs of one job can no longer be taken as done (the first reason found), or None."""
    if ssh:
        return _gone_there(manifests, ssh)
    for m in manifests:
        if why := _problem(m):
            return f"its output {m['path']} recorded by {m.get('producer')} {why}"
    return None


def _problem(manifest: dict) -> str | None:
    path = os.path.expanduser(str(manifest["path"]))
    if not os.path.exists(path):
        return "is gone"
    if os.path.isdir(path) and not os.listdir(path):
        return "is empty"
    if manifest.get("type") == "pretrain-data" and os.path.isfile(path) and (why := blend_problem(path)):
        return f"is broken: {why}"
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    meta = manifest.get("metadata") or {}
    if meta.get("iterations") is not None:
        newest = checkpoint_iteration(folder)
        if newest is None:
            return f"has lost its checkpoint tracker ({' or '.join(CHECKPOINT_TRACKERS)})"
        if not os.path.isdir(os.path.join(folder, f"iter_{newest:07d}")):
            return f"has lost the checkpoint its tracker names (iteration {newest})"
    if meta.get("tokens") is not None and not any(os.path.isfile(os.path.join(folder, s)) for s in SUMMARIES):
        return f"has lost its summary ({' or '.join(SUMMARIES)})"
    return None


def _gone_there(manifests: list[dict], ssh: dict) -> str | None:
    paths = [str(m["path"]) for m in manifests]
    done = run(["sh", "-c", 'for p; do [ -e "$p" ] || printf "%s\\n" "$p"; done', "sh", *paths], ssh, timeout=60)
    if done.returncode != 0:
        raise ClusterError(f"cannot check the outputs {', '.join(paths)} on {ssh['host']}: "
                           f"{done.stderr.strip() or 'ssh failed'}")
    missing = done.stdout.splitlines()
    m = next((m for m in manifests if str(m["path"]) in missing), None)
    return f"its output {m['path']} recorded by {m.get('producer')} is gone from {ssh['host']}" if m else None
