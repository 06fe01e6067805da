"""The config NeMo RL runs, built from an RL stage's keys once its inputs are known.

Our keys (the node layout, the inputs, judges, teachers, MTP, the step budget) become NeMo RL keys under
`nemo_rl`, the way NeMo RL's own Ultra launcher turns its environment variables into Hydra overrides; the
job merges `nemo_rl` into NeMo RL's YAML for `recipe` and hands NeMo RL that file. A `nemo_rl.*` key the user
sets is checked against the record of that YAML (ultra3.nemo_rl_api): unknown keys get a did-you-mean, and a
key the launcher derives must be set through the key it derives from. The Ray node groups (which nodes train,
generate, serve a teacher, run the Gym) go into `job.node_groups` for the job to label its Ray nodes.
"""

from __future__ import annotations

import shlex
from typing import Any

from . import executors, nemo_rl_api
from .artifacts import interpolate
from .dotted import get, put
from .job import OUTPUTS_PLACEHOLDER, Job
from .paths import JOB_DIR_PLACEHOLDER
from .config import flatten
from .nemo_rl_api import TEACHER_ROLES
from .model_math import slurm_seconds

# Where a judge's model and endpoint go in NeMo Gym's config (a recipe declares the judges it uses)
JUDGES = {
    "genrm": ("env.nemo_gym.genrm_model.responses_api_models.genrm_model", "genrm_model", "genrm_url"),
    "nl2bash": ("env.nemo_gym.nl2bash_judge_model.responses_api_models.local_vllm_model", "nl2bash_model",
                "nl2bash_url"),
    "safety": ("env.nemo_gym.safety_judge_model.responses_api_models.local_vllm_model", "safety_model", None),
}
TEACHER_CFG = "on_policy_distillation.non_colocated_teachers.default_teacher_cfg"
GROUPS = ("train", "generation", "teachers", "gym")  # the order of the nodes in the allocation


def is_mopd(recipe: str) -> bool:
    return "_teachers.general" in nemo_rl_api.keys(recipe)


def declared_judges(recipe: str) -> dict[str, tuple[str, str, str | None]]:
    return {name: spec for name, spec in JUDGES.items() if f"{spec[0]}.model" in nemo_rl_api.keys(recipe)}


def node_groups(cfg: dict[str, Any]) -> list[tuple[str, int]]:
    """(group, nodes) in allocation order; teachers: nodes_per_teacher for each distinct teacher checkpoint
    (NeMo RL serves each once, and gives training whatever else its cluster has)."""
    lay = cfg["layout"]
    pools = max(1, len(teacher_pools(cfg)))  # general's at least, set or not
    teachers = pools * (lay.get("nodes_per_teacher") or 0) if is_mopd(cfg["recipe"]) else 0
    gen = 0 if lay.get("colocated") else lay.get("generation_nodes") or 0
    sizes = {"train": lay.get("train_nodes") or 0, "generation": gen, "teachers": teachers,
             "gym": lay.get("gym_nodes") or 0}
    return [(g, sizes[g]) for g in GROUPS if sizes[g]]


def layout_keys(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The keys node_groups() sizes the groups from, for findings that quote the node accounting."""
    lay = cfg["layout"]
    keys = ["layout.train_nodes", "layout.colocated" if lay.get("colocated") else "layout.generation_nodes"]
    if is_mopd(cfg["recipe"]):
        keys += ["layout.nodes_per_teacher",
                 *(f"teachers.{role}" for role in TEACHER_ROLES if (cfg.get("teachers") or {}).get(role))]
    return (*keys, "layout.gym_nodes")


def teacher_pools(cfg: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The distinct teacher checkpoints, general's first, each with the roles it serves (a role without its own
    falls back to general's): NeMo RL serves one copy of each."""
    teachers = cfg.get("teachers") or {}
    pools: dict[str, list[str]] = {}
    for role in TEACHER_ROLES:
        if path := teachers.get(role) or teachers.get("general"):
            pools.setdefault(str(path), []).append(role)
    return list(pools.items())


def derived(cfg: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(NeMo RL key, value, our key it comes from): what the launcher sets in NeMo RL's config."""
    recipe, lay, run = cfg["recipe"], cfg["layout"], cfg["run"]
    sizes = dict(node_groups(cfg))
    gpus = run.get("gpus_per_node")
    out: list[tuple[str, Any, str]] = [
        ("cluster.gpus_per_node", gpus, "run.gpus_per_node"),
        ("cluster.num_nodes", sum(n for g, n in sizes.items() if g != "gym"), "layout"),
        ("cluster.segment_size", lay.get("segment_nodes"), "layout.segment_nodes"),
        ("policy.generation.colocated.enabled", bool(lay.get("colocated")), "layout.colocated"),
        ("env.nemo_gym.num_gpu_nodes", sizes.get("gym", 0), "layout.gym_nodes"),
        ("policy.model_name", cfg.get("policy"), "policy"),
        ("checkpointing.checkpoint_dir", "${job.outputs}/checkpoints", "experiment"),
        ("logger.log_dir", "${job.dir}/logs", "job.dir"),
        ("env.nemo_gym.nemo_gym_log_dir", "${job.dir}/logs/nemo_gym", "job.dir"),
        ("logger.wandb_enabled", False, "wandb (on in the job when WANDB_API_KEY reaches it)"),
        ("logger.wandb.project", (cfg.get("wandb") or {}).get("project"), "wandb.project"),
        ("logger.wandb.name", cfg.get("experiment"), "experiment"),
    ]
    if not lay.get("colocated"):
        out += [("policy.generation.colocated.resources.num_nodes", sizes.get("generation", 0),
                 "layout.generation_nodes"),
                ("policy.generation.colocated.resources.gpus_per_node", gpus, "run.gpus_per_node")]
    data = cfg.get("data") or {}
    for split, file in (("train", "train.jsonl"), ("validation", "val.jsonl")):
        path = f"{data.get('dir')}/{data.get('blend')}/{file}" if data.get("dir") and data.get("blend") else None
        out.append((f"data.{split}.data_path", path, "data.dir"))
    if cfg.get("max_steps") is not None:
        out.append(("grpo.max_num_steps", cfg["max_steps"], "max_steps"))
    if save_by := save_deadline(str(run.get("time") or "")):
        out.append(("checkpointing.checkpoint_must_save_by", save_by, "run.time"))
    judges = cfg.get("judges") or {}
    for prefix, model_key, url_key in declared_judges(recipe).values():
        if url_key and judges.get(url_key):
            out.append((f"{prefix}.base_url", judges[url_key], f"judges.{url_key}"))
        if judges.get(model_key):
            out.append((f"{prefix}.model", judges[model_key], f"judges.{model_key}"))
    if cfg.get("sif_dir"):
        out.append(("sif_dir", cfg["sif_dir"], "sif_dir"))
    mtp = cfg.get("mtp") or {}
    if mtp.get("enabled"):
        kw = "policy.generation.vllm_kwargs"
        out += [("policy.generation.vllm_cfg.enable_prefix_caching", True, "mtp.enabled"),
                (f"{kw}.enable_chunked_prefill", True, "mtp.enabled"),
                (f"{kw}.max_num_batched_tokens", mtp.get("max_num_batched"), "mtp.max_num_batched"),
                (f"{kw}.mamba_cache_mode", "align", "mtp.enabled"),
                (f"{kw}.compilation_config.cudagraph_capture_sizes", None, "mtp.enabled"),
                (f"{kw}.speculative_config.method", "mtp", "mtp.enabled"),
                (f"{kw}.speculative_config.num_speculative_tokens", mtp.get("num_speculative"), "mtp.num_speculative")]
    if is_mopd(recipe):
        teachers = cfg.get("teachers") or {}
        out += [(f"_teachers.{role}", teachers[role], f"teachers.{role}")
                for role in TEACHER_ROLES if teachers.get(role)]
        out += [(f"{TEACHER_CFG}.num_nodes", lay.get("nodes_per_teacher"), "layout.nodes_per_teacher"),
                (f"{TEACHER_CFG}.gpus_per_node", gpus, "run.gpus_per_node")]
    return out


SAVE_MARGIN_S = 25 * 60  # NeMo RL's Ultra recipes save and stop 25 minutes before a 48 h allocation ends


def save_deadline(time_limit: str) -> str | None:
    """NeMo RL's checkpoint_must_save_by (DD:HH:MM:SS since the start) for a Slurm time limit: a final save
    and a clean stop before Slurm ends the job (a tenth of the time for allocations under 4 h 10 min)."""
    total = slurm_seconds(time_limit)
    if not total:
        return None
    left = total - min(SAVE_MARGIN_S, total // 10)
    return f"{left // 86400:02d}:{left % 86400 // 3600:02d}:{left % 3600 // 60:02d}:{left % 60:02d}"


def sandbox_sidecar(cfg: dict[str, Any]) -> str | None:
    """The batch-script line that starts NeMo Skills' sandbox on every node of the allocation, beside the job
    step (as NeMo RL's ray.sub does); the cluster preflight waits for its port on each node."""
    box = cfg.get("sandbox") or {}
    if not box.get("image"):
        return None
    argv = ["srun", "--overlap", "--nodes=$SLURM_JOB_NUM_NODES", "--ntasks-per-node=1",
            f"--container-image={box['image']}", "--no-container-mount-home",
            f"--output={JOB_DIR_PLACEHOLDER}/sandbox-%t.log", f"--export=ALL,NGINX_PORT={int(box.get('port') or 6000)}",
            *shlex.split(str(box.get("command") or ""))]
    return " ".join(a if a.startswith(("--nodes=", "--output=")) else shlex.quote(a) for a in argv) + " &"


def settle(job: Job) -> None:
    """Check the user's `nemo_rl.*` keys against the record, then derive NeMo RL's keys, run.nodes and the
    node groups into the job (its flat values, resolved config and origins)."""
    cfg, report = job.config, job.report
    recipe = cfg.get("recipe")
    if recipe not in nemo_rl_api.names():
        report.error("recipe", f"{recipe!r} is not one of NeMo RL's Ultra configs at {nemo_rl_api.commit()[:12]} "
                               f"({', '.join(nemo_rl_api.names())}) (set in {job.origin.get('recipe')})"
                     + ("; pick a teacher with -c ifbench|rlhf|reasoning|swe" if recipe is None else ""))
        return
    ours = derived(cfg)
    derived_from = {key: source for key, _, source in ours}
    for key, value in flatten(cfg.get("nemo_rl") or {}).items():
        where = f" (set in {job.origin.get('nemo_rl.' + key)})"
        if key in derived_from:
            report.error(f"nemo_rl.{key}", f"is set by the launcher from {derived_from[key]}{where}; set that instead")
        elif not nemo_rl_api.known(recipe, key):
            report.error(f"nemo_rl.{key}", f"not a key of NeMo RL's {nemo_rl_api.yaml_path(recipe)} at "
                                           f"{nemo_rl_api.commit()[:12]}{where}{nemo_rl_api.suggest(recipe, key)}")
        elif clash := nemo_rl_api.type_clash(recipe, key, value):
            report.error(f"nemo_rl.{key}", f"{clash}{where}")
    for key, value in flatten(cfg.get("nemo_rl_add") or {}).items():  # into nemo_rl, which the job merges
        if nemo_rl_api.known(recipe, key):
            report.error(f"nemo_rl_add.{key}", f"is a key of NeMo RL's {nemo_rl_api.yaml_path(recipe)}: set it as "
                                               f"nemo_rl.{key} (checked) instead")
        else:
            report.warn(f"nemo_rl_add.{key}", f"not in NeMo RL's {nemo_rl_api.yaml_path(recipe)}: added unchecked")
            _set(job, f"nemo_rl.{key}", value, f"nemo_rl_add.{key}")
    for key, value, source in ours:
        _set(job, f"nemo_rl.{key}", value, f"derived from {source}")
    sizes = node_groups(cfg)
    total = sum(n for _, n in sizes)
    given, where = cfg["run"].get("nodes"), job.origin.get("run.nodes")
    if where == "command line" and given != total:
        report.error("run.nodes", f"{given} (set in command line), but the layout adds up to {total} nodes "
                                  f"({describe(sizes)}); change layout.* instead", quoting=layout_keys(cfg))
    elif where and given not in (None, total):
        report.note("run.nodes", f"{given} (set in {where}) gives way to the layout's {total} ({describe(sizes)})")
    _set(job, "run.nodes", total, f"layout: {describe(sizes)}")
    _set(job, "job.node_groups", [[g, n] for g, n in sizes], "layout")
    _set(job, "job.nemo_rl", nemo_rl_api.files(), "src/ultra3/nemo_rl_api/record.json")
    segment = cfg["layout"].get("segment_nodes") or 0
    if segment > 1:
        _set(job, "run.segment", segment, "layout.segment_nodes")
    if line := sandbox_sidecar(cfg):
        _set(job, "run.setup", [*(cfg["run"].get("setup") or []), line], "sandbox.image")
    if not cfg["run"].get("host"):  # where the experiment's checkpoints are, for the dry run to read
        folder = executors.executor(job.executor).job_dir(job, "job-id")
        report.facts["rl.checkpoints"] = Job.placed(
            f"{OUTPUTS_PLACEHOLDER}/{job.stage.slug}/{cfg.get('experiment')}/checkpoints", folder)
    if cfg.get("check_only"):  # the allocation and the Ray cluster only: no NeMo RL, no output
        # over several nodes the cluster preflight checks each node's GPUs as the allocation grants them; on one
        # node (every local run) no Ray cluster is checked, so the preflight's GPU check stays
        skipped = ("nemo_rl", "gpus") if total > 1 else ("nemo_rl",)
        _set(job, "job.checks", [c for c in job.stage.checks if c not in skipped], "check_only")
        _set(job, "output_dir", None, "check_only")


def _set(job: Job, key: str, value: Any, origin: str) -> None:
    job.flat[key] = value
    job.origin[key] = origin
    put(job.config, key, interpolate(value, job.config) if isinstance(value, str) else value)


def describe(sizes: list[tuple[str, int]]) -> str:
    return " + ".join(f"{n} {g}" for g, n in sizes) or "no nodes"


def materialize(cfg: dict[str, Any]) -> dict[str, Any]:
    """NeMo RL's recorded YAML for the recipe with `nemo_rl` merged in: what the job hands NeMo RL (long
    prompts shown by their length)."""
    tree = nemo_rl_api.tree(cfg["recipe"])
    for key, value in flatten(cfg.get("nemo_rl") or {}).items():
        put(tree, key, value)
    return tree


def effective(cfg: dict[str, Any], key: str) -> Any:
    """A NeMo RL key's value in the job: ours, else the recorded one."""
    ours = get(cfg.get("nemo_rl") or {}, key)
    return ours if ours is not None else nemo_rl_api.keys(cfg["recipe"]).get(key)
