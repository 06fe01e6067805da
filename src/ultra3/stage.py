"""What a stage is, below everything that uses one: its command words, config dir, runtime module, launch kind,
resources, preflight checks, the artifacts it consumes and produces, and its hooks. The stages themselves are
in ultra3.stages, one module a family; each gives its stages' parts (schema, rules, cost model, hooks) through a
function that imports them down when first asked, so the CLI starts without them. A hook's `job` is the compiled
ultra3.job.Job, which holds its stage: the two modules do not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:
    from .cost import Estimate
    from .findings import Report

Launch = Literal["torchrun", "ray", "process"]


@dataclass(frozen=True)
class Flag:
    """A stage's own option, a spelling of a config key: `--sample 100` is `sample=100`."""

    key: str
    kind: type  # int or str, or bool for a switch
    help: str

    @property
    def option(self) -> str:
        return "--" + self.key.replace("_", "-")


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
    when: str | None = None  # a config key that must be set for the input to be consumed at all (a phase 2)
    config_key: str | None = None  # a config key naming the one producer config to take it from (`phase2`)

    def only(self, value: Callable[[str], Any]) -> tuple[str, ...]:
        """The producer configs this input takes artifacts from (any when empty); `value` reads a config key."""
        if self.config_key:
            named = value(self.config_key)
            return (str(named),) if named not in (None, "") else ()
        return self.configs


@dataclass(frozen=True)
class Output:
    """An artifact the stage produces: `key` holds the directory it writes, `file` is the artifact within
    it ("" for the directory itself). Nothing is produced when the key is unset (e.g. checkpoint.save)."""

    kind: str
    key: str
    file: str = ""


@dataclass(frozen=True)
class Parts:
    schema: dict  # the typed schema of its config (ultra3.schema)
    validate: Callable[[dict[str, Any], Report], None]  # its rules, run on the resolved config after the schema
    cost: Callable[[dict[str, Any], list[dict]], Estimate]  # what the job will take (ultra3.cost), from the config
    # and earlier measured runs
    derive: Callable[[dict, dict, Any], None] | None = None  # keys set from others before the inputs are resolved
    # (flat values, their origins, the report)
    settle: Callable[[Any], None] | None = None  # keys derived once the inputs are known (job -> None)
    done: Callable[[Any], str | None] | None = None  # why submitting is not needed, its output up to date (job)
    stop_time: Callable[[dict[str, Any]], tuple[int, str]] | None = None  # the seconds its runtime needs from the
    # time-limit signal to a saved exit (one step and one save), and how they were sized (config -> (s, basis));
    # None: it cannot stop early, so its Slurm job is never continued across allocations
    pipe_end: Callable[[list[str], bool], list[str]] | None = None  # what a pipe prints of its steps of this stage
    # at its end: (each step's job id, or the path of a skipped step's output), whether they all completed -> lines


@dataclass(frozen=True)
class Stage:
    words: tuple[str, ...]  # the command path under `ultra3`, e.g. ("data", "prep", "sft")
    summary: str
    config_dir: str  # under configs/
    recipe: str  # the runtime module under recipes/ (`python -m recipes.<recipe>`), run inside the job
    launch: Launch  # torchrun over the GPUs of each node (one rank: the script itself), a Ray cluster, or the
    # recipe as one process
    checks: tuple[str, ...]  # recipes/preflight.py checks, by name, run first in the job
    parts: Callable[[], Parts]  # its schema, rules, cost model and hooks, imported when called
    examples: tuple[str, ...] = ()
    flags: tuple[Flag, ...] = ()  # options of this stage only
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()
    outputs_by: str | None = None  # the key naming job.outputs (an experiment that resumes), else the digest
    image: str | None = "training"  # the image kind its jobs run in (images.py); None: on the node itself
    named_configs: bool = False  # a bare word after the command names its config (`container build data`)
    profile_keys: tuple[tuple[str, str], ...] = ()  # NVIDIA's build_* profile keys it reads, and as which key
    same_output: tuple[str, ...] | None = None  # a stage whose runs with other data publish apart (data prep): the
    # top-level keys that do not change what it makes; another key the command line or a pipe replaces makes a variant
    configs_note: str = ""  # what --help says of its configs beyond their names
    compile_cache: bool = False  # its jobs compile and autotune GPU kernels: they get a compile cache (compile_cache)

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def slug(self) -> str:  # job names, directories
        return "ultra3-" + "-".join(self.words)
