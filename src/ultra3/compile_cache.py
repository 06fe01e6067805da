"""The compile cache of a job whose stage compiles GPU kernels (training, RL): where it goes and what the dry run
says of it. The root is the profile's `compile_cache` (run.compile_cache; NVIDIA's `persistent_cache` sets it to
<persistent_cache>/compile), else `compile-cache` beside the job's default artifact store (on the storage its
nodes share); "" turns it off. The job keys its directory under the root (recipes/compile_cache.py):
<root>/<arch>/image-<digest> in an image `ultra3 container build` made, which the launcher knows too, else
<root>/<arch>/pkgs-<hash of the package versions>, known only once the job runs."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from . import executors
from .contract import compile_cache_dir, image_key
from .gpus import GPU_TYPES
from .job import Job
from .ssh import ssh_of

KEY = "run.compile_cache"


def settle(job: Job) -> None:
    """job.compile_cache = {"root": ...} for the job's runtime; an unset root is derived, a relative one is an
    error (the job's nodes run elsewhere)."""
    root = job.config["run"].get("compile_cache")
    if root is None:
        root = str(PurePosixPath(executors.executor(job.executor).artifacts_root(job)).parent / "compile-cache")
        job.origin[KEY] = "the default: beside the artifact store"
    elif root and not root.startswith("/"):
        job.report.error(KEY, f"{root!r} is relative (set in {job.origin.get(KEY)}); give an absolute path on "
                              "storage every node of the job sees, or \"\" for no compile cache")
        return
    job.config["run"]["compile_cache"] = job.flat[KEY] = root
    value = {"root": root} if root else None
    job.config["job"]["compile_cache"] = job.flat["job.compile_cache"] = value


def dry_run_line(job: Job) -> str | None:
    """Which keyed directory the job will use and whether it is warm, as far as the launcher can tell without
    asking the job's machines (an SSH profile's storage is not looked at)."""
    if not job.stage.compile_cache:
        return None
    root = (job.config["job"].get("compile_cache") or {}).get("root")
    if not root:
        return "compile cache: off (run.compile_cache is \"\"): every job compiles and autotunes its kernels again"
    gpu = GPU_TYPES.get(job.config["cluster"].get("gpu") or "")
    arch = "sm_{}{}".format(*gpu.compute_capability) if gpu else None
    image = job.config["job"].get("image")
    if not arch:
        return f"compile cache: under {root} (no cluster.gpu: its keyed directory is unknown until the job runs)"
    if ssh_of(job.config["run"]):
        where = compile_cache_dir(root, arch, image_key(image["digest"]) if image else "<key>")
        return f"compile cache: {where} (on the cluster: warm or cold is known when the job runs)"
    if image:
        folder = compile_cache_dir(root, arch, image_key(image["digest"]))
        warm = os.path.isdir(os.path.join(folder, "triton"))
        return f"compile cache: {folder} ({'warm' if warm else 'cold: the first job with this image fills it'})"
    under = compile_cache_dir(root, arch, "")
    keys = sorted(os.listdir(under)) if os.path.isdir(under) else []
    said = f"{len(keys)} keyed for {arch} there: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}" if keys \
        else f"none for {arch} yet: cold"
    return (f"compile cache: {under}<key of the job's package versions> (warm or cold is known when the job runs; "
            f"{said})")
