"""What a training job starts from, through the real CLI: SFT's pretrained checkpoint taken from the artifact
store (newest, a pinned version, a job's), and the model keys checked against a local HF config.json."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
import yaml

from recipes.contract import artifact_name
from recipes.publish import record_outputs
from ultra3 import records
from ultra3.paths import nemorun_home
from ultra3.training_inputs import hf_model_keys


def completed_pretrain_job(home, tmp_path, job_id: str, tracker: bool = True, stage: str = "pretrain") -> str:
    """A finished local training job as the launcher and the job leave it: registry record, config, exit code,
    checkpoint, and (when it saved one) the checkpoint published in the artifact store by the runtime's own
    `record_outputs`, as recipes/launch.py does when the stage exits 0."""
    job_dir = tmp_path / job_id
    code = job_dir / stage / "code"
    code.mkdir(parents=True)
    ckpt = job_dir / "checkpoints"
    ckpt.mkdir()
    kind = f"{stage}-checkpoint"
    job = {"id": job_id, "stage": stage, "config": "tiny", "profile": None, "dir": str(job_dir), "digest": job_id,
           "artifacts_root": str(nemorun_home() / "artifacts"), "inputs": [],
           "produces": [{"name": artifact_name(kind, "tiny"), "kind": kind, "path": str(ckpt)}]}
    (code / "config.yaml").write_text(yaml.safe_dump({"checkpoint": {"save": str(ckpt)}, "job": job}))
    (job_dir / stage / "exit_code").write_text("0\n")
    if tracker:
        (ckpt / "latest_checkpointed_iteration.txt").write_text("40")
        record_outputs({"job": job}, 12.5)
    records.save(records.JobRecord(id=job_id, stage=stage, config="tiny", executor="local", mode="local",
                                   submitted=submitted_at(job_id), job_dir=str(job_dir), task=stage,
                                   log_glob="*.log"))
    return str(ckpt)


def submitted_at(job_id: str) -> float:
    stamp = job_id.split("_", 1)[1].rsplit("-", 1)[0]
    return datetime.strptime(stamp, "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc).timestamp()


def provenance(key: str, path: str, job_id: str, artifact: str) -> re.Pattern:
    """The dry run's line for an input taken from the artifact store."""
    return re.compile(rf"^{re.escape(key)} = {re.escape(path)}  \(from {job_id} completed \d{{4}}-\d\d-\d\d "
                      rf"\d\d:\d\d, {re.escape(artifact)}\)$", re.M)


def test_sft_starts_from_the_latest_completed_pretrain_checkpoint(cli, home, tmp_path):
    r = cli("sft", "-c", "tiny", "--dry-run", "--full")  # none yet: the tiny SFT starts from random weights
    assert r.rc == 0 and "warning: recipe.pretrained_checkpoint: no pretrain-checkpoint artifact for this machine: " \
        "sft starts without its checkpoint input (recipe.allow_random_init is set); run `ultra3 pretrain -c tiny` " \
        "first to start from one" in r.out.splitlines(), r.out
    assert "recipe.pretrained_checkpoint: not needed (none yet, optional: recipe.allow_random_init is set)" in r.out
    full = cli("sft", "--dry-run", "--full", "dataset.mock=true")  # the full SFT needs its checkpoint
    assert full.rc == 2 and "run `ultra3 pretrain` first" in full.err, full.err
    older = completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260101-000000-aaaaaa")
    completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260102-000000-bbbbbb", tracker=False)  # saved none
    r = cli("sft", "-c", "tiny", "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert provenance("recipe.pretrained_checkpoint", older, "ultra3-pretrain_20260101-000000-aaaaaa",
                      "ultra3-pretrain-checkpoint-tiny:v1").search(r.out), r.out
    assert re.search(rf"^recipe.pretrained_checkpoint +\= {re.escape(older)}  <- from "
                     r"ultra3-pretrain_20260101-000000-aaaaaa completed ", r.out, re.MULTILINE)
    newer = completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260103-000000-cccccc")
    assert provenance("recipe.pretrained_checkpoint", newer, "ultra3-pretrain_20260103-000000-cccccc",
                      "ultra3-pretrain-checkpoint-tiny:v2").search(cli("sft", "-c", "tiny", "--dry-run", "--full").out)
    pinned = cli("sft", "-c", "tiny", "--dry-run", "--full",
                 "recipe.pretrained_checkpoint=ultra3-pretrain-checkpoint-tiny:v1")
    assert provenance("recipe.pretrained_checkpoint", older, "ultra3-pretrain_20260101-000000-aaaaaa",
                      "ultra3-pretrain-checkpoint-tiny:v1").search(pinned.out), pinned.err
    by_job = cli("sft", "-c", "tiny", "--dry-run", "--full", "recipe.pretrained_checkpoint=job:20260101-000000-aaaaaa")
    assert f"recipe.pretrained_checkpoint = {older}  (from ultra3-pretrain_20260101-000000-aaaaaa" in by_job.out
    two = cli("sft", "-c", "tiny", "--dry-run", "--full", "recipe.pretrained_checkpoint=job:ultra3-pretrain_2026010")
    assert two.rc == 2 and "error: recipe.pretrained_checkpoint: job:ultra3-pretrain_2026010: matches 2 jobs " \
                           "(ultra3-pretrain_20260101-000000-aaaaaa, ultra3-pretrain_20260103-000000-cccccc); give " \
                           "more of the id (set in command line)" in two.err_lines, two.err
    kind = cli("sft", "-c", "tiny", "--dry-run", "--full", "dataset.mock=false",
               "dataset.packed_dir=ultra3-pretrain-checkpoint-tiny:v1")
    assert kind.rc == 2 and "error: dataset.packed_dir: ultra3-pretrain-checkpoint-tiny:v1 is a pretrain-checkpoint, " \
                            "but this input takes sft-data (set in command line)" in kind.err_lines, kind.err
    bad = cli("sft", "-c", "tiny", "--dry-run", "recipe.pretrained_checkpoint=ultra3-pretrain-checkpoint-tiny:v9")
    assert bad.rc == 2 and "error: recipe.pretrained_checkpoint: ultra3-pretrain-checkpoint-tiny:v9: no " \
                           "pretrain-checkpoint artifact of that name and version" in bad.err
    given = cli("sft", "-c", "tiny", "--dry-run", "--full", f"recipe.pretrained_checkpoint={tmp_path}")
    assert "completed" not in given.out.split("== compiled config ==")[0] and f"  pretrained_checkpoint: {tmp_path}" \
        in given.out


def test_a_reference_to_another_profiles_artifact_says_whose_it_is(cli, home, tmp_path):
    """NAME:latest and job:ID look in the whole store: an artifact made for another profile (here: this machine's,
    taken by a Slurm profile whose store is the same) is taken, and its provenance line says whose it is."""
    ckpt = completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260101-000000-aaaaaa")
    for ref in ("ultra3-pretrain-checkpoint-tiny:latest", "job:ultra3-pretrain_20260101-000000-aaaaaa"):
        theirs = cli("sft", "-c", "tiny", "--batch", "ci", "--dry-run", f"recipe.pretrained_checkpoint={ref}")
        assert re.search(rf"^recipe.pretrained_checkpoint = {re.escape(ckpt)}  \(from ultra3-pretrain_20260101-000000-"
                         r"aaaaaa completed [\d: -]+, made for this machine, ultra3-pretrain-checkpoint-tiny:v1\)$",
                         theirs.out, re.M), theirs.out + theirs.err
    mine = cli("sft", "-c", "tiny", "--dry-run", "recipe.pretrained_checkpoint=ultra3-pretrain-checkpoint-tiny:latest")
    assert provenance("recipe.pretrained_checkpoint", ckpt, "ultra3-pretrain_20260101-000000-aaaaaa",
                      "ultra3-pretrain-checkpoint-tiny:v1").search(mine.out), mine.out  # its own: nothing added


def test_dry_run_checks_model_keys_against_a_local_hf_config(cli, home, tmp_path):
    model = tmp_path / "ultra-hf"
    model.mkdir()
    hf = {"hidden_size": 8192, "num_attention_heads": 64, "n_routed_experts": 512, "num_experts_per_tok": 22,
          "moe_latent_size": 2048, "num_nextn_predict_layers": 2, "layers_block_type": ["mamba", "moe"] * 54}
    (model / "config.json").write_text(json.dumps(hf))
    args = ["pretrain", "--batch", "blackwell", "--dry-run", "dataset.mock=true", f"recipe.hf_model={model}"]
    ok = cli(*args)
    assert ok.rc == 0, ok.err
    assert f"note: recipe.hf_model: model keys checked against {model}/config.json (8 keys)" in ok.out
    bad = cli(*args, "model.hidden_size=4096", "model.moe_router_topk=8")
    assert bad.rc == 2
    assert f"error: model.hidden_size: 4096 disagrees with {model}/config.json (8192); remove it from the config " \
           "or set it to 8192" in bad.err_lines
    assert any(line.startswith("error: model.moe_router_topk: 8 disagrees") for line in bad.err_lines)


@pytest.mark.heavy  # imports transformers (5 s)
def test_layer_pattern_of_a_config_written_by_transformers():
    """transformers 5.x writes the pattern as layers_block_type (linear_attention = Mamba, full_attention)."""
    from transformers import NemotronHConfig

    hf = NemotronHConfig(hybrid_override_pattern="MEM*EME", num_hidden_layers=7).to_dict()
    assert "linear_attention" in hf["layers_block_type"] and "full_attention" in hf["layers_block_type"]
    hf.pop("hybrid_override_pattern", None)
    assert hf_model_keys(hf)["hybrid_layer_pattern"] == "MEM*EME"
