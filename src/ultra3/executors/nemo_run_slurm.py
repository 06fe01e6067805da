"""NeMo-Run's Slurm submission of one job: its SlurmExecutor (from the login node through a LocalTunnel,
or over SSH) and the experiment that submits the staged code dir."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from ..contract import CONFIG_FILE, ENTRY_MODULE
from ..jobprep.jobdir import write_code_dir
from ..ssh import scheduler_timeout, ssh_of
from ..jobprep.plan import SlurmSpec, slurm_spec
from ..paths import nemorun_home
from .nemo_run_lite import submission
from .sbatch import chain_parameters

if TYPE_CHECKING:
    from ..job import Job


def nemorun_base(job: Job) -> str:
    """NeMo-Run's home for a login-node submission: the profile's job_dir, else NEMORUN_HOME."""
    return job.config["run"].get("job_dir") or str(nemorun_home())


def jobs_root(job: Job) -> str:
    """The folder that holds the experiment dirs (<root>/<title>/<id>)."""
    if job.config["run"].get("host"):
        return job.config["run"]["job_dir"]  # NeMo-Run's SSHTunnel: <job_dir>/<title>/<id> on the cluster
    return f"{nemorun_base(job)}/experiments"


def experiment_dir(job: Job, job_id: str) -> str:
    return f"{jobs_root(job)}/{job.stage.slug}/{job_id}"


def ssh_settings(job: Job) -> dict | None:
    return ssh_of(job.config["run"])


@contextlib.contextmanager
def _nemo_run(home: str) -> Iterator[types.SimpleNamespace]:
    """NeMo-Run's submission API (nemo_run_lite), its home set. A LocalTunnel only works with job_dir="" (that
    is, $NEMORUN_HOME/experiments): so the home is where this job's experiment dir must go. NeMo-Run reads
    NEMORUN_HOME when first imported; a process that submits more than one job sets it again."""
    os.environ["NEMORUN_HOME"] = home
    with _hidden("torch"), submission() as run:
        run.set_nemorun_home(home)
        yield run


@contextlib.contextmanager
def _hidden(module: str) -> Iterator[None]:
    """`module` reads as not installed while NeMo-Run is imported and used: its YAML serializer imports torch,
    when there, only to represent torch dtypes, which a job's config never holds (1-2.5 s of every submission)."""
    if module in sys.modules:
        yield
        return
    sys.modules[module] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError
    try:
        yield
    finally:
        if sys.modules.get(module, 0) is None:
            del sys.modules[module]


def build_executor(run: types.SimpleNamespace, spec: SlurmSpec, ssh: dict | None, root: str, staging: Path,
                   after: list[str]):
    """`after`: Slurm ids the job waits for. NeMo-Run takes them as app handles (`<scheme>://<session>/<id>`,
    see SlurmExecutor.parse_deps) and passes `--dependency=afterok:<ids>` to sbatch and into the script."""
    if ssh:
        tunnel = run.SSHTunnel(host=ssh["host"], user=ssh["user"], job_dir=root, port=ssh.get("port"),
                               identity=os.path.expanduser(ssh["identity"]) if ssh.get("identity") else None)
    else:
        tunnel = run.LocalTunnel(job_dir="")
    return run.SlurmExecutor(
        account=spec.account, partition=spec.partition, qos=spec.qos, time=spec.time, nodes=spec.nodes,
        ntasks_per_node=spec.ntasks_per_node, gpus_per_node=spec.gpus_per_node, cpus_per_task=spec.cpus_per_task,
        mem=spec.mem, exclusive=spec.exclusive, constraint=spec.constraint,
        additional_parameters={**spec.additional, **chain_parameters(after)} or None,
        dependencies=[f"slurm_tunnel://nemo_run/{slurm_id}" for slurm_id in after], dependency_type="afterok",
        container_image=spec.container_image, container_mounts=spec.container_mounts, env_vars=spec.env_vars,
        setup_lines=spec.setup_lines, job_name_prefix=spec.job_name[: -len(spec.task)], tunnel=tunnel,
        poll_estimated_start_time=False,
        packager=run.PatternPackager(include_pattern=f"{staging}/*", relative_path=str(staging)),
    )


@contextlib.contextmanager
def experiment(job: Job, job_id: str, exp_dir: str, after: list[str]) -> Iterator[tuple[object, SlurmSpec]]:
    """NeMo-Run's experiment for this job, its code dir staged; yields (experiment, spec)."""
    ssh = ssh_settings(job)
    spec = slurm_spec(job, job_dir=exp_dir)
    with tempfile.TemporaryDirectory(prefix="ultra3-") as tmp:
        staging = Path(tmp)
        write_code_dir(job, job_id, exp_dir, staging)
        home = str(nemorun_home()) if ssh else nemorun_base(job)
        with _nemo_run(home) as run, contextlib.redirect_stdout(io.StringIO()):  # NeMo-Run's console chatter
            executor = build_executor(run, spec, ssh, jobs_root(job), staging, after)
            # skip_status_at_exit: no sacct for a status table no one reads
            with run.Experiment(job.stage.slug, executor=executor, id=job_id, clean_mode=True,
                                enable_goodbye_message=False, skip_status_at_exit=True) as exp:
                exp.add(run.Script(path=ENTRY_MODULE, entrypoint="python", m=True, args=["--config", CONFIG_FILE]),
                        name=spec.task, tail_logs=False)
                _bound(exp.jobs[0].executor.tunnel)  # the experiment's copy of the executor runs the commands
                yield exp, spec


def _bound(tunnel) -> None:
    """Every command NeMo-Run runs through the tunnel (mkdir, sbatch) ends within the scheduler timeout: invoke
    (fabric over SSH) kills it then and raises CommandTimedOut. An SSH tunnel's session exists once connected."""
    if not tunnel.session:
        tunnel.connect()
    tunnel.session.config.timeouts.command = scheduler_timeout()


def nemo_run_script(job: Job, job_id: str, after: Sequence[str] = ()) -> str:
    """The sbatch script NeMo-Run itself renders for this job (its dry run), for comparison."""
    with experiment(job, job_id, experiment_dir(job, job_id), list(after)) as (exp, spec):
        exp.dryrun(log=False, delete_exp_dir=False)
        text = Path(exp._exp_dir, f"{spec.task}_sbatch.sh").read_text()
        shutil.rmtree(exp._exp_dir, ignore_errors=True)
    return text


def first_error(e: BaseException) -> str:
    text = str(e)
    errors = re.findall(r"(?:sbatch|ssh|rsync): error:.*|error: .*", text)
    return (errors[0] if errors else text.strip().splitlines()[0] if text.strip() else type(e).__name__)[:300]
