"""What a training job starts from, settled at compile time so the dry run shows it:

* SFT's pretrained checkpoint: `recipe.pretrained_checkpoint`, or else the checkpoint directory of the
  latest COMPLETED pretrain job in the job registry (jobs on this machine or its local Slurm) that saved one;
* quantize's `bf16_checkpoint`, when unset: likewise, from the latest completed sft job, else pretrain;
* the model config: when `recipe.hf_model` is a local directory with config.json, our model keys must
  agree with it (through Megatron-Bridge's own HF -> Megatron key mapping).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from . import megatron_api
from .findings import Report

PRETRAINED = "recipe.pretrained_checkpoint"
# a Megatron-Bridge checkpoint directory holds one of these trackers of its latest iteration
TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")
# HF keys the NemotronH bridge copies under the same name, besides its CONFIG_MAPPING
SAME_NAME = ("mtp_hybrid_override_pattern", "moe_latent_size")


def fill_pretrained(flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """Set recipe.pretrained_checkpoint of an SFT job from the registry when the config leaves it unset
    (the data rules warn when there is none, and the job's preflight stops)."""
    if not flat.get("checkpoint.load"):
        fill_from_registry(flat, origin, report, PRETRAINED, ("pretrain",))


def fill_bf16_checkpoint(flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """Set quantize's bf16_checkpoint from the registry when the config leaves it unset (the validator
    reports when there is none)."""
    fill_from_registry(flat, origin, report, "bf16_checkpoint", ("sft", "pretrain"))


def fill_from_registry(flat: dict[str, Any], origin: dict[str, str], report: Report, key: str,
                       stages: tuple[str, ...]) -> None:
    """Set `key`, when unset, to the checkpoint directory of the latest completed job of the first of
    `stages` that has one."""
    if flat.get(key):
        return
    found = latest_checkpoint(stages)
    if found is None:
        return
    stage, job_id, path = found
    flat[key] = path
    origin[key] = f"job {job_id}"
    report.note(key, f"from the latest completed {stage} job {job_id}: {path}")


def latest_checkpoint(stages: tuple[str, ...]) -> tuple[str, str, str] | None:
    """(stage, job id, checkpoint dir) of the newest COMPLETED job that saved a checkpoint, of the first of
    `stages` that has one."""
    from . import jobs

    saved = []  # (record, checkpoint dir) of the jobs that saved one, newest first
    for r in jobs.all_records():
        path = _checkpoint_dir(Path(r.task_dir) / "code" / "config.yaml") if r.stage in stages and not r.ssh else None
        if path and any((Path(path) / t).is_file() for t in TRACKERS):
            saved.append((r, path))
    states = jobs.states([r for r, _ in saved]) if saved else {}  # the scheduler is asked about these only
    for stage in stages:
        for record, path in saved:
            if record.stage == stage and states.get(record.id) and states[record.id].state == "COMPLETED":
                return stage, record.id, path
    return None


def _checkpoint_dir(config: Path) -> str | None:
    try:
        save = (yaml.safe_load(config.read_text()).get("checkpoint") or {}).get("save")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return save if isinstance(save, str) else None


def check_hf_config(cfg: dict, report: Report) -> None:
    """Our model keys against the local HF config.json they will meet at run time."""
    hf_model = (cfg.get("recipe") or {}).get("hf_model")
    path = Path(str(hf_model)).expanduser() / "config.json" if hf_model else None
    if path is None or not path.is_file():
        return
    try:
        hf = json.loads(path.read_text())
    except ValueError as e:
        report.error("recipe.hf_model", f"{path} is not JSON ({e})")
        return
    model = cfg.get("model") or {}
    theirs = hf_model_keys(hf)
    for key, value in theirs.items():
        ours = model.get(key)
        if ours is not None and ours != value:
            report.error(f"model.{key}", f"{ours!r} disagrees with {path} ({value!r}); remove it from the config "
                                         f"or set it to {value!r}")
    report.note("recipe.hf_model", f"model keys checked against {path} ({len(theirs)} keys)")


def hf_model_keys(hf: dict) -> dict[str, Any]:
    """Our model keys of an HF NemotronH config.json, by Megatron-Bridge's mapping (the pattern from
    `hybrid_override_pattern` or transformers' `layers_block_type` list)."""
    hf = dict(hf)
    # transformers 5.x names Mamba layers linear_attention and attention layers full_attention
    symbols = {"mamba": "M", "linear_attention": "M", "moe": "E", "attention": "*", "full_attention": "*", "mlp": "-"}
    for key, pattern in (("layers_block_type", "hybrid_override_pattern"),
                         ("mtp_layers_block_type", "mtp_hybrid_override_pattern")):
        if isinstance(hf.get(key), list) and pattern not in hf:
            hf[pattern] = "".join(symbols.get(t, "?") for t in hf[key])
    if isinstance(hf.get("hybrid_override_pattern"), str):
        hf.setdefault("num_hidden_layers", len(hf["hybrid_override_pattern"]))
    out = {ours: hf[theirs] for theirs, ours in megatron_api.hf_config_mapping() if theirs in hf}
    out.update({key: hf[key] for key in SAME_NAME if key in hf})
    return out
