"""The one interface every executor implements: check a job's profile, show and submit the job, and
later ask for its state, read its log from a byte offset and cancel it."""

from __future__ import annotations

import codecs
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..forms import ENV, Count
from ..paths import nemorun_home
from ..records import JobRecord, State
from ..schema import IMAGES, Schema

if TYPE_CHECKING:
    from ..job import Job
    from ..findings import Report
    from ..profile import Profile
    from ..stage import Stage


# The `run.*` keys of a job this launcher sizes and starts on nodes (local runs, Slurm), not a cluster's own
# scheduler (Ray): its shape and the lines run before it.
NODE_KEYS: Schema = {
    "nodes": Count(1),
    "gpus_per_node": Count(0),
    "setup": list[str],
    "images": IMAGES,  # per image kind, the pins a profile overrides
    # training stages: their ranks under nvidia-resiliency-ext's ft_launcher (validation/fault_tolerance.py)
    "fault_tolerance": {"enabled": bool, "max_restarts": Count(0), "setup_timeout_s": Count(1),
                        "step_timeout_s": Count(1), "checkpointing_timeout_s": Count(1),
                        "out_of_section_timeout_s": Count(1)},
}


FT_RECIPES = ("pretrain", "sft")  # the runtimes whose Megatron-Bridge training loop ft_launcher times


def check_fault_tolerance(stage: Stage, run: dict[str, Any], report: Report) -> None:
    """run.fault_tolerance is Megatron-Bridge training's: another stage's ranks would run under ft_launcher with
    nothing timed."""
    if (run.get("fault_tolerance") or {}).get("enabled") and stage.recipe not in FT_RECIPES:
        report.error("run.fault_tolerance.enabled", f"{stage.name} is not Megatron-Bridge training (pretrain, sft), "
                                                    "whose ranks ft_launcher watches; remove it",
                     ("run.fault_tolerance.enabled",))


class Executor(ABC):
    name: str
    # The `run.*` keys it reads, with their types: its profile and the stage config's `run` section are checked
    # against them (a key another executor reads is an error only where the user set it).
    keys: Schema = {"env": ENV, "compile_cache": str}  # compile_cache: ultra3.compile_cache
    # True where the scheduler enforces a chain's order, so a pipeline submits all its stages at once;
    # False where a pipeline runs them one after another.
    chains: bool
    runs_here = False  # the job runs on this machine: paths and GPUs seen here are the job's
    asks_image = False  # its jobs run on other machines: a container image (or "" for none) must be chosen
    poll_s = 1.0  # how often a followed job's state and log are read
    settle_s = 1.0  # how long its log may still grow after its state says it ended (a shared file system's lag)
    shown_as: str  # the dry run's title for what render() returns
    handle_types: dict[str, object] = {}  # the fields of its jobs' handle (JobRecord.handle), with their types

    @abstractmethod
    def check(self, stage: Stage, run: dict[str, Any], profile: Profile | None, report: Report) -> None:
        """Report what the profile (`run.*`) lacks or gets wrong for this executor."""

    @abstractmethod
    def job_dir(self, job: Job, job_id: str) -> str:
        """The experiment dir of the job (a path on the cluster for SSH submissions)."""

    @abstractmethod
    def artifacts_root(self, job: Job) -> str:
        """The default artifact store, beside the job dirs."""

    @abstractmethod
    def render(self, job: Job, job_id: str | None, after: Sequence[JobRecord] | Sequence[str] = ()) -> str | None:
        """What the dry run shows of the submission. job_id None: the job dir is shown as the compiled
        config's placeholder. `after` (shown where the executor chains) may hold placeholders for ids
        not known yet, e.g. `<pretrain>`."""

    @abstractmethod
    def submit(self, job: Job, job_id: str, after: Sequence[JobRecord] = ()) -> JobRecord:
        """Start the job (after every job of `after` completed, where the executor chains)."""

    @abstractmethod
    def states(self, records: list[JobRecord]) -> dict[str, State]:
        """The state of each of these jobs, which all run on this executor."""

    @abstractmethod
    def read_log(self, record: JobRecord, offset: int) -> tuple[str, int]:
        """The log from byte `offset` on, and the offset after it."""

    @abstractmethod
    def cancel(self, record: JobRecord) -> None: ...

    def wait(self, record: JobRecord, seconds: float) -> State | None:
        """Wait `seconds` before a followed job's next poll; its final State where the job's own files show its end
        before the scheduler does (the poll is then skipped)."""
        time.sleep(seconds)
        return None

    def new_record(self, job: Job, job_id: str, **values: Any) -> JobRecord:
        return JobRecord(id=job_id, stage=job.stage.name, config=job.options.config, executor=self.name,
                         mode=job.mode, submitted=0, profile=job.profile.name if job.profile else None, **values)

    # -- what the `jobs` commands show of a record, from its handle --------------------------------------------

    @abstractmethod
    def where(self, record: JobRecord) -> str:
        """What runs the job, as `submitted <id> (...)` says it: `Slurm job 59`, `pid 4242`."""

    def scheduler_id(self, record: JobRecord) -> str | None:
        """The id its scheduler knows the job by, which the `jobs` commands take too; None where it has none."""
        return None

    def remote(self, record: JobRecord) -> dict | None:
        """The SSH settings of the machine that holds the job dir; None: this one."""
        return None

    def log_at(self, record: JobRecord) -> str:
        return f"{record.job_dir}/{record.log_glob}"

    def setup_output(self, record: JobRecord) -> str | None:
        """Where the job's output before its log (its setup lines) goes, where that is a file of its own."""
        return None

    def shown_dir(self, job: Job, job_id: str | None) -> str:
        """The job dir for an id; in a dry run (no id yet) the compiled config's placeholder."""
        return self.job_dir(job, job_id) if job_id else job.config["job"]["dir"]

    def refuse_chain(self, after: Sequence[object]) -> None:
        if after:
            raise ValueError(f"the {self.name} executor does not chain jobs; run them one after another")


def profile_at(profile: Profile | None) -> str:
    return f"{profile.file.name} [{profile.name}]" if profile else "the profile"


def home_job_dir(job: Job, job_id: str) -> Path:
    """The job dir of a job staged on this machine (local runs, Ray jobs)."""
    return nemorun_home() / "experiments" / job.stage.slug / job_id


def home_artifacts() -> Path:
    return nemorun_home() / "artifacts"


def local_files(paths: list[Path]) -> list[tuple[str, int]]:
    """(path, size) of those of the files that exist."""
    found = []
    for path in paths:
        try:
            found.append((str(path), path.stat().st_size))
        except OSError:
            continue
    return found


def read_local(path: str, skip: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(skip)
        return f.read()


def read_from(files: list[tuple[str, int]], offset: int, read: Callable[[str, int], bytes] = read_local
              ) -> tuple[str, int]:
    """The text of the files (path, size), read as one stream, from byte `offset` on; `read(path, skip)`
    gives a file's bytes after the first `skip`."""
    data = b""
    start = 0
    for path, size in files:
        if offset < start + size:
            skip = max(offset - start, 0)
            data += read(path, skip)[: size - skip]  # what it held when listed: the next file follows
        start += size
    return decode(data, offset)


def decode(data: bytes, offset: int) -> tuple[str, int]:
    """UTF-8 text of `data` read from `offset`; a character cut at the end is left for the next read."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data)
    return text, offset + len(data) - len(decoder.getstate()[0])
