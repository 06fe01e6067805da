"""Compile a stage command into a checked job: config layers, profile, overrides, schema,
executor rules and the stage's validation rules. All errors are collected before anything runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from . import schema as schemas
from .config import CLI_SOURCE, Layer, flatten, find_config, load_layers, merge, parse_overrides, resolve, unflatten
from .errors import InvalidConfig
from .findings import Report
from .gpus import visible_gpu_count
from .paths import nemorun_home
from .profiles import SECRET_FIX, SECRET_NAME, Profile, check_run_keys, find_env_file, load_profile
from .schema import CLUSTER
from .stages import Stage
from .validation.precision import settle as settle_precision

Mode = Literal["local", "attached", "detached"]
JOB_DIR_PLACEHOLDER = "@JOB_DIR@"
# job.outputs, the stable home of a stage's outputs (checkpoints) across submissions of one config:
# <job root>/outputs/<stage>/<config>, the job root being the directory above the stage's job dirs
OUTPUTS_PLACEHOLDER = "@OUTPUTS@"
THIS_MACHINE = "this machine"


@dataclass
class Options:
    config: str = "default"
    run: str | None = None
    batch: str | None = None
    dry_run: bool = False
    env_file: str | None = None
    overrides: list[str] = field(default_factory=list)

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

    @property
    def mode(self) -> Mode:
        return self.options.mode

    def with_job(self, job: dict[str, str]) -> dict[str, Any]:
        """The config the job receives: `job.*` (id, dir, ...) filled in and interpolations resolved."""
        flat = {**self.flat, **{f"job.{k}": v for k, v in job.items()}}
        if "dir" in job:  # <root>/<stage slug>/<job id> -> <root>/outputs/...
            root = str(PurePosixPath(job["dir"]).parent.parent)
            flat["job.outputs"] = flat["job.outputs"].replace(OUTPUTS_PLACEHOLDER, f"{root}/outputs", 1)
        return resolve(unflatten(flat))


def compile_job(stage: Stage, options: Options) -> Job:
    report = Report()
    config_path = find_config(stage.config_dir, options.config)
    layers = load_layers(config_path, stage.config_dir)
    base_sources = {layer.source for layer in load_layers(find_config(stage.config_dir, "default"), stage.config_dir)}

    if options.env_file:
        find_env_file(options.env_file)  # a wrong --env-file is an error even when no profile is used
    profile = load_profile(options.profile_name, options.env_file, "--run" if options.run else "--batch") \
        if options.profile_name else None
    executor = profile.executor if profile else "local"
    if profile:
        layers.append(Layer(profile.source, {f"{'cluster' if k.split('.')[0] in CLUSTER else 'run'}.{k}": v
                                             for k, v in flatten(profile.values).items()}))
    cli = parse_overrides(options.overrides)
    layers.append(cli)

    flat, origin = merge(layers)
    for key in [k for k in flat if k == "job" or k.startswith("job.")]:
        report.error(key, f"job.* is set by the launcher for each job (set in {origin[key]}); remove it")
        del flat[key]
    for section in ("run", "cluster"):  # the launcher adds keys to these tables: a value there cannot stay
        if section in flat and flat[section] != {}:
            report.error(section, f"must be a table of keys, got {flat.pop(section)!r} (set in {origin[section]})")
    _job_shape(stage, executor, flat, origin, report)
    if prepare := stage.prepare_values():
        prepare(flat, origin, report)
    flat.update({"job.stage": stage.name, "job.launch": stage.launch, "job.recipe": stage.recipe,
                 "job.executor": executor, "job.dir": JOB_DIR_PLACEHOLDER, "job.config": config_path.stem,
                 "job.outputs": f"{OUTPUTS_PLACEHOLDER}/{stage.slug}/{config_path.stem}"})
    tree = unflatten(flat)

    # a stage config may carry keys for other executors (run.time is for Slurm); only an explicit
    # override of such a key is an error
    run = {k: v for k, v in (tree.get("run") or {}).items()
           if k in schemas.run_schema(executor) or k not in schemas.RUN_KEYS or _set_by_user(f"run.{k}", origin)}
    check_run_keys(run, executor, report, origin, "run.")
    schemas.check({k: v for k, v in tree.items() if k not in ("run", "job")},
                  {**{k: v for k, v in stage.schema.items() if k != "run"}, "cluster": CLUSTER}, report, origin)
    _check_secrets(flat, origin, report)
    if report.errors:
        raise InvalidConfig(report.errors)

    config = resolve(tree)
    config.setdefault("cluster", {})
    for key, value in settle_precision(config, origin, report).items():  # TE env vars, FP32 grad reduction
        flat[key] = value
        _put(config, key, value)
    _check_executor(stage, executor, profile, config["run"], report)
    if validator := stage.validate():
        validator(config, report)
    if report.errors:
        raise InvalidConfig(report.errors)
    return Job(stage, options, config_path, profile, executor, config, origin, base_sources, report, flat)


def _put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    tree[last] = value


def _set_by_user(key: str, origin: dict[str, str]) -> bool:
    return any(src == CLI_SOURCE for k, src in origin.items() if k == key or k.startswith(key + "."))


def _job_shape(stage: Stage, executor: str, flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """The job's GPUs per node (run.gpus_per_node) against what the machines have (cluster.*): on this
    machine those are the visible GPUs; a stage config without a count takes the cluster's."""
    if executor == "local" and flat.get("cluster.gpus_per_node") is None:
        flat["cluster.gpus_per_node"] = visible_gpu_count()
        origin["cluster.gpus_per_node"] = THIS_MACHINE
    have = flat.get("cluster.gpus_per_node")
    if flat.get("run.gpus_per_node") is None and have is not None:
        flat["run.gpus_per_node"] = have
        origin["run.gpus_per_node"] = origin["cluster.gpus_per_node"]
    wanted = flat.get("run.gpus_per_node")
    if stage.launch != "torchrun" or not isinstance(wanted, int) or not isinstance(have, int) or wanted <= have:
        return
    if have == 0 and executor == "local":
        report.warn("run.gpus_per_node", f"no GPU visible on {THIS_MACHINE}; the checks assume the config's {wanted} "
                                         "GPU(s), and the job's preflight will stop without them")
    else:
        report.error("run.gpus_per_node", f"the job wants {wanted} GPUs per node but the nodes have {have} "
                                          f"(cluster.gpus_per_node, from {origin['cluster.gpus_per_node']}); set "
                                          f"run.gpus_per_node={have} and scale run.nodes, or pick another profile")


def _check_executor(stage: Stage, executor: str, profile: Profile | None, run: dict[str, Any], report: Report) -> None:
    nodes = run.get("nodes") or 1
    if executor == "local":
        if nodes > 1:
            report.error("run.nodes", f"{nodes} nodes, but the local executor runs on this machine only; submit "
                                      "with --run/--batch PROFILE, or set run.nodes=1 (as -c tiny does)")
        return
    if executor == "ray":
        if stage.launch != "ray":
            report.error("job.executor", f"the ray executor runs Ray stages (data prep); submit `{stage.name}` "
                                         "with a slurm profile or on this machine")
        if not run.get("address"):
            report.error("run.address", f"the ray executor needs the cluster's Jobs API address (e.g. "
                                        f"http://head:8265); set address in {_profile_at(profile)}")
        return
    if not run.get("account"):
        report.error("run.account", f"the slurm executor needs an account; set account in {_profile_at(profile)} "
                                    "or run.account=NAME")
    root = run.get("job_dir") or ("" if run.get("host") else str(nemorun_home()))
    if "/nemo_run" in root and not run.get("container_image"):
        key = "run.job_dir" if run.get("job_dir") else "NEMORUN_HOME"
        report.error(key, f"{root} contains '/nemo_run', which NeMo-Run rewrites in container-less job scripts; "
                          "choose a directory without it")
    if run.get("host"):
        for key in ("user", "job_dir"):
            if not run.get(key):
                report.error(f"run.{key}", f"submitting through SSH (host={run['host']}) needs {key}; "
                                           f"set it in {_profile_at(profile)}")
    if run.get("mounts") and not run.get("container_image"):
        report.warn("run.mounts", "mounts apply inside a container only; set container_image or remove them")


def _profile_at(profile: Profile | None) -> str:
    return f"{profile.file.name} [{profile.name}]" if profile else "the profile"


_ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")


def _check_secrets(flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """A secret resolved into the config, or given as a value of run.env, would be written to the job dir
    (and the sbatch script): refuse it."""
    for key, value in flat.items():
        name = key.removeprefix("run.env.")
        if name != key and SECRET_NAME.search(name) and value not in (None, ""):
            report.error(key, f"a secret would be written to the job dir (set in {origin[key]}); remove it and "
                              + SECRET_FIX.format(name=name))
        for var in _ENV_REF.findall(value) if isinstance(value, str) else ():
            if SECRET_NAME.search(var):
                report.error(key, f"references the secret {var}; secrets reach the job through its environment "
                                  "only, so read it there instead of from the config")


def changed_keys(job: Job) -> dict[str, str]:
    """Keys whose value does not come from the stage's default config, with their source."""
    return {k: src for k, src in job.origin.items() if src not in job.base_sources}

