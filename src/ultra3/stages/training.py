"""`ultra3 pretrain` and `ultra3 sft`: Megatron-Bridge training under torchrun."""

from __future__ import annotations

from ..stage import Flag, Input, Output, Parts, Stage

CHECKS = ("python_version", "image", "training_packages", "kernels", "gpus", "inputs")


def _parts(schema: str) -> Parts:
    from .. import schema as schemas
    from ..cost import training, training_stop
    from ..fork import derive
    from ..validation import validate_training

    return Parts(getattr(schemas, schema), validate_training, training, derive=derive, stop_time=training_stop)


def pretrain_parts() -> Parts:
    return _parts("PRETRAINING")


def sft_parts() -> Parts:
    return _parts("TRAINING")


FLAGS = (Flag("fork", str, "Start from another run's checkpoint: RUN (its newest) or RUN@ITERATION, with the "
                           "KEY=VALUE changes given beside it; optimizer and scheduler state kept."),)


PRETRAIN = Stage(
    ("pretrain",), "Pretrain Nemotron 3 Ultra with Megatron-Bridge (NVFP4 by default).", "pretrain", "pretrain",
    "torchrun", CHECKS, pretrain_parts,
    # the blend of each phase: a path, else the newest of the data prep config its data_config names
    inputs=(Input("data", "dataset.blend_path", ("pretrain-data",), unless="dataset.mock",
                  config_key="dataset.data_config"),
            Input("phase 2 data", "phase2.blend_path", ("pretrain-data",), unless="dataset.mock",
                  when="phase2.start_tokens", config_key="phase2.data_config"),
            Input("mixed-in data", "dataset.mix.blend_path", ("pretrain-data",), unless="dataset.mock",
                  when="dataset.mix.share", config_key="dataset.mix.data_config"),
            # the long-context phase: weights from another pretrain config's checkpoint (phase 2's end)
            Input("checkpoint", "recipe.pretrained_checkpoint", ("pretrain-checkpoint",), when="recipe.start_from",
                  config_key="recipe.start_from")),
    outputs=(Output("pretrain-checkpoint", "checkpoint.save"),),
    flags=FLAGS,
    compile_cache=True,
    examples=(
        "ultra3 pretrain -c tiny --dry-run",
        "ultra3 pretrain --batch mycluster dataset.blend_path=/lustre/data/phase1/blend.json "
        "phase2.blend_path=/lustre/data/phase2/blend.json",
        "ultra3 pretrain --batch mycluster dataset.blend_path=/lustre/data/blend.json phase2.start_tokens=null",
        "ultra3 pretrain -c long_context --batch gb200 dataset.blend_path=/lustre/data/long/blend.json "
        "dataset.mix.blend_path=/lustre/data/phase2/blend.json recipe.pretrained_checkpoint=/lustre/ckpt/pretrain",
        "ultra3 pretrain -c tiny --run mycluster train.train_iters=20",
    ),
)

SFT = Stage(
    ("sft",), "Supervised fine-tuning on packed sequences with Megatron-Bridge.", "sft", "sft", "torchrun", CHECKS,
    sft_parts,
    inputs=(Input("checkpoint", "recipe.pretrained_checkpoint", ("pretrain-checkpoint",), unless="checkpoint.load",
                  optional_when="recipe.allow_random_init"),
            Input("data", "dataset.packed_dir", ("sft-data",), unless="dataset.mock")),
    outputs=(Output("sft-checkpoint", "checkpoint.save"),),
    flags=FLAGS,
    compile_cache=True,
    examples=(
        "ultra3 sft -c tiny --dry-run",
        "ultra3 sft --batch mycluster recipe.pretrained_checkpoint=/lustre/ckpt dataset.packed_dir=/lustre/sft",
    ),
)
