"""Submission to Slurm through NeMo-Run: from the login node (LocalTunnel) or over SSH."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..compile import Job
from ..errors import ClusterError
from ..jobs import JobRecord
from ..paths import nemorun_home
from .jobdir import write_code_dir
from .plan import ENTRY, CONFIG_FILE, SlurmSpec, slurm_spec


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
    run = job.config["run"]
    if not run.get("host"):
        return None
    return {k: run.get(k) for k in ("host", "user", "port", "identity")}


def _import_nemo_run(home: str):
    # NeMo-Run reads NEMORUN_HOME when imported, and a LocalTunnel only works with job_dir="" (that is,
    # $NEMORUN_HOME/experiments): so the home is where this job's experiment dir must go.
    os.environ["NEMORUN_HOME"] = home
    import nemo_run

    return nemo_run


def build_executor(spec: SlurmSpec, ssh: dict | None, root: str, staging: Path, home: str):
    run = _import_nemo_run(home)
    if ssh:
        tunnel = run.SSHTunnel(host=ssh["host"], user=ssh["user"], job_dir=root, port=ssh.get("port"),
                               identity=os.path.expanduser(ssh["identity"]) if ssh.get("identity") else None)
    else:
        tunnel = run.LocalTunnel(job_dir="")
    return run.SlurmExecutor(
        account=spec.account, partition=spec.partition, qos=spec.qos, time=spec.time, nodes=spec.nodes,
        ntasks_per_node=spec.ntasks_per_node, gpus_per_node=spec.gpus_per_node, cpus_per_task=spec.cpus_per_task,
        mem=spec.mem, exclusive=spec.exclusive, constraint=spec.constraint,
        additional_parameters=spec.additional or None, container_image=spec.container_image,
        container_mounts=spec.container_mounts, env_vars=spec.env_vars, setup_lines=spec.setup_lines,
        job_name_prefix=spec.job_name[: -len(spec.task)], tunnel=tunnel, poll_estimated_start_time=False,
        packager=run.PatternPackager(include_pattern=f"{staging}/*", relative_path=str(staging)),
    )


@contextlib.contextmanager
def _experiment(job: Job, job_id: str):
    """NeMo-Run's experiment for this job, its code dir staged; yields (experiment, spec)."""
    ssh = ssh_settings(job)
    exp_dir = experiment_dir(job, job_id)
    spec = slurm_spec(job, job_dir=exp_dir)
    with tempfile.TemporaryDirectory(prefix="ultra3-") as tmp:
        staging = Path(tmp)
        write_code_dir(job, job_id, exp_dir, staging)
        home = str(nemorun_home()) if ssh else nemorun_base(job)
        executor = build_executor(spec, ssh, jobs_root(job), staging, home)
        run = _import_nemo_run(home)
        with contextlib.redirect_stdout(io.StringIO()):  # NeMo-Run's console chatter
            with run.Experiment(job.stage.slug, executor=executor, id=job_id, clean_mode=True,
                                enable_goodbye_message=False) as exp:
                exp.add(run.Script(path=ENTRY, entrypoint="python", args=["--config", CONFIG_FILE]),
                        name=spec.task, tail_logs=False)
                yield exp, spec


def submit(job: Job, job_id: str) -> JobRecord:
    try:
        with _experiment(job, job_id) as (exp, spec):
            exp.run(detach=True)
    except Exception as e:  # NeMo-Run wraps sbatch/ssh failures in many exception types
        raise ClusterError(f"submission failed: {_first_line(e)}") from None
    handle = exp.jobs[0].handle or ""
    slurm_id = handle.rsplit("/", 1)[-1]
    if not slurm_id.isdigit():
        raise ClusterError(f"submission failed: NeMo-Run returned no Slurm job id ({handle!r})")
    return JobRecord(
        id=job_id, stage=job.stage.name, config=job.options.config, executor="slurm", mode=job.mode,
        submitted=0, job_dir=spec.job_dir, task=spec.task,
        log_glob=f"{spec.task}/log-{spec.job_name}_{slurm_id}_*.out",
        profile=job.profile.name if job.profile else None, slurm_id=slurm_id, ssh=ssh_settings(job),
    )


def nemo_run_script(job: Job, job_id: str) -> str:
    """The sbatch script NeMo-Run itself renders for this job (its dry run), for comparison."""
    with _experiment(job, job_id) as (exp, spec):
        exp.dryrun(log=False, delete_exp_dir=False)
        script = Path(exp._exp_dir, f"{spec.task}_sbatch.sh")
        text = script.read_text()
        shutil.rmtree(exp._exp_dir, ignore_errors=True)
    return text


def _first_line(e: BaseException) -> str:
    text = str(e)
    errors = re.findall(r"(?:sbatch|ssh|rsync): error:.*|error: .*", text)
    return (errors[0] if errors else text.strip().splitlines()[0] if text.strip() else type(e).__name__)[:300]
