"""The artifact store, shared by the launcher and the job runtime (re-exported by recipes/contract.py, which the
launcher loads with it). Stdlib only.

Artifacts. A job that completes publishes each output it declared (`job.produces` in its config) in the
artifact store, laid out as NVIDIA's CLI lays its manifest store:

    <root>/<name>/v<N>/manifest.json     one artifact version (one JSON object on one line)
    <root>/<name>/latest                 the newest version number, e.g. "3"

A version directory is claimed with an atomic mkdir, and files are written to a temporary name and
renamed, so two jobs publishing at once never share or half-write a version. The job's own record of
what it published is `<job dir>/outputs.json`. Readers read regular files only, and only so far: a
damaged store (a FIFO, a link to a device, a manifest of the wrong types) is skipped, never hangs them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import stat
from typing import Callable


ARTIFACT_FORMAT = 1
JOB_OUTPUTS = "outputs.json"  # in the job dir: the manifests the job published
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# a checkpoint directory of Megatron-Bridge names its newest iteration in one of these
CHECKPOINT_TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")


def artifact_name(kind: str, config: str, sample: int | None = None, variant: str | None = None) -> str:
    """Outputs of different configs (and of samples, and of runs whose data the command line replaced: a variant,
    the digest of those values) never share a name, so a tiny, sampled or overridden run is never the `latest` of
    the config's own artifact."""
    return f"ultra3-{kind}-{config}" + (f"-{variant}" if variant else "") + (f"-sample-{sample}" if sample else "")


SMALL_FILE_MAX = 1 << 20  # bytes: a manifest, `latest`, a job record or an exit code is far smaller
CREATED_TS_MAX = 1e11  # seconds since the epoch (the year 5138): a later created_ts is damage, not a date


def read_small(path: str, limit: int = SMALL_FILE_MAX) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes, reading no further: ValueError for anything
    else (a FIFO or a device is never read), FileNotFoundError when there is nothing at `path`."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb") as f:  # swapped since: no wait
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        return small_text(f.read(limit + 1), limit)


def read_json(path: str) -> object:
    """The JSON of a small regular file (read_small); ValueError saying why there is none."""
    text = read_small(path)
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


def small_text(data: bytes, limit: int = SMALL_FILE_MAX) -> str:
    """The text of a small file's first `limit` + 1 bytes: ValueError when it has more, or is not UTF-8."""
    if len(data) > limit:
        raise ValueError(f"over {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


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


def read_manifest(path: str, bad: Callable[[str, str], None] | None = None) -> dict | None:
    """The manifest at `path`: None when it is not written yet, another tool's, or damaged (then `bad(path,
    why)` is told)."""
    try:
        return parse_manifest(read_small(path))
    except FileNotFoundError:
        return None  # a version claimed, its manifest not yet written
    except (OSError, ValueError) as e:
        if bad:
            bad(path, str(e))
        return None


def parse_manifest(text: str) -> dict | None:
    """A manifest file's text as the manifest, None when it is another tool's (NVIDIA's CLI, another format);
    ValueError saying what is damaged."""
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if isinstance(manifest, dict) and manifest.get("format") != ARTIFACT_FORMAT:
        return None
    if why := manifest_problem(manifest):
        raise ValueError(why)
    return manifest


# what readers of a manifest rely on: its fields' types; all but the first four may be absent or null
_MANIFEST_FIELDS = {"name": str, "type": str, "path": str, "version": int, "created_ts": (int, float),
                    "inputs": list, "metadata": dict, "producer": str, "stage": str, "config": str, "profile": str,
                    "config_digest": str}
_REQUIRED = ("name", "type", "path", "version")


def manifest_problem(manifest: object) -> str | None:
    """What makes a manifest of ours unfit to read (None when it is fit): a field missing or of a wrong type,
    a version below 1, a created_ts that is no date."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    for key, types in _MANIFEST_FIELDS.items():
        value = manifest.get(key)
        if value is None and key not in _REQUIRED:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types) if isinstance(types, tuple) else types.__name__
            return f"{key} is {json.dumps(value)[:40]}, not {want}"
    if manifest["version"] < 1:
        return f"version {manifest['version']} is below 1"
    if not 0 <= (manifest.get("created_ts") or 0) < CREATED_TS_MAX:  # NaN and infinity too
        return f"created_ts {manifest['created_ts']} is not a time (seconds since 1970)"
    if not all(isinstance(i, dict) and isinstance(i.get("producer"), (str, type(None)))
               for i in manifest.get("inputs") or []):
        return "an entry of inputs is not an object with a text or null producer"
    return None


def read_store(root: str, bad: Callable[[str, str], None] | None = None) -> list[dict]:
    """Every artifact version in the store, newest first; a damaged manifest is told to `bad(path, why)`."""
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        for version in versions(os.path.join(root, name)):
            if manifest := read_manifest(os.path.join(root, name, f"v{version}", "manifest.json"), bad):
                found.append(manifest)
    return newest_first(found)


def newest_first(manifests: list[dict]) -> list[dict]:
    return sorted(manifests, key=lambda m: (m.get("created_ts") or 0, m["version"]), reverse=True)


def resolve_ref(root: str, ref: str, bad: Callable[[str, str], None] | None = None) -> dict | None:
    """`NAME:latest`, `NAME:vN` or `NAME:N` to its manifest, or None; a damaged `latest` or manifest is told
    to `bad(path, why)`."""
    name, _, version = ref.rpartition(":")
    if not NAME.match(name or "-"):
        return None
    folder = os.path.join(root, name)
    if version == "latest":
        latest = os.path.join(folder, "latest")
        try:
            version = read_small(latest, 64).strip()
            if not version.isdigit():
                raise ValueError(f"{version[:40]!r} is not a version number")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            if bad:
                bad(latest, str(e))
            return None
    version = version.removeprefix("v")
    return read_manifest(os.path.join(folder, f"v{version}", "manifest.json"), bad) if version.isdigit() else None


CONVERSION_REPORT = "conversion_report.json"  # in a converted checkpoint: its parity figures
QUANT_CONFIG = "hf_quant_config.json"  # in a ModelOpt-quantized Hugging Face checkpoint: its quantization


def quantization(folder: str) -> str | None:
    """The quantization algorithm of a Hugging Face checkpoint dir ("NVFP4", ...); None for an unquantized one."""
    for name, path in ((QUANT_CONFIG, ("quantization", "quant_algo")), ("config.json", ("quantization_config",
                                                                                         "quant_algo"))):
        try:
            found = json.loads(read_small(os.path.join(folder, name)))
            for key in path:
                found = found.get(key) if isinstance(found, dict) else None
        except (OSError, ValueError):
            continue
        if found:
            return str(found)
    return None
