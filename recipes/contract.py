"""The contract between the launcher and the job runtime: the one module both sides import.

Stdlib only. The launcher loads this very file (ultra3.contract); the runtime imports it as
`recipes.contract`. It holds what both sides must agree on and nothing else.

Artifacts. A job that completes publishes each output it declared (`job.produces` in its config) in the
artifact store, laid out as NVIDIA's CLI lays its manifest store:

    <root>/<name>/v<N>/manifest.json     one artifact version (one JSON object on one line)
    <root>/<name>/latest                 the newest version number, e.g. "3"

A version directory is claimed with an atomic mkdir, and files are written to a temporary name and
renamed, so two jobs publishing at once never share or half-write a version. The job's own record of
what it published is `<job dir>/outputs.json`.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import secrets
import socket
import time

# -- how a job ends and speaks -------------------------------------------------------------------
INPUT_ERROR_EXIT = 2  # the runtime refused its input: one line `<where>: error: <what and the fix>`
PREFLIGHT_EXIT = 3  # a preflight check failed: one line starting with PREFLIGHT_MARK
PREFLIGHT_MARK = "PREFLIGHT FAILED"
INPUT_ERROR = re.compile(r"^[\w. -]+: error: ")  # the start of a runtime's input-error line
CONFIG_FILE = "config.yaml"  # the job's resolved config, in its working directory
ENTRY_MODULE = "recipes.launch"  # `python -m recipes.launch --config config.yaml`, on every node
HEAD_NODE_VAR = "ULTRA3_HEAD_NODE"  # the first node's address, exported by the job script
GROUP_RESOURCE = "ultra3_group_"  # + a layout group's name: the Ray resource each node of that group has
IMAGE_ID = "/opt/ultra3/image.json"  # in an image `ultra3 container build` made: {"kind", "digest"}

# -- rules both sides apply ----------------------------------------------------------------------
NVFP4_CAPABILITIES = ((10, 0), (10, 3))  # Transformer Engine trains NVFP4 on SM 10.0 / 10.3 only


def trains_nvfp4(capability: tuple[int, int]) -> bool:
    return tuple(capability) in NVFP4_CAPABILITIES


def pad_seq_to_mult(tp: int, cp: int, sequence_parallel: bool) -> int:
    """The multiple every packed sequence is padded to: 2·CP for context parallelism's load balancing,
    CP·TP when sequence parallelism splits it over TP too (their lcm when both apply)."""
    cp_multiple = 2 * cp if cp > 1 else 1
    sp_multiple = cp * tp if sequence_parallel and tp > 1 else 1
    return cp_multiple * sp_multiple // math.gcd(cp_multiple, sp_multiple)


# -- artifacts -----------------------------------------------------------------------------------
ARTIFACT_FORMAT = 1
JOB_OUTPUTS = "outputs.json"  # in the job dir: the manifests the job published
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# a checkpoint directory of Megatron-Bridge names its newest iteration in one of these
CHECKPOINT_TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")


def artifact_name(kind: str, config: str, sample: int | None = None) -> str:
    """Outputs of different configs (and of samples) never share a name, so a tiny or sampled run is
    never the `latest` of the full run's artifact."""
    return f"ultra3-{kind}-{config}" + (f"-sample-{sample}" if sample else "")


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"  # unique across nodes
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def publish(root: str, manifest: dict) -> dict:
    """Store one artifact version; returns the manifest with its version."""
    name = manifest["name"]
    if not NAME.match(name):
        raise ValueError(f"artifact name {name!r} is not [A-Za-z0-9._-]")
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    version = max(versions(folder), default=0) + 1
    while True:
        try:
            os.mkdir(os.path.join(folder, f"v{version}"))
            break
        except FileExistsError:  # another job claimed it first
            version += 1
    manifest = {**manifest, "version": version}
    # metadata.json beside it, as NVIDIA's store has it (what `${art:NAME,FIELD}` reads)
    write_atomic(os.path.join(folder, f"v{version}", "metadata.json"), json.dumps(manifest.get("metadata") or {}))
    write_atomic(os.path.join(folder, f"v{version}", "manifest.json"), json.dumps(manifest) + "\n")
    # `latest` names the highest complete version: a publisher whose write may have overtaken a newer one's
    # (it read the versions before that one was complete) sees it on reading them again and writes again
    newest = 0
    while (highest := max(_complete(folder), default=0)) != newest:
        newest = highest
        write_atomic(os.path.join(folder, "latest"), f"{newest}\n")
    return manifest


def _complete(folder: str) -> list[int]:
    """The versions whose manifest is written."""
    return [v for v in versions(folder) if os.path.exists(os.path.join(folder, f"v{v}", "manifest.json"))]


def versions(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [int(n[1:]) for n in names if n.startswith("v") and n[1:].isdigit()]


def read_manifest(path: str) -> dict | None:
    try:
        with open(path) as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError):
        return None  # not yet written, or not ours
    return manifest if is_manifest(manifest) else None


def is_manifest(manifest: object) -> bool:
    """One of ours, whole: what readers rely on is there and of its type."""
    return isinstance(manifest, dict) and manifest.get("format") == ARTIFACT_FORMAT \
        and all(isinstance(manifest.get(k), str) for k in ("name", "type", "path")) \
        and isinstance(manifest.get("version"), int) and isinstance(manifest.get("created_ts", 0), (int, float)) \
        and isinstance(manifest.get("inputs", []), list)


def read_store(root: str) -> list[dict]:
    """Every artifact version in the store, newest first."""
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        for version in versions(os.path.join(root, name)):
            if manifest := read_manifest(os.path.join(root, name, f"v{version}", "manifest.json")):
                found.append(manifest)
    return sorted(found, key=lambda m: (m.get("created_ts", 0), m.get("version", 0)), reverse=True)


def resolve_ref(root: str, ref: str) -> dict | None:
    """`NAME:latest`, `NAME:vN` or `NAME:N` to its manifest, or None."""
    name, _, version = ref.rpartition(":")
    if not NAME.match(name or "-"):
        return None
    folder = os.path.join(root, name)
    if version == "latest":
        try:
            with open(os.path.join(folder, "latest")) as f:
                version = f.read().strip()
        except OSError:
            return None
    version = version.removeprefix("v")
    return read_manifest(os.path.join(folder, f"v{version}", "manifest.json")) if version.isdigit() else None


def describe(path: str) -> dict:
    """What can be counted of an output on disk: bytes; tokens of a data-prep output; the checkpoint's
    iteration."""
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
    tracker = os.path.join(folder, CHECKPOINT_TRACKERS[1])  # the text one
    if os.path.isfile(tracker):
        with open(tracker) as f:
            text = f.read().strip()
        if text.isdigit():
            info["iterations"] = int(text)
    return info


def sample_dir(output_dir: str, sample: int | None) -> str:
    """Where a data-prep run of only the first `sample` records writes (never over the full run's output)."""
    return f"{output_dir}/sample-{sample}" if sample else output_dir


def _versioned(root: str, inp: dict) -> str | None:
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
    and ours: the producing stage, config, profile and config digest, the job's seconds, the sample size."""
    job = cfg.get("job") or {}
    published = []
    for out in job.get("produces") or []:
        manifest = {
            "format": ARTIFACT_FORMAT, "name": out["name"], "type": out["kind"], "path": out["path"],
            "producer": job.get("id"), "stage": job.get("stage"), "config": job.get("config"),
            "profile": job.get("profile"), "config_digest": job.get("digest"), "sample": cfg.get("sample"),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "created_ts": time.time(),
            "seconds": round(seconds, 1),
            "inputs": [{**{k: i.get(k) for k in ("name", "key", "path", "producer")},
                        "artifact": _versioned(job["artifacts_root"], i)}
                       for i in job.get("inputs") or [] if i.get("path")],
            "metadata": describe(out["path"]),
        }
        published.append(publish(job["artifacts_root"], manifest))
    write_atomic(os.path.join(job["dir"], JOB_OUTPUTS), json.dumps(published, indent=2) + "\n")
    return published


def newest_step(checkpoints: str) -> tuple[int, str] | None:
    """NeMo RL's newest finished checkpoint in an experiment's checkpoint dir: (N, path of step_N); its
    unfinished saves are tmp_step_N."""
    found = [(int(m.group(1)), path) for path in glob.glob(os.path.join(checkpoints, "step_*"))
             if (m := re.fullmatch(r"step_(\d+)", os.path.basename(path)))]
    return max(found) if found else None

