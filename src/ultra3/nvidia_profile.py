"""NVIDIA's Nemotron CLI profile keys in an env.toml, each honoured with the same meaning (renamed to ours, with
a note saying so) or refused with what to write instead: an env.toml written for that CLI works here unedited
where the meaning carries over, and no key is silently ignored.

`translate` works on one profile's resolved table (after `extends`); what it cannot map stays for the schema check
(an unknown key is an error with a did-you-mean)."""

from __future__ import annotations

from typing import Any

from .findings import Report

# key -> our key, same meaning
RENAMED = {"container": "container_image", "env_vars": "env", "setup_lines": "setup", "remote_job_dir": "job_dir"}
# keys that configure image builds: the stage that builds images reads some (stage.profile_keys), the others
# get a note
BUILD = ("build_partition", "build_time", "build_image", "build_cache_dir", "build_registry", "build_include_gpus",
         "build_gpus_per_node")
# keys whose meaning does not carry over: what to write instead
REFUSED = {
    "startup_commands": "ultra3 runs no per-task commands before its launcher; put shell lines for the batch script "
                        "in setup = [...], or bake them into the container image",
    "run_command": "the job always runs `python -m recipes.launch`; remove it",
    "workdir": "the job runs in its own code dir; remove it",
    "pre_ray_start_commands": "the job brings up Ray itself; put shell lines in setup = [...] instead",
    "apptainer": "ultra3 installs nothing in the job; use a container image that has apptainer (container_image)",
    "nprocs_per_node": "cloud executors are not supported; use gpus_per_node with executor = \"slurm\" or \"local\"",
}
# RL keys of a profile, for the RL stages' own keys
STAGE_KEYS = {"sif_dir": "sif_dir"}
SANDBOX = {"container": "sandbox.image", "port": "sandbox.port", "command": "sandbox.command"}
PERSISTENT_CACHE = {"VLLM_CACHE_ROOT": "vllm", "DG_JIT_CACHE_DIR": "deep_gemm", "FLASHINFER_CUBIN_DIR": "flashinfer",
                    "FLASHINFER_WORKSPACE_BASE": "flashinfer_workspace"}


def translate(values: dict[str, Any], flag: str, report: Report) -> dict[str, Any]:
    """NVIDIA's keys of one profile turned into ours (in place of them); a note per renamed key, an error per
    refused one. Returns the stage-config values the profile sets (RL's sandbox, sif_dir), by dotted key."""
    stage: dict[str, Any] = {}
    for old, new in RENAMED.items():
        if old in values:
            value = values.pop(old)
            if new == "setup" and isinstance(value, str):
                value = [value]
            if new == "env" and isinstance(values.get("env"), dict) and isinstance(value, dict):
                value = {**values["env"], **value}
            elif new in values:
                report.error(old, f"and {new} are the same key here; keep {new}")
                continue
            values[new] = value
            report.note(old, f"read as {new} (NVIDIA's CLI name)")
    for key in ("run_partition", "batch_partition"):
        if key in values:
            value = values.pop(key)
            if key.startswith("run" if flag == "--run" else "batch"):
                values["partition"] = value
                report.note(key, f"{value!r} is the partition of this {flag} submission")
            else:
                report.note(key, f"{value!r} is for {'--batch' if flag == '--run' else '--run'} submissions, not "
                                 f"this {flag} one")
    _tasks(values, report)
    if values.pop("tunnel", "local") not in ("ssh", "local"):
        report.error("tunnel", "must be \"ssh\" (with host, user and identity) or left out for the login node")
    if mount := values.pop("lustre_mount", None):
        values["mounts"] = [*(values.get("mounts") or []), *([mount] if mount not in (values.get("mounts") or [])
                                                             else [])]
        report.note("lustre_mount", f"{mount!r} added to mounts")
    for key in [k for k in values if k in BUILD]:
        stage[key] = values.pop(key)
    for key, fix in REFUSED.items():
        if key in values:
            values.pop(key)
            report.error(key, f"NVIDIA's CLI key has no equivalent here: {fix}")
    if cache := values.pop("persistent_cache", None):
        env = dict(values.get("env") or {})
        for var, sub in PERSISTENT_CACHE.items():
            env.setdefault(var, f"{cache}/{sub}")
        values["env"] = env
        values.setdefault("compile_cache", f"{cache}/compile")
        report.note("persistent_cache", f"the vLLM, DeepGEMM and FlashInfer caches of RL jobs go under {cache}, and "
                                        f"training and RL jobs' compile cache (compile_cache) in {cache}/compile")
    for key, ours in STAGE_KEYS.items():
        if key in values:
            stage[ours] = values.pop(key)
    if isinstance(box := values.get("sandbox"), dict):
        values.pop("sandbox")
        unknown = [k for k in box if k not in SANDBOX]
        if unknown:
            report.error(f"sandbox.{unknown[0]}", f"unknown key; the sandbox table takes {', '.join(SANDBOX)}")
        stage.update({SANDBOX[k]: v for k, v in box.items() if k in SANDBOX})
    return stage


def _tasks(values: dict[str, Any], report: Report) -> None:
    """ntasks_per_node / nproc_per_node: one task per GPU there; here one launcher per node starts a rank per
    GPU (torchrun), which is the same job shape when the counts agree."""
    gpus = values.get("gpus_per_node")
    for key in ("ntasks_per_node", "nproc_per_node"):
        if key not in values:
            continue
        count = values.pop(key)
        if key == "nproc_per_node" and gpus is None:
            values["gpus_per_node"] = gpus = count
            report.note(key, f"read as gpus_per_node = {count}")
        elif count in (gpus, 1):
            report.note(key, f"{count}: one launcher per node starts one rank per GPU (gpus_per_node = {gpus}), the "
                             "same job shape")
        else:
            report.error(key, f"{count} tasks per node with gpus_per_node = {gpus}: ultra3 runs one rank per GPU; "
                              f"set gpus_per_node = {count} or remove {key}")
