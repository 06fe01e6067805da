"""The winning configs of the Triton autotuners Triton will not keep on disk, recorded in the job's compile cache
and pinned in later jobs before their first step, so no process benchmarks those kernels again.

Triton keeps autotune results on disk only with TRITON_CACHE_AUTOTUNING=1, and never for an autotuner whose
configs carry a pre_hook (mamba-ssm's SSD backward kernels): those are recorded here, in <compile cache>/tune.json,
once per (GPU architecture, kernel, key values). A record is used only where all of it matches: the file's
architecture is this GPU's, the kernel is the same function (module and name), the key values are the ones the
autotuner computes for the call (its shapes and dtypes: Autotuner.cache's keys), and the config is one of the
autotuner's own; anything else is left for Triton to tune. Works on Triton's Autotuner objects through their
`configs`, `cache`, `base_fn` and `cache_results` attributes (Triton 3.x, read from triton/runtime/autotuner.py)."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from ..compile_cache import TUNE_FILE
from ..contract import COMPILE_CACHE_VAR

FORMAT = 1
SCALARS = (bool, int, float, str, type(None))


def uncached(tuner: Any) -> bool:
    """Triton does not keep this autotuner's results on disk: its cache is off, or a config has a pre_hook."""
    return not getattr(tuner, "cache_results", False) or any(c.pre_hook for c in tuner.configs)


def name(tuner: Any) -> str:
    fn = tuner.base_fn
    return f"{fn.__module__}.{fn.__qualname__}"


def autotuners(modules: dict | None = None) -> dict[str, Any]:
    """Every Triton Autotuner a loaded module holds (directly or under @triton.heuristics), by kernel name."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    found = {}
    for module in list((sys.modules if modules is None else modules).values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            while isinstance(value, KernelInterface) and not isinstance(value, Autotuner):
                value = getattr(value, "fn", None)
            if isinstance(value, Autotuner):
                found[name(value)] = value
    return found


def _settings(config: Any) -> dict | None:
    """A Triton Config as JSON (its meta-parameters and launch settings), None when one is not plain data."""
    values = config.all_kwargs()
    return values if all(isinstance(v, SCALARS) for v in values.values()) else None


def entries(tuners: dict[str, Any]) -> dict[str, list[dict]]:
    """The tuned results of the autotuners Triton does not keep, by kernel: [{"key": [...], "config": {...}}]."""
    found: dict[str, list[dict]] = {}
    for kernel, tuner in sorted(tuners.items()):
        if not uncached(tuner):
            continue
        for key, config in tuner.cache.items():
            settings = _settings(config)
            if settings is not None and all(isinstance(v, SCALARS) for v in key):
                found.setdefault(kernel, []).append({"key": list(key), "config": settings})
    return found


def read(path: str, arch: str) -> dict[str, list[dict]]:
    """The file's records when it is one of this architecture, else none."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("arch") != arch:
        return {}
    kernels = data.get("kernels")
    return kernels if isinstance(kernels, dict) else {}


def record(path: str, arch: str, tuners: dict[str, Any]) -> int:
    """The autotuners' new results merged into the file (written whole to a temporary name, then renamed);
    the number of results added."""
    kept = read(path, arch)
    known = {(k, json.dumps(e["key"])) for k, rows in kept.items() for e in rows if isinstance(e, dict)}
    added = 0
    for kernel, rows in entries(tuners).items():
        for entry in rows:
            if (kernel, json.dumps(entry["key"])) not in known:
                kept.setdefault(kernel, []).append(entry)
                added += 1
    if added:
        temporary = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "arch": arch, "kernels": kept}, f, indent=1, sort_keys=True)
        os.replace(temporary, path)
    return added


def pin(path: str, arch: str, tuners: dict[str, Any]) -> int:
    """Each recorded result whose kernel, key and config this process has, put in its autotuner's cache (where
    Triton looks before it benchmarks); the number pinned."""
    pinned = 0
    for kernel, rows in read(path, arch).items():
        tuner = tuners.get(kernel)
        if tuner is None or not isinstance(rows, list):
            continue
        for entry in rows:
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), list):
                continue
            key = tuple(entry["key"])
            config = next((c for c in tuner.configs if _settings(c) == entry.get("config")), None)
            if config is not None and key not in tuner.cache:
                tuner.cache[key] = config
                pinned += 1
    return pinned


class Recorder:
    """Pins the recorded results as training starts, and records new ones at the end of the first step and of any
    later step that tuned something (a new shape): Megatron-Bridge's on_train_start and on_train_step_end."""

    def __init__(self, folder: str, arch: str, say: bool) -> None:
        self.path, self.arch, self.say = os.path.join(folder, TUNE_FILE), arch, say
        self.tuners: dict[str, Any] = {}
        self.seen = -1  # results in the autotuners' caches at the last record (-1: none yet)

    def start(self, context: Any = None) -> None:
        self.tuners = autotuners()
        pinned = pin(self.path, self.arch, self.tuners)
        if self.say:
            print(f"ultra3: pinned {pinned} recorded autotune result(s) for {self.arch} from {self.path}", flush=True)

    def step_end(self, context: Any = None) -> None:
        if self._count() == self.seen:
            return
        self.tuners = autotuners()  # kernels of modules imported during the step
        added = record(self.path, self.arch, self.tuners)
        self.seen = self._count()
        if added and self.say:
            print(f"ultra3: recorded {added} autotune result(s) Triton does not keep in {self.path}", flush=True)

    def _count(self) -> int:
        return sum(len(t.cache) for t in self.tuners.values())


def callbacks() -> Any:
    """Megatron-Bridge callbacks that pin and record, for the job's compile cache (None without one)."""
    folder = os.environ.get(COMPILE_CACHE_VAR)
    if not folder:
        return None
    import torch
    from megatron.bridge.training.callbacks import CallbackManager  # 0.6.2: register(event, fn), these events

    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    recorder = Recorder(folder, arch, os.environ.get("RANK", "0") == "0")
    manager = CallbackManager()
    manager.register("on_train_start", recorder.start)
    manager.register("on_train_step_end", recorder.step_end)
    return manager
