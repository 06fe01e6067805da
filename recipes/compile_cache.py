"""The job's compile cache: Triton's compiled kernels and autotune results, Inductor's compiled graphs and the
winning configs Triton will not keep (recipes/training/tune_cache.py), kept on the profile's shared storage so a
later job that would compile or tune the same thing finds it done.

The launcher names the root (job.compile_cache.root); here, where the packages and the GPUs are known, the job
takes its keyed directory under it, <root>/<arch>/<key> (contract.compile_cache_dir): arch is the GPUs' (sm_90),
key names what makes the artifacts valid: the image's digest where the job runs in an image `ultra3 container build`
made, else a hash of the versions of the packages that compile or pick kernels. Then every process the job starts
inherits the caches' variables. Stdlib only."""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import shutil
import subprocess

from .contract import COMPILE_CACHE_VAR, IMAGE_ID, compile_cache_dir, image_key

PACKAGES = ("torch", "triton", "transformer-engine", "mamba-ssm", "causal-conv1d", "megatron-core")
TUNE_FILE = "tune.json"  # recipes/training/tune_cache.py


def gpu_arch() -> str | None:
    """The visible GPUs' architecture (sm_90; sm_80+sm_90 for a mixed node), None without nvidia-smi or GPUs."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=60).stdout
    caps = sorted({line.strip().replace(".", "") for line in out.splitlines() if line.strip()})
    return "+".join(f"sm_{cap}" for cap in caps) or None


def versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def image_digest() -> str | None:
    try:
        with open(IMAGE_ID, encoding="utf-8") as f:
            return str(json.load(f)["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def key(digest: str | None, packages: dict[str, str | None]) -> str:
    """image-<digest 16> in a built image, else pkgs-<16 hex of the packages' versions>."""
    if digest:
        return image_key(digest)
    text = json.dumps(sorted(packages.items()))
    return f"pkgs-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def environment(folder: str) -> dict[str, str]:
    """The variables that put each cache in `folder`. Triton keeps autotune results only with
    TRITON_CACHE_AUTOTUNING=1 (Triton 3.4+), read as each autotuned kernel is defined: before any import."""
    return {COMPILE_CACHE_VAR: folder, "TRITON_CACHE_DIR": os.path.join(folder, "triton"),
            "TRITON_CACHE_AUTOTUNING": "1", "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor")}


def settle(cfg: dict, environ: dict | None = None, arch: str | None = None) -> str | None:
    """The keyed directory into this process's environment (a variable run.env sets keeps its value), made if
    new; the line saying which it is and whether it is warm. None where the job has no compile cache."""
    environ = os.environ if environ is None else environ
    root = ((cfg.get("job") or {}).get("compile_cache") or {}).get("root")
    if not root:
        return None
    arch = arch or gpu_arch()
    if not arch:
        return "compile cache: off (no GPU seen, so no architecture to key it by)"
    folder = compile_cache_dir(root, arch, key(image_digest(), versions()))
    warm = os.path.isdir(os.path.join(folder, "triton"))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        return f"compile cache: off ({folder} cannot be made: {e.strerror})"
    for var, value in environment(folder).items():
        environ.setdefault(var, value)
    tuned = os.path.isfile(os.path.join(folder, TUNE_FILE))
    state = f"warm{', with recorded tunings' if tuned else ''}" if warm else "cold: this job fills it"
    return f"compile cache: {folder} ({state})"
