"""Slurm through NeMo-Run, from the login node or over SSH. Slurm enforces a chain's order itself:
a job submitted with `after` starts when all of those completed (afterok) and is cancelled by Slurm
when one of them did not (--kill-on-invalid-dep=yes)."""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ClusterError, UserError
from ..forms import HOST, IMAGE, JOB_NAME, MOUNT, PORT, SAFE_PATH, SLURM_MEM, SLURM_TIME, USER, Count
from ..jobprep.plan import slurm_spec
from ..paths import nemorun_home
from ..records import JobRecord, State
from . import slurm_state
from .base import NODE_KEYS, Executor, check_fault_tolerance, local_files, profile_at, read_from
from ..ssh import TIMEOUT_VAR, run, scheduler_timeout
from .nemo_run_slurm import experiment, experiment_dir, first_error, nemorun_base, ssh_settings
from .sbatch import render_sbatch

if TYPE_CHECKING:
    from ..job import Job
    from ..findings import Report
    from ..profile import Profile
    from ..stage import Stage


class Slurm(Executor):
    name = "slurm"
    keys = {
        **Executor.keys,
        **NODE_KEYS,
        "cpus_per_task": Count(1),
        "time": SLURM_TIME,
        "max_retries": Count(0),  # failed attempts requeued before the run stops (time-limit continuations are free)
        "grace_s": Count(0),  # the time-limit signal this long before the end (null: the stage's stop time; 0: none)
        "container_image": IMAGE,  # a .sqsh, an image reference, "" for none, or an image kind
        "mounts": list[MOUNT],
        "account": str,
        "partition": str,
        "qos": str,
        "mem": SLURM_MEM,
        "exclusive": bool,
        "constraint": str,
        "reservation": str,
        "segment": Count(1),  # Slurm --segment: nodes allocated together (an NVLink domain's share)
        "job_name_prefix": JOB_NAME,
        "host": HOST,  # submission over SSH: the login node, and how to reach it
        "user": USER,
        "port": PORT,
        "identity": str,
        "job_dir": SAFE_PATH,
    }
    chains = True
    asks_image = True
    shown_as = "sbatch script (as NeMo-Run submits it)"
    # the job's id in Slurm, and the SSH settings (host, user, port, identity) of the cluster's login node where
    # it was submitted over SSH: `nemotron jobs` reaches the cluster with them
    handle_types = {"slurm_id": str | None, "ssh": dict[str, str | int | None] | None}
    _marks: slurm_state.EndMarks | None = None  # a followed job's end marks, read as they come

    def check(self, stage: Stage, run: dict[str, Any], profile: Profile | None, report: Report) -> None:
        check_fault_tolerance(stage, run, report)
        if not run.get("account"):
            report.error("run.account", f"the slurm executor needs an account; set account in {profile_at(profile)} "
                                        "or run.account=NAME")
        root = run.get("job_dir") or ("" if run.get("host") else str(nemorun_home()))
        key = "run.job_dir" if run.get("job_dir") else "NEMORUN_HOME"
        if "/nemo_run" in root and not run.get("container_image"):
            report.error(key, f"{root} contains '/nemo_run', which NeMo-Run rewrites in container-less job scripts; "
                              "choose a directory without it")
        if root and not SAFE_PATH(root) and key == "NEMORUN_HOME":  # run.job_dir: checked by the schema
            report.error(key, f"{root!r}: job dirs go under it, so it must be {SAFE_PATH.what}; export NEMORUN_HOME "
                              "(or NEMOTRON_HOME) as such a path")
        if run.get("host"):
            for key in ("user", "job_dir"):
                if not run.get(key):
                    report.error(f"run.{key}", f"submitting through SSH (host={run['host']}) needs {key}; "
                                               f"set it in {profile_at(profile)}")
        try:
            scheduler_timeout()
        except UserError as e:
            report.error(f"${TIMEOUT_VAR}", str(e).split(": ", 1)[1])
        if run.get("mounts") and not run.get("container_image"):
            report.warn("run.mounts", "mounts apply inside a container only; set container_image or remove them")

    def job_dir(self, job: Job, job_id: str) -> str:
        return experiment_dir(job, job_id)

    def artifacts_root(self, job: Job) -> str:
        # login node: beside NeMo-Run's home; over SSH: beside the job dirs on the cluster (run.job_dir)
        return f"{nemorun_base(job)}/artifacts"

    def render(self, job: Job, job_id: str | None, after: Sequence[JobRecord] | Sequence[str] = ()) -> str:
        spec = slurm_spec(job, job_dir=self.shown_dir(job, job_id))
        ids = [a if isinstance(a, str) else _slurm_id(a) for a in after]
        return render_sbatch(spec, ids)

    def submit(self, job: Job, job_id: str, after: Sequence[JobRecord] = ()) -> JobRecord:
        ssh = ssh_settings(job)
        for upstream in after:
            if upstream.executor != self.name or slurm_state.ssh(upstream) != ssh:
                raise ValueError(f"{job_id} can wait only for Slurm jobs of its own cluster, not {upstream.id}")
        try:
            with experiment(job, job_id, self.job_dir(job, job_id), [_slurm_id(a) for a in after]) as (exp, spec):
                exp.run(detach=True)
        except Exception as e:  # NeMo-Run wraps sbatch/ssh failures in many exception types
            if type(e).__name__ == "CommandTimedOut":  # invoke's, raised by the bound on the tunnel's commands
                raise ClusterError(f"{e.result.command.split()[0]} did not answer within {scheduler_timeout():.0f}s "
                                   "and was stopped; the job may still have been queued: check `squeue --me` "
                                   f"(${TIMEOUT_VAR} sets the bound)") from None
            where = f" to {ssh.get('user') + '@' if ssh.get('user') else ''}{ssh['host']}" if ssh else ""
            raise ClusterError(f"submission{where} failed ({type(e).__name__}): {first_error(e)}") from None
        handle = exp.jobs[0].handle or ""
        slurm_id = handle.rsplit("/", 1)[-1]
        if not slurm_id.isdigit():
            raise ClusterError(f"submission failed: NeMo-Run returned no Slurm job id ({handle!r})")
        return self.new_record(job, job_id, job_dir=spec.job_dir, task=spec.task,
                               log_glob=f"{spec.task}/log-{spec.job_name}_{slurm_id}_*.out",
                               handle={"slurm_id": slurm_id, "ssh": ssh}, after=[a.id for a in after])

    def where(self, record: JobRecord) -> str:
        return f"Slurm job {slurm_state.slurm_id(record)}"

    def scheduler_id(self, record: JobRecord) -> str | None:
        return slurm_state.slurm_id(record)

    def remote(self, record: JobRecord) -> dict | None:
        return slurm_state.ssh(record)

    def setup_output(self, record: JobRecord) -> str | None:
        """The batch script's own output (NeMo-Run's sbatch_<name>_<id>.out): the setup lines write there."""
        return f"{record.task_dir}/sbatch_*_{slurm_state.slurm_id(record)}.out"

    def states(self, records: list[JobRecord]) -> dict[str, State]:
        return slurm_state.states(records)

    def read_log(self, record: JobRecord, offset: int) -> tuple[str, int]:
        """The job's log files (one per start of the job, in order) as one stream."""
        log = PurePosixPath(record.job_dir, record.log_glob)
        login = slurm_state.ssh(record)
        if not login:
            return read_from(local_files(sorted(Path(log.parent).glob(log.name), key=_start_order)), offset)
        listing = run(["find", str(log.parent), "-maxdepth", "1", "-name", log.name, "-printf", "%s %p\\n"],
                      login).stdout
        files = sorted(((path, int(size)) for size, path in (line.split(" ", 1) for line in listing.splitlines())),
                       key=lambda f: _start_order(PurePosixPath(f[0])))

        def tail(path: str, skip: int) -> bytes:
            return run(["tail", "-c", f"+{skip + 1}", path], login, text=False).stdout

        return read_from(files, offset, tail)

    def wait(self, record: JobRecord, seconds: float) -> State | None:
        """On the login node the batch script's output is read every 0.1 s while waiting: its last line (END_MARK)
        lands seconds before Slurm ends the job. Exit code 0 there is final (an attempt that requeues itself exits
        non-zero): the job completed. Another code leaves the verdict to Slurm (failed, cancelled, out of memory,
        requeued), asked every 0.2 s from then on. The script writes the mark once the job step closed its log:
        no settle after it."""
        if slurm_state.ssh(record):
            return super().wait(record, seconds)
        marks = self._marks = self._marks or slurm_state.EndMarks(record)
        seen = len(marks.codes)  # the attempts that ended before
        until = time.monotonic() + seconds
        while True:
            codes = marks.read()
            if codes[-1:] == [0] or len(codes) > seen:
                self.poll_s, self.settle_s = 0.2, 0.0
                return State("COMPLETED", 0, "", "job dir") if codes[-1] == 0 else None
            if time.monotonic() >= until:
                return None
            time.sleep(0.1)

    def cancel(self, record: JobRecord) -> None:
        slurm_id = slurm_state.slurm_id(record)
        result = run(["scancel", str(slurm_id)], slurm_state.ssh(record))
        if result.returncode != 0:
            raise ClusterError(f"scancel {slurm_id} failed: {result.stderr.strip()}")


def _slurm_id(record: JobRecord) -> str:
    if not (slurm_id := slurm_state.slurm_id(record)):
        raise ValueError(f"{record.id} is no Slurm job: nothing to wait for")
    return slurm_id


def _start_order(path: PurePosixPath) -> tuple[int, str]:
    """log-<name>_<slurm id>_<restart count>.out: the restart count orders them."""
    return len(path.name), path.name
