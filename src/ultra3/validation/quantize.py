"""Rules for `ultra3 quantize`: inputs that exist (a local checkpoint is a Hugging Face or a Megatron-Bridge
checkpoint directory), a recipe ModelOpt ships (or a recipe file), a backend that fits the job's shape, and, for
the Megatron-Bridge backend, the calibration layout (model.*) and the export layout (export.*) checked by the
training parallelism rules. Nothing heavy is imported: ModelOpt's recipe names are read from its installed
modelopt_recipes/ directory without importing it."""

from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path

from ultra3.findings import Report
from ultra3.contract import CHECKPOINT_TRACKERS as TRACKERS
from ultra3.dotted import get

from . import parallelism
from ..model_math import pos_int
from .data_prep import _exists, _missing, check_output_dir

BACKENDS = ("hf", "megatron")
DEVICES = ("auto", "cpu", "cuda")
RECIPE_DIRS = ("models", "general")  # whole recipes; configs/ holds the pieces they import


def shipped_recipes() -> list[str] | None:
    """Names of the recipes in the installed modelopt_recipes/ (relative, without .yaml); None when ModelOpt
    is not installed on this machine."""
    spec = importlib.util.find_spec("modelopt_recipes")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return sorted(str(p.relative_to(root).with_suffix("")) for d in RECIPE_DIRS for p in (root / d).rglob("*.yaml"))


def validate_quantize(cfg: dict, report: Report) -> None:
    for key in ("modelopt_recipe", "output_dir", "calibration.path"):  # bf16_checkpoint is the stage's input
        if not get(cfg, key):
            report.error(key, f"{key} is not set")
    out = get(cfg, "output_dir")
    if isinstance(out, str) and out.startswith(("/", "~")):
        check_output_dir(cfg, out, report)
    _checkpoint(cfg, report)
    _recipe(get(cfg, "modelopt_recipe"), report)
    calib = get(cfg, "calibration.path")
    if calib and not _exists(calib):
        _missing(cfg, "calibration.path", f"{calib} matches no file", report)
    for key in ("samples", "held_out", "seq_length", "batch_size"):
        value = get(cfg, f"calibration.{key}")
        if value is not None and pos_int(value) is None:
            report.error(f"calibration.{key}", f"{value!r} is not a positive integer")
    if get(cfg, "device", "auto") not in DEVICES:
        report.error("device", f"{get(cfg, 'device')!r} is not one of {', '.join(DEVICES)}")
    backend = get(cfg, "backend", "hf")
    if backend == "hf":
        nodes, gpus = get(cfg, "run.nodes", 1), get(cfg, "run.gpus_per_node", 0)
        if nodes != 1 or gpus > 1:
            report.error("backend", f"the hf backend quantizes in one process, but the job has {nodes} node(s) x "
                                    f"{gpus} GPU(s); set run.nodes=1 run.gpus_per_node=1 (or 0), or backend=megatron",
                         quoting=("run.nodes", "run.gpus_per_node"))
    elif backend == "megatron":
        _layouts(cfg, report)
    else:
        report.error("backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")


def _checkpoint(cfg: dict, report: Report) -> None:
    path = get(cfg, "bf16_checkpoint")
    if not path or get(cfg, "make_checkpoint") or not path.startswith(("/", ".", "~")):
        return  # none, made by the run, or a hub id
    if not _exists(path):
        if path.startswith("."):  # ultra3.artifacts reports a missing absolute path
            _missing(cfg, "bf16_checkpoint", f"{path} does not exist", report)
        return
    if not any(_exists(os.path.join(path, name)) for name in ("config.json", *TRACKERS)):
        report.error("bf16_checkpoint", f"{path} is neither a Hugging Face checkpoint (config.json) nor a "
                                        f"Megatron-Bridge checkpoint ({' or '.join(TRACKERS)}); give the model "
                                        "directory or the checkpoint.save directory of a pretrain/sft job")


def _recipe(name: object, report: Report) -> None:
    if not isinstance(name, str) or not name:
        return
    if name.endswith((".yaml", ".yml")) or os.sep in name and os.path.exists(os.path.expanduser(name)):
        if not os.path.isfile(os.path.expanduser(name)):
            report.error("modelopt_recipe", f"{name} does not exist; give a recipe YAML file or a shipped recipe name")
        return
    shipped = shipped_recipes()
    if shipped is None or name in shipped:
        return
    close = difflib.get_close_matches(name, shipped, n=1, cutoff=0.5)
    hint = (f"did you mean {close[0]}?" if close
            else f"shipped: {', '.join(r for r in shipped if r.startswith('models/'))}")
    report.error("modelopt_recipe", f"{name!r} is not a recipe shipped with ModelOpt nor a YAML file; {hint}")


class _Renamed(Report):
    """A report that files the parallelism rules' model.* findings under export.* (notes once only). A quoted
    model.* key is quoted as export.* where export sets it, else as the model.* key the export layout keeps."""

    def __init__(self, into: Report, export: dict):
        super().__init__(findings=into.findings, config=into.config, origin=into.origin)
        self.exported = set(export)

    def error(self, key: str, message: str, quoting: tuple[str, ...] = ()) -> None:
        super().error(key.replace("model.", "export.", 1), message.replace("model.", "export."),
                      self._quoted(key, quoting))

    def warn(self, key: str, message: str, quoting: tuple[str, ...] = ()) -> None:
        super().warn(key.replace("model.", "export.", 1), message.replace("model.", "export."),
                     self._quoted(key, quoting))

    def _quoted(self, key: str, quoting: tuple[str, ...]) -> tuple[str, ...]:
        if not quoting:
            return ()
        return tuple(f"export.{k[6:]}" if k.startswith("model.") and k[6:] in self.exported else k
                     for k in (key, *quoting))

    def note(self, key: str, message: str) -> None:
        pass  # the calibration pass already said it


def _layouts(cfg: dict, report: Report) -> None:
    parallelism.check(cfg, report)
    calibration = report.tables.pop("parallelism", None)
    export = {**cfg, "model": {**(cfg.get("model") or {}), **(cfg.get("export") or {})}}
    renamed = _Renamed(report, cfg.get("export") or {})
    parallelism.check(export, renamed)
    for layout, table in (("calibration", calibration), ("export", renamed.tables.get("parallelism"))):
        if table:
            report.tables[f"parallelism ({layout})"] = table
