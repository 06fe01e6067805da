"""Checks that run first inside every job, on every node, before anything expensive starts.

Stdlib only: it must run in any container. The job config names its checks (`job.checks`, written by the
launcher from the stage registry); each failed check is one short reason with its fix; the job prints them
on one line starting with contract.PREFLIGHT_MARK and exits, and the launcher reports it.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys

from .contract import FT_LAUNCHER, IMAGE_ID, NVFP4_CAPABILITIES, PREFLIGHT_MARK, trains_nvfp4

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def python_version(cfg: dict) -> str | None:
    if sys.version_info < (3, 10):
        return f"Python {sys.version.split()[0]} is too old; the recipes need 3.10+ (the training container has 3.12)"
    return None


def image(cfg: dict) -> str | None:
    """The container is the image the job asked for (job.image: one `ultra3 container build` made)."""
    want = (cfg.get("job") or {}).get("image")
    if not want:
        return None
    try:
        with open(IMAGE_ID, encoding="utf-8") as f:
            have = json.load(f)
    except (OSError, ValueError):
        return (f"image: the job asked for {want['name']}, but this container has no {IMAGE_ID} (not an image "
                "ultra3 built); check container_image in the profile")
    if have.get("digest") != want["digest"]:
        return (f"image: the container is ultra3-{have.get('kind')}-{str(have.get('digest'))[:12]} but the job asked "
                f"for {want['name']}; was the .sqsh replaced? build it again: ultra3 container build {want['kind']}")
    return None


def build_tools(cfg: dict) -> str | None:
    """podman, and mksquashfs or enroot, on the build node."""
    missing = [t for t in ("podman", "mksquashfs") if not shutil.which(t)
               and not (t == "mksquashfs" and shutil.which("enroot"))]
    if missing:
        return (f"{' and '.join(missing)} not found on this node; install podman and squashfs-tools (or enroot) on "
                "the build nodes, or pick others with build_partition")
    return None


def _installed(module: str) -> bool:
    """Whether `module` can be found, without importing it (a dotted name whose parent package is missing is
    not installed: find_spec raises there)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _importable(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as e:  # any import-time failure (missing CUDA libs too) means it cannot run
        return _error(e)
    return None


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()


def training_packages(cfg: dict) -> str | None:
    # mamba_ssm: Megatron-Core's Mamba layers need it whole (its package imports its selective-scan extension)
    modules = ("megatron.bridge", "transformer_engine", "mamba_ssm")
    if ((cfg.get("run") or {}).get("fault_tolerance") or {}).get("enabled"):  # ranks under ft_launcher
        modules += (FT_LAUNCHER,)
    missing = [f"{m} ({err})" for m in modules if (err := _importable(m))]
    if missing:
        return (f"not importable: {', '.join(missing)}; run inside the training container "
                "(set container_image in the profile) or install the `train` extra")
    return None


# Megatron settings that need a compiled kernel: key, the value that needs it (the Ultra recipes' own, Megatron-Bridge
# 0.6.x, where our config leaves the key unset), the module that holds the kernel, what it is, what to set instead.
KERNEL_SETTINGS = (
    ("model.moe_token_dispatcher_type", "flex", "deep_ep", "DeepEP/HybridEP",
     "model.moe_token_dispatcher_type=alltoall"),
    ("model.gradient_accumulation_fusion", True, "fused_weight_gradient_mlp_cuda", "APEX's CUDA extensions",
     "model.gradient_accumulation_fusion=false"),
    ("model.use_mamba_mem_eff_path", True, "causal_conv1d_cuda", "causal-conv1d's CUDA extension",
     "model.use_mamba_mem_eff_path=false (pretraining only)"),
)


def kernels(cfg: dict) -> str | None:
    """Each setting that needs a compiled kernel, against what this Python has (found, not imported); packed SFT
    needs Mamba's memory-efficient path. Nothing to say without Megatron-Bridge: training_packages says that."""
    if not _installed("megatron.bridge"):
        return None
    model = cfg.get("model") or {}
    problems = []
    for key, needs, module, what, instead in KERNEL_SETTINGS:
        value = model.get(key.split(".", 1)[1], needs)
        if value == needs and not _installed(module):
            problems.append(f"{key}={_shown(value)} needs {what} (module {module}), not installed in {sys.executable}; "
                            f"set {instead}, or install it")
    dataset = cfg.get("dataset") or {}
    if (cfg.get("job") or {}).get("stage") == "sft" and not dataset.get("mock") and \
            not model.get("use_mamba_mem_eff_path", True):
        problems.append("model.use_mamba_mem_eff_path=false cannot train packed sequences (Megatron-Core asserts it); "
                        "set it true (needs causal-conv1d's CUDA extension) or dataset.mock=true")
    return "; ".join(problems) or None


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


QUANTIZE_PYTHON = (3, 11)  # transformers 5.23, which the `quantize` extra pins, has no release for 3.10


def quantize_packages(cfg: dict, version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str | None:
    """The hf backend runs on any machine, a CPU-only one included, under Python 3.11+ (`version`: the job's
    Python); the megatron backend needs the training packages."""
    if cfg.get("backend") == "megatron":
        return training_packages(cfg)
    if tuple(version[:2]) < QUANTIZE_PYTHON:
        return (f"the quantize hf backend needs Python 3.11+, this job's is {'.'.join(map(str, version))} (the "
                "`quantize` extra installs nothing on it); run the job under Python 3.11+ (the training container "
                "has 3.12)")
    missing = [f"{m} ({err})" for m in ("modelopt", "transformers", "safetensors", "requests")
               if (err := _importable(m))]
    if missing:
        py = sys.executable
        return (f"not importable: {', '.join(missing)}; install them in the job's Python: `{py} -m pip install "
                f"torch==2.13.0` (first: a CPU-only machine needs no CUDA packages), then `{py} -m pip install "
                "'.[quantize]'` in the launcher's checkout")
    return None


def gpus(cfg: dict) -> str | None:
    wanted = (cfg.get("run") or {}).get("gpus_per_node") or 0
    if not wanted:
        return None
    smi = shutil.which("nvidia-smi")
    caps: list[str] = []
    if smi:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        caps = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible):
        caps = [caps[int(v)] for v in visible if int(v) < len(caps)]
    elif visible:  # GPU UUIDs: only the count is known
        caps = caps[: len(visible)]
    if not caps:
        return f"no NVIDIA GPU visible (need {wanted} per node; nvidia-smi {'found no GPU' if smi else 'not found'})"
    if len(caps) < wanted:
        return f"{len(caps)} GPU(s) visible, the config needs {wanted} per node (run.gpus_per_node)"
    precision = str(cfg.get("mixed_precision") or "")
    if "nvfp4" in precision and not all(trains_nvfp4(_capability(c)) for c in caps):
        sms = "/".join(f"{major}.{minor}" for major, minor in NVFP4_CAPABILITIES)
        return (f"mixed_precision={precision} needs Blackwell (compute capability {sms}), these GPUs are "
                f"{', '.join(sorted(set(caps)))}; use mixed_precision=bf16_mixed")
    return None


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else (0, 0)


def shared_dir(cfg: dict) -> str | None:
    """The job dir, which the nodes share (Ray's meeting files, NeMo RL's logs and checkpoints), writable here."""
    folder = (cfg.get("job") or {}).get("dir") or "."
    probe = os.path.join(folder, f".write-test-{socket.gethostname()}-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        return f"the job dir {folder} is not writable from {socket.gethostname()} ({e.strerror}); put job_dir on a " \
               "filesystem every node mounts read-write"
    return None


def nemo_rl(cfg: dict) -> str | None:
    """NeMo RL in the job's Python, its checkout at nemo_rl_dir holding the recipe, at the commit the launcher's
    record was made from (`job.nemo_rl`; when the checkout says which it is)."""
    folder = str(cfg.get("nemo_rl_dir") or "")
    if err := _importable("nemo_rl"):
        return (f"NeMo RL is not importable ({err}); run in the NeMo RL container (set container_image in the "
                f"profile) with its checkout at nemo_rl_dir={folder}")
    record = cfg["job"]["nemo_rl"]
    recipe = os.path.join(folder, record["directory"], f"{cfg.get('recipe')}.yaml")
    if not os.path.isfile(recipe):
        return f"no {recipe}: nemo_rl_dir={folder} is not a NeMo RL checkout with the Ultra recipes"
    head = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60) \
        if shutil.which("git") and os.path.exists(os.path.join(folder, ".git")) else None
    pinned = str(record["commit"])
    if head and head.returncode == 0 and head.stdout.strip() != pinned:
        return (f"NeMo RL at {folder} is at {head.stdout.strip()[:12]}, the launcher's record of its configs is "
                f"of {pinned[:12]}; use a container built at that commit")
    return None


def inputs(cfg: dict) -> str | None:
    """The job's inputs (`job.inputs`, resolved by the launcher): each required one set, each set one readable."""
    problems = []
    for inp in (cfg.get("job") or {}).get("inputs") or []:
        key, path = inp["key"], os.path.expanduser(inp.get("path") or "")
        if not path:
            if inp.get("required"):
                first = f"run `{inp['hint']}` first or " if inp.get("hint") else ""
                problems.append(f"{key} is not set: this stage needs its {inp['name']} input "
                                f"({', '.join(inp.get('kinds') or [])}); {first}set {key}=PATH")
        elif "pretrain-data" in (inp.get("kinds") or []):
            problems += _blend_problems(key, path)
        elif not _hub_reference(path) and not (os.access(path, os.R_OK) or glob.glob(path)):
            problems.append(f"{key} {path} is not readable")
    return "; ".join(problems) or None


def _hub_reference(value: str) -> bool:
    """A Hugging Face hub id (`org/name`, not a local path) or an hf:// path: the runtime fetches it."""
    return value.startswith("hf://") or (HUB_ID.match(value) is not None and not os.path.exists(value))


def _blend_problems(key: str, path: str) -> list[str]:
    """A blend.json of `data prep pretrain`: readable JSON whose every prefix has its .bin and .idx."""
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        return [f"{key} {path} is not readable"]
    try:
        with open(path) as f:
            blend = json.load(f)
    except ValueError as e:
        return [f"{key} {path} is not valid JSON ({e})"]
    if not isinstance(blend, dict):
        return [f"{key} {path} is not a blend (a JSON object of splits)"]
    prefixes = [p for split in blend.values() if isinstance(split, list) for p in split if isinstance(p, str)]
    if not prefixes:
        return [f"{key} {path} names no data files"]
    missing = [p for p in prefixes for ext in (".bin", ".idx") if not os.access(p + ext, os.R_OK)]
    return [f"{len(missing)} data file(s) of {path} unreadable, e.g. {missing[0]}"] if missing else []


def data_prep_packages(cfg: dict) -> str | None:
    """The data extra's packages are installed (found, not imported: the runtime imports them itself, and
    Ray's import alone takes most of a second); Ray only where the tasks run on it."""
    paths = [str(ds.get("path") or "") for ds in cfg.get("datasets") or []]
    needed = ["tokenizers", "pyarrow", "numpy"]
    on_ray = cfg.get("backend") == "ray" or (cfg.get("backend") in (None, "auto") and (
        os.environ.get("RAY_ADDRESS") or int(os.environ.get("SLURM_NNODES", "1")) > 1))
    needed += ["ray"] if on_ray else []
    needed += ["jinja2"] if "chat_template" in cfg else []
    needed += ["zstandard"] if any(p.endswith(".zst") for p in paths) else []
    needed += ["huggingface_hub"] if any(p.startswith("hf://") for p in paths) else []
    missing = [m for m in needed if not _installed(m)]
    if missing:
        return f"not installed: {', '.join(missing)}; install the launcher's `data` extra in the job's Python"
    return None


def data_prep_inputs(cfg: dict) -> str | None:
    """Local inputs and tokenizer readable (hf:// and hub names are fetched by the runtime), output writable."""
    problems = []
    for ds in cfg.get("datasets") or []:
        path = str(ds.get("path") or "")
        if path and not path.startswith("hf://") and not glob.glob(os.path.expanduser(path)):
            problems.append(f"dataset {ds.get('name')}: {path} matches no readable file")
    tokenizer = str(cfg.get("tokenizer") or "")
    if (tokenizer.endswith(".json") or tokenizer.startswith(("/", "~", "."))) and \
            not os.access(os.path.expanduser(tokenizer), os.R_OK):
        problems.append(f"tokenizer {tokenizer} is not readable")
    out = os.path.expanduser(str(cfg.get("output_dir") or ""))
    parent = next((p for p in (out, *_parents(out)) if os.path.exists(p)), None)
    if out and (parent is None or not os.access(parent, os.W_OK)):
        problems.append(f"output_dir {out} is not writable")
    return "; ".join(problems) or None


def _parents(path: str) -> list[str]:
    parents = []
    while path not in ("", "/") and os.path.dirname(path) != path:
        path = os.path.dirname(path)
        parents.append(path)
    return parents


CHECKS = {check.__name__: check for check in (python_version, image, training_packages, kernels, quantize_packages,
                                              gpus, inputs, data_prep_packages, data_prep_inputs, shared_dir, nemo_rl,
                                              build_tools)}
# for a config without job.checks (written by an older launcher): the checks of its launch kind
BY_LAUNCH = {
    "torchrun": ("python_version", "training_packages", "kernels", "gpus", "inputs"),
    "ray": ("python_version", "data_prep_packages", "data_prep_inputs"),
}
GENERIC = ("python_version", "inputs")  # any other launch kind


def run(cfg: dict) -> list[str]:
    job = cfg.get("job") or {}
    names = job.get("checks") or BY_LAUNCH.get(job.get("launch"), GENERIC)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:  # a launcher newer than this runtime
        return [f"unknown preflight check(s) {', '.join(unknown)}: this runtime does not match the launcher"]
    return [reason for name in names if (reason := _checked(name, cfg))]


def _checked(name: str, cfg: dict) -> str | None:
    """A check that crashes stops the job as a failed one does, with its error on the one line."""
    try:
        return CHECKS[name](cfg)
    except Exception as e:
        return f"the {name} check failed ({_error(e)})"


def report(cfg: dict) -> bool:
    host = socket.gethostname()
    reasons = run(cfg)
    if reasons:
        print(f"{PREFLIGHT_MARK} on {host}: {'; '.join(reasons)}", flush=True)
        return False
    print(f"preflight ok on {host}", flush=True)
    return True
