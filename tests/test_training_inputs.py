"""What a training job starts from, through the real CLI: SFT's pretrained checkpoint taken from the job
registry, the model keys checked against a local HF config.json, and the in-job preflight of SFT."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from ultra3 import records
from ultra3.training_inputs import hf_model_keys

from recipes import preflight


def completed_pretrain_job(home, tmp_path, job_id: str, tracker: bool = True, stage: str = "pretrain") -> str:
    """A finished local training job as the launcher leaves it: registry record, config, exit code, checkpoint.
    Submitted at the time in its id (ultra3-<stage>_YYYYMMDD-HHMMSS-<hex>), so ids order the registry."""
    job_dir = tmp_path / job_id
    code = job_dir / stage / "code"
    code.mkdir(parents=True)
    ckpt = job_dir / "checkpoints"
    ckpt.mkdir()
    if tracker:
        (ckpt / "latest_train_state.pt").write_bytes(b"\0")
    (code / "config.yaml").write_text(f"checkpoint:\n  save: {ckpt}\n")
    (job_dir / stage / "exit_code").write_text("0\n")
    records.save(records.JobRecord(id=job_id, stage=stage, config="tiny", executor="local", mode="local",
                             submitted=submitted_at(job_id), job_dir=str(job_dir), task=stage, log_glob="*.log"))
    return str(ckpt)


def submitted_at(job_id: str) -> float:
    stamp = job_id.split("_", 1)[1].rsplit("-", 1)[0]
    return datetime.strptime(stamp, "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc).timestamp()


def test_sft_starts_from_the_latest_completed_pretrain_checkpoint(cli, home, tmp_path):
    r = cli("sft", "-c", "tiny", "--dry-run")
    assert r.rc == 0 and "  pretrained_checkpoint: null" in r.out  # none yet: the preflight will stop
    older = completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260101-000000-aaaaaa")
    completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260102-000000-bbbbbb", tracker=False)  # saved none
    r = cli("sft", "-c", "tiny", "--dry-run")
    assert r.rc == 0, r.err
    assert f"note: recipe.pretrained_checkpoint: from the latest completed pretrain job " \
           f"ultra3-pretrain_20260101-000000-aaaaaa: {older}" in r.out
    assert re.search(rf"^recipe.pretrained_checkpoint +\= {re.escape(older)}  <- job ultra3-pretrain_20260101-000000-aaaaaa$",
                     r.out, re.MULTILINE)
    given = cli("sft", "-c", "tiny", "--dry-run", "recipe.pretrained_checkpoint=/ckpt/mine")
    assert "from the latest completed" not in given.out and "  pretrained_checkpoint: /ckpt/mine" in given.out


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


def test_preflight_stops_sft_without_a_checkpoint():
    cfg = {"job": {"stage": "sft", "launch": "process"}, "dataset": {"mock": True}, "recipe": {}}
    reason = "recipe.pretrained_checkpoint is not set: SFT starts from a pretrain checkpoint " \
             "(Megatron-Bridge's finetune needs one)"
    assert preflight.run(cfg) == [reason]
    assert preflight.run({**cfg, "checkpoint": {"load": "/resume/here"}}) == []


def test_layer_pattern_of_a_config_written_by_transformers():
    """transformers 5.x writes the pattern as layers_block_type (linear_attention = Mamba, full_attention)."""
    from transformers import NemotronHConfig

    hf = NemotronHConfig(hybrid_override_pattern="MEM*EME", num_hidden_layers=7).to_dict()
    assert "linear_attention" in hf["layers_block_type"] and "full_attention" in hf["layers_block_type"]
    hf.pop("hybrid_override_pattern", None)
    assert hf_model_keys(hf)["hybrid_layer_pattern"] == "MEM*EME"
