"""What a completed job publishes (recipes/launch.py, once its stage ended well): each output it declared
(`job.produces`) as a manifest in the artifact store (contract.publish), counted on disk, and the job's own record
of them, `<job dir>/outputs.json`. Runtime only: the launcher reads what this writes through the contract."""

from __future__ import annotations

import json
import os
import time

from .contract import (ARTIFACT_FORMAT, CONVERSION_REPORT, JOB_OUTPUTS, checkpoint_iteration, publish, read_manifest,
                       versions, write_atomic)


def describe(path: str) -> dict:
    """What can be counted of an output on disk: bytes; tokens of a data-prep output; the checkpoint's
    iteration; a converted checkpoint's parity figures."""
    info: dict = {}
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    info["bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files
                        if not os.path.islink(os.path.join(d, f)))
    for summary in ("manifest.json", "metadata.json"):  # written by the data-prep runtimes
        try:
            with open(os.path.join(folder, summary)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        totals = meta.get("totals") if isinstance(meta, dict) else None
        tokens = (totals or meta).get("tokens") if isinstance(totals or meta, dict) else None
        if isinstance(tokens, dict):
            tokens = tokens.get("total")
        if isinstance(tokens, int):
            info["tokens"] = tokens
    try:  # written by `ultra3 convert`: the gate the checkpoint passed
        with open(os.path.join(folder, CONVERSION_REPORT)) as f:
            parity = json.load(f).get("parity")
        if isinstance(parity, dict):
            info["parity"] = parity
    except (OSError, ValueError, AttributeError):
        pass
    if (iteration := checkpoint_iteration(folder)) is not None:
        info["iterations"] = iteration
    return info



def versioned(root: str, inp: dict) -> str | None:
    """NAME:vN of a consumed artifact; a pipe wires an input before its producer has published, so the
    version is looked up now, from the producer's manifest."""
    ref = inp.get("artifact")
    if not ref or ":" in ref:
        return ref
    folder = os.path.join(root, ref)
    for version in sorted(versions(folder), reverse=True):
        manifest = read_manifest(os.path.join(folder, f"v{version}", "manifest.json"))
        if manifest and manifest.get("producer") == inp.get("producer"):
            return f"{ref}:v{version}"
    return ref


def record_outputs(cfg: dict, seconds: float) -> list[dict]:
    """Publish every output the completed job declared (`job.produces`) and write `<job dir>/outputs.json`.
    A manifest carries NVIDIA's fields (name, version, type, path, created_at, producer, metadata, inputs)
    and ours: the producing stage, config, profile and config digest, the job's seconds, the sample size, the
    variant."""
    job = cfg.get("job") or {}
    published = []
    for out in job.get("produces") or []:
        manifest = {
            "format": ARTIFACT_FORMAT, "name": out["name"], "type": out["kind"], "path": out["path"],
            "producer": job.get("id"), "stage": job.get("stage"), "config": job.get("config"),
            "profile": job.get("profile"), "config_digest": job.get("digest"), "sample": cfg.get("sample"),
            **({"variant": job["variant"]} if job.get("variant") else {}),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "created_ts": time.time(),
            "seconds": round(seconds, 1), **({"fork": job["fork"]} if job.get("fork") else {}),
            "inputs": [{**{k: i.get(k) for k in ("name", "key", "path", "producer")},
                        "artifact": versioned(job["artifacts_root"], i)}
                       for i in job.get("inputs") or [] if i.get("path")],
            "metadata": describe(out["path"]),
        }
        published.append(publish(job["artifacts_root"], manifest))
    write_atomic(os.path.join(job["dir"], JOB_OUTPUTS), json.dumps(published, indent=2) + "\n")
    return published
