"""The stage registry: one entry per `ultra3 <stage>` command, the whole truth about a stage: its
config, runtime, launch kind, resources, preflight checks, the artifacts it consumes and produces, and
its cost model. It drives the CLI, validation, artifact resolution, pipes and launch; a new stage is a
config dir, a runtime module and an entry here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from .schema import CONTAINER, DATA_PREP_PRETRAIN, DATA_PREP_RL, DATA_PREP_SFT, QUANTIZE, RL, TEACHER_ROLES, TRAINING

Launch = Literal["torchrun", "ray", "process"]


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
class Input:
    """An artifact the stage consumes, filling one config key. Unset, it resolves to the newest artifact of
    one of `kinds` (in order) for the same profile; `unless` names a config key that, when true, makes
    the input unnecessary (mock data, a checkpoint the job makes itself, a resumed run)."""

    name: str
    key: str
    kinds: tuple[str, ...]
    required: bool = True
    unless: str | None = None
    configs: tuple[str, ...] = ()  # only artifacts made by these configs (a teacher's role); an optional input
    # with configs is taken when one exists
    same_config: bool = True  # prefer an artifact made by a config of the consumer's name (tiny for tiny)
    optional_when: str | None = None  # a config key that, when true, makes the input optional: taken when one
    # exists, else the job goes without it (the tiny SFT's random initial weights)


@dataclass(frozen=True)
class Output:
    """An artifact the stage produces: `key` holds the directory it writes, `file` is the artifact within
    it ("" for the directory itself). Nothing is produced when the key is unset (e.g. checkpoint.save)."""

    kind: str
    key: str
    file: str = ""


TRAINING_CHECKS = ("python_version", "image", "training_packages", "kernels", "gpus", "inputs")
# RL: NeMo RL and the GPUs are not checked under check_only, which checks the allocation and the Ray cluster
RL_CHECKS = ("python_version", "image", "shared_dir", "nemo_rl", "gpus", "inputs")
RL_DATA = Input("data", "data.dir", ("rl-data",), same_config=False)
DATA_PREP_CHECKS = ("python_version", "image", "data_prep_packages", "data_prep_inputs")


@dataclass(frozen=True)
class Stage:
    words: tuple[str, ...]  # the command path under `ultra3`, e.g. ("data", "prep", "sft")
    summary: str
    config_dir: str  # under configs/
    recipe: str  # the runtime module under recipes/ (`python -m recipes.<recipe>`), run inside the job
    launch: Launch  # torchrun over the GPUs of each node (one rank: the script itself), a Ray cluster, or the
    # recipe as one process
    schema: dict  # the typed schema of its config (ultra3.schema)
    validator: str | None = None  # dotted path of a `(cfg, report) -> None` run after the schema
    examples: tuple[str, ...] = ()
    flags: tuple[Flag, ...] = ()  # options of this stage only
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()
    checks: tuple[str, ...] = TRAINING_CHECKS  # recipes/preflight.py checks, by name, run first in the job
    cost: str | None = None  # dotted path of the `(config, measured) -> cost.Estimate` model of its work
    settle: str | None = None  # dotted path of a `(job) -> None` deriving keys once the inputs are known
    outputs_by: str | None = None  # the key naming job.outputs (an experiment that resumes), else the digest
    image: str | None = "training"  # the image kind its jobs run in (images.py); None: on the node itself
    named_configs: bool = False  # a bare word after the command names its config (`container build data`)
    profile_keys: tuple[tuple[str, str], ...] = ()  # NVIDIA's build_* profile keys it reads, and as which key
    done: str | None = None  # dotted path of `(job) -> str | None`: why submitting is not needed (up to date)

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def slug(self) -> str:  # job names, directories
        return "ultra3-" + "-".join(self.words)

    def validate(self) -> Callable | None:
        return _load(self.validator)

    def cost_model(self) -> Callable | None:
        return _load(self.cost)

    def settle_hook(self) -> Callable | None:
        return _load(self.settle)

    def done_hook(self) -> Callable | None:
        return _load(self.done)


def _load(dotted: str | None) -> Callable | None:
    if not dotted:
        return None
    from importlib import import_module

    module, _, attr = dotted.rpartition(".")
    return getattr(import_module(module), attr)


def data_prep_stage(kind: str, summary: str, schema: dict, output: Output, examples: tuple[str, ...]) -> Stage:
    """A data prep: CPUs only, on Ray (embedded, over the allocation, or an existing cluster)."""
    return Stage(("data", "prep", kind), summary, f"data_prep/{kind}", f"data_prep_{kind}", "ray", schema,
                 "ultra3.validation.data_prep.validate_data_prep", examples=examples, flags=DATA_PREP_FLAGS,
                 outputs=(output,), checks=DATA_PREP_CHECKS, cost="ultra3.cost_data_prep.data_prep", image="data")


def rl_stage(step: str, summary: str, inputs: tuple[Input, ...], output: str, examples: tuple[str, ...]) -> Stage:
    """An RL step: NeMo RL's entry point on Ray over the allocation, its config derived from ours (settle), its
    checkpoints an experiment's, its output the final policy in Hugging Face format."""
    return Stage(("rl", step), summary, f"rl/{step}", "rl", "ray", RL, "ultra3.validation.rl.validate_rl",
                 examples=examples, inputs=inputs, outputs=(Output(output, "output_dir"),), checks=RL_CHECKS,
                 cost="ultra3.cost.rl", settle="ultra3.nemo_rl_config.settle", outputs_by="experiment", image="rl")


STAGES: tuple[Stage, ...] = (
    Stage(
        ("pretrain",), "Pretrain Nemotron 3 Ultra with Megatron-Bridge (NVFP4 by default).",
        "pretrain", "pretrain", "torchrun", TRAINING, "ultra3.validation.validate_training",
        inputs=(Input("data", "dataset.blend_path", ("pretrain-data",), unless="dataset.mock"),),
        outputs=(Output("pretrain-checkpoint", "checkpoint.save"),),
        cost="ultra3.cost.training",
        examples=(
            "ultra3 pretrain -c tiny --dry-run",
            "ultra3 pretrain --batch mycluster dataset.blend_path=/lustre/data/blend.json",
            "ultra3 pretrain -c tiny --run mycluster train.train_iters=20",
        ),
    ),
    Stage(
        ("sft",), "Supervised fine-tuning on packed sequences with Megatron-Bridge.",
        "sft", "sft", "torchrun", TRAINING, "ultra3.validation.validate_training",
        inputs=(Input("checkpoint", "recipe.pretrained_checkpoint", ("pretrain-checkpoint",), unless="checkpoint.load",
                      optional_when="recipe.allow_random_init"),
                Input("data", "dataset.packed_dir", ("sft-data",), unless="dataset.mock")),
        outputs=(Output("sft-checkpoint", "checkpoint.save"),),
        cost="ultra3.cost.training",
        examples=(
            "ultra3 sft -c tiny --dry-run",
            "ultra3 sft --batch mycluster",
            "ultra3 sft --batch mycluster recipe.pretrained_checkpoint=/lustre/ckpt dataset.packed_dir=/lustre/sft",
        ),
    ),
    data_prep_stage("pretrain", "Tokenize pretraining corpora into Megatron bin/idx shards on Ray.", DATA_PREP_PRETRAIN,
                    Output("pretrain-data", "output_dir", "blend.json"),
                    ("ultra3 data prep pretrain -c tiny", "ultra3 data prep pretrain -c tiny --sample 100",
                     "ultra3 data prep pretrain --batch mycluster output_dir=/lustre/data/phase1")),
    data_prep_stage("sft", "Render, mask and pack SFT conversations into Parquet on Ray.", DATA_PREP_SFT,
                    Output("sft-data", "output_dir"),
                    ("ultra3 data prep sft -c tiny", "ultra3 data prep sft -c tiny --sample 100 --force",
                     "ultra3 data prep sft --batch mycluster output_dir=/lustre/data/sft")),
    data_prep_stage("rl", "Check the RL blends, restore their placeholders and split them, on Ray.", DATA_PREP_RL,
                    Output("rl-data", "output_dir"),
                    ("ultra3 data prep rl -c tiny", "ultra3 data prep rl --sample 1000",
                     "ultra3 data prep rl --batch mycluster output_dir=/lustre/data/rl "
                     "placeholders.dapo.path=hf://BytedTsinghua-SIA/DAPO-Math-17k")),
    Stage(
        ("quantize",), "NVFP4 post-training quantization with ModelOpt into a Hugging Face checkpoint.",
        "quantize", "quantize", "torchrun", QUANTIZE, "ultra3.validation.quantize.validate_quantize",
        inputs=(Input("checkpoint", "bf16_checkpoint", ("mopd-policy", "rlvr-policy", "sft-checkpoint",
                                                        "pretrain-checkpoint"),
                      unless="make_checkpoint"),
                Input("calibration", "calibration.path", ("sft-data",), required=False)),
        outputs=(Output("quantized-checkpoint", "output_dir"),),
        checks=("python_version", "image", "quantize_packages", "gpus", "inputs"), cost="ultra3.cost.quantize",
        examples=("ultra3 quantize -c tiny", "ultra3 quantize -c tiny --dry-run",
                  "ultra3 quantize --batch mycluster bf16_checkpoint=/lustre/ckpt/ultra-bf16 output_dir=/lustre/ckpt/ultra-nvfp4",
                  "ultra3 quantize --batch mycluster bf16_checkpoint=null output_dir=/lustre/ckpt/ultra-nvfp4"),
    ),
    rl_stage("rlvr", "Student RLVR: GRPO with verifiable rewards from the SFT policy, NeMo RL on Ray over Slurm.",
             (Input("policy", "policy", ("sft-checkpoint",)), RL_DATA), "rlvr-policy",
             ("ultra3 rl rlvr -c rlvr1 --batch gb200 --dry-run",
              "ultra3 rl rlvr -c rlvr2 --batch gb200 judges.genrm_url=http://genrm:8000/v1",
              "ultra3 rl rlvr -c tiny --batch mycluster check_only=true")),
    rl_stage("teacher", "A specialised teacher (ifbench, rlhf, reasoning, swe): RL from the Student RLVR policy.",
             (Input("policy", "policy", ("rlvr-policy",), same_config=False), RL_DATA), "teacher-policy",
             ("ultra3 rl teacher -c ifbench --batch gb200 --dry-run",
              "ultra3 rl teacher -c swe --batch gb200 sif_dir=/lustre/sif")),
    rl_stage("mopd", "Multi-teacher on-policy distillation of the Student RLVR policy from the teacher panel.",
             (Input("policy", "policy", ("rlvr-policy",), same_config=False), RL_DATA,
              Input("general teacher", "teachers.general", ("rlvr-policy",), same_config=False),
              # each role: its teacher config's output (`rl teacher` with no -c is the ifbench teacher)
              *(Input(f"{role} teacher", f"teachers.{role}", ("teacher-policy",), required=False,
                      configs=(role, "default") if role == "ifbench" else (role,))
                for role in TEACHER_ROLES[1:])), "mopd-policy",
             ("ultra3 rl mopd --batch gb200 --dry-run",
              "ultra3 rl mopd --batch gb200 teachers.swe=/lustre/ckpt/swe-teacher")),
    Stage(
        ("container", "build"), "Build an image kind (training, rl, data) with podman into an enroot .sqsh named "
        "by its digest.", "container", "container_build", "process", CONTAINER,
        "ultra3.validation.container.validate_container", checks=("python_version", "build_tools"),
        settle="ultra3.images.settle", done="ultra3.images.built_already", image=None, named_configs=True,
        cost="ultra3.cost.image_build",
        profile_keys=(("build_partition", "run.partition"), ("build_time", "run.time"),
                      ("build_cache_dir", "cache_dir"), ("build_registry", "registry")),
        examples=("ultra3 container build training --batch mycluster --dry-run",
                  "ultra3 container build data --batch mycluster",
                  "ultra3 container build rl --run gb200 force=true"),
    ),
)


def producers(kind: str) -> list[Stage]:
    """The stages whose outputs include `kind`."""
    return [s for s in STAGES if any(o.kind == kind for o in s.outputs)]


def find_stage(name: str) -> Stage | None:
    """A stage by its name (`data prep sft`) or its slug's tail (`data-prep-sft`)."""
    return next((s for s in STAGES if name in (s.name, "-".join(s.words), s.slug)), None)
