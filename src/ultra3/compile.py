"""Compile a stage command into a checked job: config layers, profile, overrides, schema,
executor rules and the stage's validation rules. All errors are collected before anything runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import artifacts, compile_cache, executors, images, input_paths, leaks
from .artifacts import Source
from . import schema as schemas
from .contract import NAME, VERBOSE_VAR
from .config import CLI_SOURCE, Layer, flatten, find_config, load_layers, merge, parse_overrides, resolve, unflatten
from .dotted import get, put
from .errors import InvalidConfig, UserError
from .ssh import ssh_of
from .findings import Report
from .gpus import visible_gpu_count
from .nvidia_keys import read_as_ours
from .nvidia_profile import BUILD
from .job import OUTPUTS_PLACEHOLDER, Job, Options
from .paths import JOB_DIR_PLACEHOLDER
from .profiles import Profile, check_run_keys, find_env_file, load_profile
from .schema import CLUSTER
from .stage import Stage
from .stages import producers
from .validation.precision import settle as settle_precision

THIS_MACHINE = "this machine"


def compile_job(stage: Stage, options: Options) -> Job:
    report = Report()
    config_path = find_config(stage.config_dir, options.config)
    layers = load_layers(config_path, stage.config_dir)
    if not any(layer.values for layer in layers):  # not even `defaults:`: not the file meant
        raise UserError(f"--config {options.config}: {layers[-1].source} is empty; give this stage's keys, or "
                        "`defaults: [default]` and the keys that differ")
    base_sources = {layer.source for layer in load_layers(find_config(stage.config_dir, "default"), stage.config_dir)}

    if options.env_file:
        find_env_file(options.env_file)  # a wrong --env-file is an error even when no profile is used
    profile = load_profile(options.profile_name, options.env_file, "--run" if options.run else "--batch") \
        if options.profile_name else None
    executor = profile.executor if profile else "local"
    if profile:
        layers += _profile_layers(stage, profile, layers, report)
    below = len(layers)  # the stage config and the profile; above them the pipe and the command line
    if options.pipe_layer:
        layers.append(options.pipe_layer)
    layers.append(parse_overrides(options.overrides))
    for layer in layers:
        read_as_ours(stage, layer, report)

    flat, origin = merge(layers)
    variant = artifacts.variant(stage, config_path.stem, flat, origin, merge(layers[:below])[0],
                                {layer.source for layer in layers[below:]}, report)
    artifacts.refuse_unread(stage, flat, origin, [layer.source for layer in layers], report)
    wired = _wire(stage, options, flat, origin)
    for key in [k for k in flat if k == "job" or k.startswith("job.")]:
        report.error(key, f"job.* is set by the launcher for each job (set in {origin[key]}); remove it")
        del flat[key]
    leaks.check_merged(flat, origin, report)
    for section in ("run", "cluster"):  # the launcher adds keys to these tables: a value there cannot stay
        if section in flat and flat[section] != {}:
            report.error(section, f"must be a table of keys, got {flat.pop(section)!r} (set in {origin[section]})")
    _job_shape(executor, flat, origin, report)
    flat.update({"job.stage": stage.name, "job.launch": stage.launch, "job.recipe": f"recipes.{stage.recipe}",
                 "job.executor": executor, "job.runs_here": executors.executor(executor).runs_here,
                 "job.dir": JOB_DIR_PLACEHOLDER, "job.config": config_path.stem,
                 "job.outputs": f"{OUTPUTS_PLACEHOLDER}/{stage.slug}/{config_path.stem}",
                 "job.profile": profile.name if profile else None, "job.checks": list(stage.checks),
                 **({"job.variant": variant} if variant else {})})
    _verbose(flat, origin)
    if derive := stage.parts().derive:
        derive(flat, origin, report)
    tree = unflatten(flat)
    from .interpolations import bound

    bound(tree, origin)  # an interpolation bomb stops here, alone, as a YAML one does while it is read

    # a stage config may carry keys for other executors (run.time is for Slurm); only an explicit
    # override of such a key is an error
    reads = executors.executor(executor).keys
    run = {k: v for k, v in (tree.get("run") or {}).items()
           if k in reads or not executors.readers(k) or _set_by_user(f"run.{k}", origin)}
    check_run_keys(run, executor, report, origin, "run.")
    schemas.check({k: v for k, v in tree.items() if k not in ("run", "job")},
                  {**{k: v for k, v in stage.parts().schema.items() if k != "run"}, "cluster": CLUSTER}, report, origin)
    # every error in one round: the later checks run on what is left; a check tripping over a value already
    # reported stays quiet
    early, first = {f.key for f in report.errors}, len(report.findings)
    early |= {f"run.{f.key.rsplit(' ', 1)[-1]}" for f in profile.errors} if profile else set()  # left out of run
    try:
        job = _checked(stage, options, config_path, profile, executor, tree, origin, base_sources, report, flat, wired)
    except UserError as e:
        if not report.errors or isinstance(e, InvalidConfig):
            raise
        key, _, message = str(e).partition(": ")
        report.error(key, message)
    except Exception:
        if not report.errors:
            raise
    report.findings[first:] = [f for f in report.findings[first:] if f.level != "error" or f.key not in early]
    if report.errors:
        raise InvalidConfig(report.errors)
    return job


def _verbose(flat: dict[str, Any], origin: dict[str, str]) -> None:
    """`ultra3 -v` (VERBOSE_VAR=1 here): the job's environment says so, and its runtime keeps the libraries'
    warnings, INFO lines and progress bars in the log (recipes/quiet.py)."""
    if os.environ.get(VERBOSE_VAR) == "1" and flat.get("run.env", {}) in ({}, None):  # a bad value: schema's error
        flat.pop("run.env", None)
        key = f"run.env.{VERBOSE_VAR}"
        flat[key], origin[key] = "1", "-v"


def _checked(stage: Stage, options: Options, config_path: Path, profile: Profile | None, executor: str,
             tree: dict[str, Any], origin: dict[str, str], base_sources: set[str], report: Report,
             flat: dict[str, Any], wired: dict[str, Source]) -> Job:
    """The resolved config through precision settling, the inputs, the executor's rules and the stage's rules."""
    config = resolve(tree, origin)
    config.setdefault("cluster", {})
    report.config, report.origin = config, origin  # findings quote values with their sources
    leaks.check_resolved(config, report)
    for key, value in settle_precision(config, origin, report).items():  # TE env vars, FP32 grad reduction
        flat[key] = value
        put(config, key, value)
    images.choose(stage.image, config, flat, origin, profile, executors.executor(executor).asks_image,
                  options.dry_run, report)
    job = Job(stage, options, config_path, profile, executor, config, origin, base_sources, report, flat, wired=wired)
    _settle_inputs(job)
    if stage.compile_cache:
        compile_cache.settle(job)
    # after the stage's own derived keys (RL sizes run.nodes from its layout): the executor judges the job that runs
    executors.executor(executor).check(stage, config["run"], profile, report)
    stage.parts().validate(config, report)
    return job


def _profile_layers(stage: Stage, profile: Profile, below: list[Layer], report: Report) -> list[Layer]:
    """The profile's values as a layer: its run.* and cluster.* keys, and the stage keys it sets that this stage
    has (RL's sandbox, [wandb]); then NVIDIA's build_* keys the stage reads (image builds), above them. A stage
    config that sizes its own job (run.nodes) keeps it: the profile's `nodes` sizes only the configs that do
    not (as in NVIDIA's CLI)."""
    values = {f"{'cluster' if k.split('.')[0] in CLUSTER else 'run'}.{k}": v
              for k, v in flatten(profile.values).items()}
    sized = next((layer.source for layer in reversed(below) if "run.nodes" in layer.values), None)
    if sized and "run.nodes" in values:
        report.note("run.nodes", f"{values.pop('run.nodes')} from {profile.source} is not used: {sized} sizes "
                                 "this job (run.nodes=N on the command line overrides it)")
    values.update({k: v for k, v in profile.stage_values.items() if schemas.has_key(stage.parts().schema, k)})
    reads, build = dict(stage.profile_keys), {}
    finds_image = stage.image is not None and executors.executor(profile.executor).asks_image \
        and profile.values.get("container_image") in (None, *images.KINDS)
    for key in [k for k in BUILD if k in profile.stage_values]:
        if key == "build_cache_dir" and finds_image and key not in reads:
            continue  # where this stage's built image is looked up (images.choose)
        if key in reads:
            build[reads[key]] = profile.stage_values[key]
        else:
            report.note(f"{profile.file.name} [{profile.name}] {key}",
                        "not used: the build job runs podman on the node itself, without GPUs" if reads
                        else "read by image builds and by stages whose profile names no container_image; not used here")
    report.findings += profile.notes + profile.errors
    return [Layer(profile.source, values), *([Layer(f"{profile.source}, its build_* keys", build)] if build else [])]


def _wire(stage: Stage, options: Options, flat: dict[str, Any], origin: dict[str, str]) -> dict[str, Source]:
    """Each input to the output a pipe offers for it (the newest earlier maker of its kind, of the config it takes
    when it names one), unless the pipe config or the command line set it; input key -> that output."""
    explicit = {CLI_SOURCE, options.pipe_layer.source if options.pipe_layer else None}
    wired = {}
    for inp in stage.inputs:
        only = inp.only(flat.get)
        src = next((options.offered[kind, c] for kind in inp.kinds for c in (only or (None,))
                    if (kind, c) in options.offered), None)
        if src and origin.get(inp.key) not in explicit and not (inp.unless and flat.get(inp.unless)):
            flat[inp.key], origin[inp.key] = src.path, src.how
            wired[inp.key] = src
    return wired


def _settle_inputs(job: Job) -> None:
    """The stage's inputs from the artifact store (or the pipe's wiring), its declared outputs, its config
    digest and store: in `job.*`, for the dry run, the in-job preflight and the manifests it publishes."""
    profile = job.profile.name if job.profile else None
    store = job.store = _artifact_store(job)
    job.sources = artifacts.settle(job.stage, job.config, job.origin, profile, store, job.wired, job.report,
                                   producers)
    for inp, src in zip(job.stage.inputs, job.sources):
        if src:
            job.flat[inp.key] = src.path
    input_paths.check_paths(job.stage, job.config, job.sources, profile, executors.executor(job.executor).runs_here,
                          job.report, producers)
    if settle := job.stage.parts().settle:  # keys derived from the inputs, before the outputs are addressed
        settle(job)
    digest = artifacts.digest(job.config, job.stage, job.sources)
    _address_outputs(job, digest)
    produced = artifacts.produces(job.stage, job.config)
    for made in produced:  # a config file's name becomes part of its artifacts' names
        if not NAME.match(made["name"]):
            job.report.error("--config", f"{job.config_path.name}: its outputs would be published as {made['name']!r}; "
                                         "name the config file with letters, digits, '.', '_' and '-' only")
    settled = {"inputs": artifacts.job_inputs(job.stage, job.config, job.sources, profile, producers),
               "digest": digest, "artifacts_root": store.root, "grace_s": _grace(job)}
    for key, value in settled.items():
        job.flat[f"job.{key}"] = value
        job.config["job"][key] = value
    job.flat["job.produces"] = produced  # paths interpolated when the job dir is known (with_job)
    job.config["job"]["produces"] = [{**o, "path": artifacts.interpolate(o["path"], job.config)} for o in produced]


def _address_outputs(job: Job, digest: str) -> None:
    """job.outputs gets the config digest (or, for a stage whose outputs are an experiment's, that experiment's
    name): in the job's resolved values, and in the value `${job.outputs}` resolves from when the job dir is known."""
    old = job.flat["job.outputs"]
    new = f"{old}-{digest}"
    if job.stage.outputs_by:
        name = get(job.config, job.stage.outputs_by)
        if not isinstance(name, str) or not NAME.match(name):
            job.report.error(job.stage.outputs_by, "names the run's checkpoint directory: letters, digits, '.', '_' "
                                                   f"and '-' only, got {name!r} "
                                                   f"(set in {job.origin.get(job.stage.outputs_by)})")
            return
        new = f"{old.rsplit('/', 1)[0]}/{name}"
    job.flat["job.outputs"] = new

    def moved(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: moved(v) for k, v in node.items()}
        if isinstance(node, list):
            return [moved(v) for v in node]
        return new + node[len(old):] if isinstance(node, str) and (node == old or node.startswith(old + "/")) else node

    job.config.update(moved(job.config))


def _grace(job: Job) -> int | None:
    """Seconds before a Slurm job's time limit that its stage is signalled to save and stop (run.grace_s, else the
    stage's stop time); None where nothing signals it: another executor, a stage that cannot stop early, 0."""
    stop_time = job.stage.parts().stop_time
    grace = job.config["run"].get("grace_s")
    if "grace_s" not in executors.executor(job.executor).keys:
        return None
    if not stop_time:
        if grace:
            job.report.warn("run.grace_s", f"{job.stage.name} cannot stop early and go on in a later allocation, so "
                                           "no signal is sent; give it the time it needs (run.time)")
        return None
    return (stop_time(job.config)[0] if grace is None else grace) or None


def _artifact_store(job: Job) -> artifacts.Store:
    """The profile's store: env.toml's [artifacts] manifest.root, else beside the job dirs."""
    root = (job.profile.artifacts_root if job.profile else None) or \
        executors.executor(job.executor).artifacts_root(job)
    return artifacts.Store(root, ssh_of(job.config["run"]))


def _set_by_user(key: str, origin: dict[str, str]) -> bool:
    return any(src == CLI_SOURCE for k, src in origin.items() if k == key or k.startswith(key + "."))


def _job_shape(executor: str, flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """The job's GPUs per node (run.gpus_per_node) against what the machines have (cluster.*): on this
    machine those are the visible GPUs; a stage config without a count takes the cluster's."""
    here = executors.executor(executor).runs_here
    if here and flat.get("cluster.gpus_per_node") is None:
        flat["cluster.gpus_per_node"] = visible_gpu_count()
        origin["cluster.gpus_per_node"] = THIS_MACHINE
    have = flat.get("cluster.gpus_per_node")
    if flat.get("run.gpus_per_node") is None and have is not None:
        flat["run.gpus_per_node"] = have
        origin["run.gpus_per_node"] = origin["cluster.gpus_per_node"]
    wanted = flat.get("run.gpus_per_node")
    if not isinstance(wanted, int) or not isinstance(have, int) or wanted <= have:
        return
    if have == 0 and here:
        report.warn("run.gpus_per_node", f"no GPU visible on {THIS_MACHINE}; the checks assume the config's {wanted} "
                                         "GPU(s), and the job's preflight will stop without them")
    else:
        report.error("run.gpus_per_node", f"the job wants {wanted} GPUs per node but the nodes have {have} "
                                          f"(cluster.gpus_per_node, from {origin['cluster.gpus_per_node']}); set "
                                          f"run.gpus_per_node={have} and scale run.nodes, or pick another profile")


def changed_keys(job: Job) -> dict[str, str]:
    """Keys whose value does not come from the stage's default config, with their source."""
    return {k: src for k, src in job.origin.items() if src not in job.base_sources}

