"""A compiled job and the options that asked for it: the data every layer passes around (the compiler makes
it, the executors, the job dir and the dry run read it), below all of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from .config import resolve, unflatten
from .paths import JOB_DIR_PLACEHOLDER

if TYPE_CHECKING:
    from .artifacts import Source, Store
    from .config import Layer
    from .findings import Report
    from .profile import Profile
    from .stage import Stage

Mode = Literal["local", "attached", "detached"]
# job.outputs, the stable home of a stage's outputs (checkpoints) across submissions of one config:
# <job root>/outputs/<stage>/<config>-<digest>, the job root being the directory above the stage's job
# dirs: a re-submission of the same config resumes there, a changed config (or inputs) starts afresh
OUTPUTS_PLACEHOLDER = "@OUTPUTS@"


@dataclass
class Options:
    config: str = "default"
    run: str | None = None
    batch: str | None = None
    dry_run: bool = False
    env_file: str | None = None
    overrides: list[str] = field(default_factory=list)
    pipe_layer: Layer | None = None  # a pipe's overrides of this stage: above the profile, below the command line
    # the outputs of a pipe's earlier stages, by (kind, its config) and (kind, None) for the newest of a kind: an
    # input is wired to one above the stage config and the profile, below what the pipe config or the command
    # line set; not where the input's `unless` key is true
    offered: dict[tuple[str, str | None], Source] = field(default_factory=dict)

    @property
    def mode(self) -> Mode:
        return "attached" if self.run else "detached" if self.batch else "local"

    @property
    def profile_name(self) -> str | None:
        return self.run or self.batch


@dataclass
class Job:
    stage: Stage
    options: Options
    config_path: Path
    profile: Profile | None
    executor: str
    config: dict[str, Any]  # resolved, with job.dir still the placeholder
    origin: dict[str, str]  # flat key -> the layer that set it
    base_sources: set[str]  # the layers of the stage's own defaults (not shown as "changed")
    report: Report
    flat: dict[str, Any] = field(repr=False)  # merged values before interpolation
    sources: list[Source | None] = field(default_factory=list)  # per stage input: its value's origin
    store: Store | None = None  # the profile's artifact store, where the inputs were looked up
    wired: dict[str, Source] = field(default_factory=dict)  # input key -> the pipe's output it was wired to

    @property
    def digest(self) -> str:
        return self.config["job"]["digest"]

    @property
    def mode(self) -> Mode:
        return self.options.mode

    def with_job(self, job: dict[str, str]) -> dict[str, Any]:
        """The config the job receives: `job.*` (id, dir, ...) filled in and interpolations resolved."""
        flat = {**self.flat, **{f"job.{k}": v for k, v in job.items()}}
        if "dir" in job:
            flat["job.outputs"] = self.placed(flat["job.outputs"], job["dir"])
        return resolve(unflatten(flat), self.origin)

    @staticmethod
    def placed(value: str, job_dir: str) -> str:
        """A compiled value with the job's directories in place of their placeholders: job.dir, and
        job.outputs (<root>/<stage slug>/<job id> -> <root>/outputs/...)."""
        root = str(PurePosixPath(job_dir).parent.parent)
        return value.replace(OUTPUTS_PLACEHOLDER, f"{root}/outputs").replace(JOB_DIR_PLACEHOLDER, job_dir)
