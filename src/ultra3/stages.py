"""The stage registry: one entry per `ultra3 <stage>` command. It drives the CLI, validation and
launch; a new stage is a config dir, a runtime recipe and an entry here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from .schema import DATA_PREP_PRETRAIN, DATA_PREP_SFT, QUANTIZE, TRAINING

Launch = Literal["torchrun", "ray"]


@dataclass(frozen=True)
class Flag:
    """A stage's own option, a spelling of a config key: `--sample 100` is `sample=100`."""

    key: str
    kind: type  # int, or bool for a switch
    help: str

    @property
    def option(self) -> str:
        return "--" + self.key.replace("_", "-")


DATA_PREP_FLAGS = (
    Flag("sample", int, "Process only the first N records of each dataset, into <output_dir>/sample-N."),
    Flag("force", bool, "Redo everything, even finished shards."),
)


@dataclass(frozen=True)
class Stage:
    words: tuple[str, ...]  # the command path under `ultra3`, e.g. ("data", "prep", "sft")
    summary: str
    config_dir: str  # under configs/
    recipe: str  # the runtime script under recipes/, run inside the job
    launch: Launch  # torchrun over the GPUs of each node (one rank: the script itself), or a Ray cluster
    schema: dict  # the typed schema of its config (ultra3.schema)
    validator: str | None = None  # dotted path of a `(cfg, report) -> None` run after the schema
    # dotted path of a `(flat, origin, report) -> None` that fills in values before interpolation
    prepare: str | None = None
    examples: tuple[str, ...] = ()
    flags: tuple[Flag, ...] = ()  # options of this stage only

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def slug(self) -> str:  # job names, directories
        return "ultra3-" + "-".join(self.words)

    def validate(self) -> Callable | None:
        return _load(self.validator)

    def prepare_values(self) -> Callable | None:
        return _load(self.prepare)


def _load(dotted: str | None) -> Callable | None:
    if not dotted:
        return None
    from importlib import import_module

    module, _, attr = dotted.rpartition(".")
    return getattr(import_module(module), attr)


STAGES: tuple[Stage, ...] = (
    Stage(
        ("pretrain",), "Pretrain Nemotron 3 Ultra with Megatron-Bridge (NVFP4 by default).",
        "pretrain", "pretrain.py", "torchrun", TRAINING, "ultra3.validation.validate_training",
        examples=(
            "ultra3 pretrain -c tiny --dry-run",
            "ultra3 pretrain --batch mycluster dataset.blend_path=/lustre/data/blend.json",
            "ultra3 pretrain -c tiny --run mycluster train.train_iters=20",
        ),
    ),
    Stage(
        ("sft",), "Supervised fine-tuning on packed sequences with Megatron-Bridge.",
        "sft", "sft.py", "torchrun", TRAINING, "ultra3.validation.validate_training",
        prepare="ultra3.training_inputs.fill_pretrained",
        examples=(
            "ultra3 sft -c tiny --dry-run",
            "ultra3 sft --batch mycluster recipe.pretrained_checkpoint=/lustre/ckpt dataset.packed_dir=/lustre/sft",
        ),
    ),
    Stage(
        ("data", "prep", "pretrain"), "Tokenize pretraining corpora into Megatron bin/idx shards on Ray.",
        "data_prep/pretrain", "data_prep_pretrain.py", "ray", DATA_PREP_PRETRAIN,
        "ultra3.validation.data_prep.validate_data_prep",
        examples=("ultra3 data prep pretrain -c tiny", "ultra3 data prep pretrain -c tiny --sample 100",
                  "ultra3 data prep pretrain --batch mycluster output_dir=/lustre/data/phase1"),
        flags=DATA_PREP_FLAGS,
    ),
    Stage(
        ("data", "prep", "sft"), "Render, mask and pack SFT conversations into Parquet on Ray.",
        "data_prep/sft", "data_prep_sft.py", "ray", DATA_PREP_SFT,
        "ultra3.validation.data_prep.validate_data_prep",
        examples=("ultra3 data prep sft -c tiny", "ultra3 data prep sft -c tiny --sample 100 --force",
                  "ultra3 data prep sft --batch mycluster output_dir=/lustre/data/sft"),
        flags=DATA_PREP_FLAGS,
    ),
    Stage(
        ("quantize",), "NVFP4 post-training quantization with ModelOpt into a Hugging Face checkpoint.",
        "quantize", "quantize.py", "torchrun", QUANTIZE, "ultra3.validation.quantize.validate_quantize",
        prepare="ultra3.training_inputs.fill_bf16_checkpoint",
        examples=("ultra3 quantize -c tiny", "ultra3 quantize -c tiny --dry-run",
                  "ultra3 quantize --batch mycluster bf16_checkpoint=/lustre/ckpt/ultra-bf16 output_dir=/lustre/ckpt/ultra-nvfp4",
                  "ultra3 quantize --batch mycluster bf16_checkpoint=null output_dir=/lustre/ckpt/ultra-nvfp4"),
    ),
)
