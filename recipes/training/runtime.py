"""Pretrain or fine-tune with Megatron-Bridge 0.6.x, one process per GPU under torchrun (after the preflight).

The ConfigContainer comes from the released Ultra recipe function (which takes no arguments and builds
its model from the HF config named by the module's NEMOTRON_3_ULTRA_HF_MODEL_ID, read at call time):
that name is pointed at a local directory first, so nothing needs the hub at run time unless the config
names a hub model (then only its config and tokenizer files are fetched, at the pinned revision). Then
the dataset wiring, our overrides through Megatron-Bridge's own override helper, the precision, and the
training loop.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import tempfile
from typing import Any

import yaml

from .. import quiet
from ..contract import CONTINUE_EXIT, CONTINUE_SIGNAL, INPUT_ERROR_EXIT
from ..ft_launcher import rank_exit
from .blend_mix import BlendError, write_mixed
from .hf_config import hf_config
from .plan import (
    BLEND_HELPER,
    FORWARD_STEP,
    HF_CONFIG_FILES,
    HF_MODEL_ID,
    OVERRIDE_HELPER,
    Build,
    Plan,
    TrainingInputError,
    make_plan,
)
from .resilience import sections_to_make


def resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def construct(value: Any) -> Any:
    if isinstance(value, Build):
        return resolve(value.target)(**{k: construct(v) for k, v in value.kwargs.items()})
    return value


def model_dir(plan: Plan, cfg: dict) -> str:
    """A local directory holding the model's config.json (and its tokenizer, unless it is ours)."""
    if plan.model_source == "local":
        return plan.hf_model
    if plan.model_source == "hub":
        from huggingface_hub import snapshot_download

        return snapshot_download(plan.hf_model, revision=plan.hf_revision, allow_patterns=HF_CONFIG_FILES)
    folder = tempfile.mkdtemp(prefix="ultra3-model-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(cfg["model"]), f, indent=2)
    return folder


def build_container(plan: Plan, cfg: dict):
    module, _, name = HF_MODEL_ID.rpartition(".")
    source = model_dir(plan, cfg)
    setattr(importlib.import_module(module), name, source)
    print(f"ultra3: {plan.recipe.rpartition('.')[2]}() with the model config of {source}", flush=True)
    container = resolve(plan.recipe)()
    if plan.dataset is not None:
        container.dataset = construct(plan.dataset)
    if plan.phase and plan.phase.of > 1:
        print(f"ultra3: {plan.phase.line()}", flush=True)
    if plan.blend_path:
        path = write_mixed(plan.blend_path, plan.mix[0], plan.mix[1], cfg["job"]["dir"]) if plan.mix else \
            plan.blend_path
        blend, per_split, split = resolve(BLEND_HELPER)(per_split_data_args_path=path)
        container.dataset.blend, container.dataset.blend_per_split, container.dataset.split = blend, per_split, split
    for section, target in sections_to_make(plan.overrides).items():  # None in the recipe: no key can be set
        if getattr(container, section) is None:
            setattr(container, section, construct(Build(target)))
    resolve(OVERRIDE_HELPER)(container, cli_overrides=plan.overrides)
    return container


def read_config(path: str, stage: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TrainingInputError(f"{path}: not a readable config ({type(e).__name__}: {str(e).splitlines()[0]})") \
            from None
    got = ((cfg or {}).get("job") or {}).get("stage") if isinstance(cfg, dict) else None
    if got != stage:
        raise TrainingInputError(f"{path} is a {got or 'stage-less'} config, not {stage}; run it with its own stage")
    return cfg


def check_inputs(plan: Plan) -> None:
    """What the Megatron-Bridge builders would fail on deep inside, said first."""
    blends = {"phase2.blend_path" if plan.phase and plan.phase.number == 2 else "dataset.blend_path": plan.blend_path}
    if plan.mix:
        blends["dataset.mix.blend_path"] = plan.mix[0]
    for key, path in blends.items():
        if path and not os.path.isfile(path):
            raise TrainingInputError(f"{key} {path} is not a file; give the blend.json that `ultra3 data prep "
                                     "pretrain` wrote")
    root = plan.dataset.kwargs.get("dataset_root") if isinstance(plan.dataset, Build) else None
    if root and not os.path.isdir(os.path.join(root, "train")):
        raise TrainingInputError(f"dataset.packed_dir {root} has no train/ directory; give the output dir of "
                                 "`ultra3 data prep sft`")


def main(stage: str) -> None:
    parser = argparse.ArgumentParser(description=f"ultra3 {stage} runtime")
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    quiet.install()
    from .precision import PrecisionError

    with rank_exit():  # under ft_launcher: an exit no in-job restart may repeat is kept for the launcher
        try:
            train(stage, args.config)
        except (TrainingInputError, PrecisionError, BlendError) as e:
            print(f"ultra3 {stage}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
            raise SystemExit(INPUT_ERROR_EXIT) from None


def prebuilt_dataset_helpers() -> None:
    """Megatron-Bridge's initialize runs `make` in megatron/core/datasets to build Megatron-Core's C++ dataset
    helpers. The megatron-core wheel ships them built and no Makefile, so that make fails and the job exits: with
    the built module importable and no Makefile, the make is skipped."""
    import importlib.util

    from megatron.bridge.training import initialize

    spec = importlib.util.find_spec("megatron.core.datasets.helpers_cpp")
    if spec and spec.origin and not os.path.isfile(os.path.join(os.path.dirname(spec.origin), "Makefile")):
        initialize.compile_helpers = lambda: None


def train(stage: str, path: str) -> None:
    cfg = read_config(path, stage)
    plan = make_plan(cfg)
    check_inputs(plan)
    container = build_container(plan, cfg)

    from .precision import apply_precision

    for line in apply_precision(container, cfg):
        print(f"ultra3: {line}", flush=True)
    prebuilt_dataset_helpers()
    if cfg["job"].get("grace_s"):  # Slurm signals before the time limit: save at the step's end and stop
        container.train.exit_signal_handler = True
        container.train.exit_signal = getattr(signal, CONTINUE_SIGNAL)
    from .tune_cache import callbacks

    tuning = callbacks()  # recorded autotune results pinned before the first step, new ones recorded
    try:
        resolve(plan.entry)(container, resolve(FORWARD_STEP), callbacks=tuning)
    except SystemExit as e:  # Megatron-Bridge's exit before train_iters: the signal, exit_duration_in_mins...
        if e.code not in (0, None):
            raise  # Megatron's re-run state machine (16, 17) and errors keep their code
        stopped_early(container)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def stopped_early(container) -> None:
    """The run stopped before its last iteration with a checkpoint saved: CONTINUE_EXIT, so the job goes on in
    the next allocation; with no checkpoint.save nothing was kept, and going on would start over."""
    if not container.checkpoint.save:
        raise TrainingInputError("stopped before train.train_iters with nothing saved (checkpoint.save is unset), "
                                 "so no later allocation can go on from here; set checkpoint.save")
    print(f"ultra3: stopped early with a checkpoint in {container.checkpoint.save}; the next allocation goes on "
          "from it", flush=True)
    raise SystemExit(CONTINUE_EXIT)
