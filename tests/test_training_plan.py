"""The training runtime's mapping onto Megatron-Bridge 0.6.x, checked against the record of the released API
(src/ultra3/megatron_api/record.json, read from the wheels' source): every key we hand its override helper
exists with a compatible type, every function, keyword and class the runtime uses exists, and the override
dotlist of each shipped config matches its golden file (tests/golden/overrides-*.txt)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import inputs
from ultra3 import megatron_api, schema
from ultra3.compile import compile_job
from ultra3.job import Options
from ultra3.paths import RECIPES_DIR, config_names

REPO = Path(__file__).resolve().parents[1]
from ultra3.stages import STAGES
from ultra3.training_inputs import hf_model_keys

from recipes.training import hf_config, plan

GOLDEN = Path(__file__).parent / "golden"
TRAINING = [s for s in STAGES if s.name in ("pretrain", "sft")]
CASES = [(s, c) for s in TRAINING for c in config_names(s.config_dir)]
JOB = {"id": "ultra3-job_20260101-000000-abcdef", "dir": "/jobs/ultra3-stage/ultra3-job_20260101-000000-abcdef"}


def job_config(home, stage, config: str, *overrides: str) -> dict:
    job = compile_job(stage, Options(config=config, batch="blackwell", overrides=[*inputs(stage.name, config),
                                                                                   *overrides]))
    return job.with_job(JOB)


def record_class(target: str) -> str:
    name = target.rpartition(".")[2]
    assert name in megatron_api.record()["classes"], f"{target} is not a recorded Megatron-Bridge class"
    return name


def dataset_class(cfg: dict) -> str:
    built = plan.make_plan(cfg).dataset
    return record_class(built.target) if built else megatron_api.section_class("dataset")


def check_key(cfg: dict, key: str, value) -> None:
    """`section.key[.sub]`: the key exists on the recorded class and the value has its type."""
    section, *path = key.split(".")
    if section == "env_vars":
        assert megatron_api.section_class("env_vars") == "dict"
        return
    node = megatron_api.section_schema(dataset_class(cfg) if section == "dataset" else
                                       megatron_api.section_class(section))
    for part in path[:-1]:
        assert isinstance(node.get(part), dict), f"{key}: {part} is not a recorded config class"
        node = node[part]
    assert path[-1] in node, f"{key} is not a field of Megatron-Bridge {megatron_api.versions()}"
    assert schema.matches(value, node[path[-1]]), f"{key}={value!r}: not {schema.type_name(node[path[-1]])}"


@pytest.mark.parametrize("stage,config", CASES, ids=[f"{s.name}-{c}" for s, c in CASES])
def test_every_override_is_a_megatron_bridge_key_of_its_type(home, stage, config):
    cfg = job_config(home, stage, config)
    values = plan.override_values(cfg)
    assert any(k.startswith("model.") for k in values) and any(k.startswith("train.") for k in values)
    for key, value in values.items():
        check_key(cfg, key, value)


@pytest.mark.parametrize("stage,config", CASES, ids=[f"{s.name}-{c}" for s, c in CASES])
def test_override_list_matches_golden(home, stage, config):
    overrides = plan.make_plan(job_config(home, stage, config)).overrides
    golden = GOLDEN / f"overrides-{stage.name}-{config}.txt"
    text = "\n".join(overrides) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.read_text() == text


def test_a_misspelt_override_fails_the_record_check(home):
    cfg = job_config(home, STAGES[0], "tiny")
    check_key(cfg, "train.train_iters", 40)
    with pytest.raises(AssertionError, match="train.train_iter is not a field"):
        check_key(cfg, "train.train_iter", 40)
    with pytest.raises(AssertionError, match="not an integer"):
        check_key(cfg, "train.train_iters", "forty")


def test_data_and_checkpoint_wiring(home):
    pretrain, sft = TRAINING
    p = plan.make_plan(job_config(home, pretrain, "default"))
    assert p.blend_path == "/lustre/data/blend.json" and p.dataset is None
    # every submission of this config saves to and resumes from the same place, named by its digest
    assert any(re.fullmatch(r"checkpoint.load='/jobs/outputs/ultra3-pretrain/default-[0-9a-f]{16}/checkpoints'", o)
               for o in p.overrides), p.overrides
    assert not any(o.startswith(("logger.wandb", "dataset.blend_path")) for o in p.overrides)
    mock = plan.make_plan(job_config(home, pretrain, "tiny"))
    assert mock.blend_path is None and "dataset.mock=true" in mock.overrides and mock.model_source == "keys"

    s = plan.make_plan(job_config(home, sft, "default"))
    specs = s.dataset.kwargs["offline_packing_specs"]
    assert s.dataset.kwargs["dataset_root"] == "/lustre/data/sft" and s.dataset.kwargs["seq_length"] == 294912
    assert specs.kwargs["packed_train_data_path"] == "/lustre/data/sft/train"
    assert specs.kwargs["pad_seq_to_mult"] == 16  # 2 x CP8
    assert "checkpoint.pretrained_checkpoint='/lustre/ckpt/pretrain'" in s.overrides
    assert s.model_source == "hub" and s.hf_model == "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"

    wandb = plan.make_plan(job_config(home, pretrain, "tiny", "logger.wandb_project=ultra3"))
    assert f"logger.wandb_exp_name='{JOB['id']}'" in wandb.overrides

    # saving off (smoke): the recipe's async save needs a directory, and its default load dir is not ours
    smoke = plan.make_plan(job_config(home, pretrain, "smoke"))
    assert {"checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"} <= set(smoke.overrides)


def test_mock_sft_dataset_leaves_mock_to_megatron_core(home):
    """Megatron-Core's `mock` is not a constructor argument (field(init=False)): no blend makes the data mock."""
    built = plan.make_plan(job_config(home, TRAINING[1], "tiny")).dataset
    assert built.target == plan.GPT_DATASET and "mock" not in built.kwargs
    assert built.kwargs["blend"] is None and built.kwargs["blend_per_split"] is None


def test_built_objects_use_recorded_keywords(home):
    sft = TRAINING[1]
    for config, extra in (("default", ()), ("tiny", ()), ("tiny", ("dataset.mock=false", "dataset.packed_dir=/d"))):
        built = plan.make_plan(job_config(home, sft, config, *extra)).dataset
        _check_build(built)


def _check_build(built: plan.Build) -> None:
    fields = megatron_api.class_fields(record_class(built.target))
    for key, value in built.kwargs.items():
        assert key in fields, f"{built.target} has no field {key}"
        if isinstance(value, plan.Build):
            assert fields[key] == record_class(value.target)
            _check_build(value)


def test_runtime_calls_match_the_recorded_signatures():
    """Every `resolve(NAME)(...)` call in runtime.py: NAME is a recorded function taking those arguments."""
    tree = ast.parse((RECIPES_DIR / "training" / "runtime.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Call)
             and getattr(n.func.func, "id", "") == "resolve"]
    assert len(calls) >= 4
    per_stage = {"recipe": plan.RECIPES, "entry": plan.ENTRY_POINTS}
    for call in calls:
        arg = call.func.args[0]
        if isinstance(arg, ast.Attribute) and arg.attr == "target":
            continue  # a Build: test_built_objects_use_recorded_keywords
        names = [getattr(plan, arg.id)] if isinstance(arg, ast.Name) else list(per_stage[arg.attr].values())
        for name in names:
            sig = megatron_api.signature(name)
            assert len(call.args) <= len(sig["params"]) or sig["varargs"], name
            for kw in call.keywords:
                assert megatron_api.accepts(name, kw.arg), f"{name} takes no keyword {kw.arg}"
    for recipe in plan.RECIPES.values():  # called with no arguments, as 0.6.x requires
        assert megatron_api.signature(recipe)["params"] == []
    assert megatron_api.constant(plan.HF_MODEL_ID) == "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"


def test_tiny_model_config_goes_through_the_bridge_mapping(home):
    cfg = job_config(home, STAGES[0], "tiny")
    mapping = set(megatron_api.hf_config_mapping())
    for hf, ours in hf_config.HF_KEYS.items():
        assert (hf, ours) in mapping or hf == ours, f"the NemotronH bridge does not map {hf} to {ours}"
    written = hf_config.hf_config(cfg["model"])
    assert written["hybrid_override_pattern"] == "MEM*EME" and written["mtp_hybrid_override_pattern"] == "*E"
    back = hf_model_keys(written)
    assert back == {k: cfg["model"][k] for k in back if k != "mtp_hybrid_override_pattern"} | \
        {"mtp_hybrid_override_pattern": "*E"}
    assert {"num_layers", "hidden_size", "moe_latent_size", "mtp_num_layers", "num_moe_experts"} <= set(back)


@pytest.mark.parametrize(("config", "save"), [
    ("default", "/r/experiments/outputs/ultra3-pretrain/default-{digest}/checkpoints"),  # every submission resumes here
    ("tiny", "/r/experiments/ultra3-pretrain/{job}/checkpoints"),  # a smoke test starts afresh
])
def test_checkpoint_dir_is_shared_by_resubmissions_of_a_real_run(home, config, save):
    stage = next(s for s in TRAINING if s.name == "pretrain")
    job = compile_job(stage, Options(config=config, batch="blackwell", overrides=inputs("pretrain", config)))
    again = compile_job(stage, Options(config=config, batch="blackwell", overrides=inputs("pretrain", config)))
    changed = compile_job(stage, Options(config=config, batch="blackwell",
                                         overrides=[*inputs("pretrain", config), "optimizer.lr=1e-4"]))
    assert again.digest == job.digest != changed.digest  # a changed config never resumes the old run's checkpoints
    save = save.replace("{digest}", job.digest)
    for job_id in ("job1", "job2"):
        cfg = job.with_job({"id": job_id, "dir": f"/r/experiments/ultra3-pretrain/{job_id}"})
        assert cfg["checkpoint"]["save"] == save.format(job=job_id)
        # resume from the latest checkpoint there
        assert plan.override_values(cfg)["checkpoint.load"] == save.format(job=job_id)


@pytest.mark.parametrize("stage,config,message", [
    ("sft", {"job": {"stage": "sft"}, "dataset": {"mock": False}, "model": {}},
     "ultra3 sft: error: dataset.packed_dir is not set: give the output dir of `ultra3 data prep sft`, or "
     "dataset.mock=true"),
    ("sft", {"job": {"stage": "sft"}, "dataset": {"mock": False, "packed_dir": "/nonexistent/sft"}, "model": {}},
     "ultra3 sft: error: dataset.packed_dir /nonexistent/sft has no train/ directory; give the output dir of "
     "`ultra3 data prep sft`"),
    ("pretrain", {"job": {"stage": "pretrain"}, "dataset": {"blend_path": "/nonexistent/blend.json"}, "model": {}},
     "ultra3 pretrain: error: dataset.blend_path /nonexistent/blend.json is not a file; give the blend.json that "
     "`ultra3 data prep pretrain` wrote"),
    ("pretrain", {"job": {"stage": "sft"}}, "is a sft config, not pretrain; run it with its own stage"),
])
def test_the_training_runtime_refuses_bad_input_in_one_line(tmp_path, stage, config, message):
    """Before any Megatron import: exit 2 and one `<prog>: error:` line, as every runtime."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    p = subprocess.run([sys.executable, "-m", f"recipes.{stage}", "--config", str(path)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and message in p.stderr, p.stderr


def test_ranks_waiting_for_rank_0s_export_stop_when_it_fails_or_the_wait_ends(tmp_path, monkeypatch):
    """Rank 0 exports a Megatron checkpoint to HF once; the other ranks never wait forever."""
    from recipes.quantization import megatron_export
    from recipes.quantization.errors import QuantizeError

    dest, failed = str(tmp_path / "hf"), str(tmp_path / "hf.failed")
    (tmp_path / "hf.failed").write_text("RuntimeError: CUDA out of memory")
    with pytest.raises(QuantizeError,
                       match=r"rank 0's Hugging Face export failed \(RuntimeError: CUDA out of memory\)"):
        megatron_export.wait_for_export(dest, failed, "bf16_checkpoint", poll=0.01)
    os.unlink(failed)
    monkeypatch.setattr(megatron_export, "EXPORT_WAIT_S", 0.05)
    with pytest.raises(QuantizeError, match=r"did not appear within 0 s; see rank 0's log"):
        megatron_export.wait_for_export(dest, failed, "bf16_checkpoint", poll=0.01)
    os.mkdir(dest)
    assert megatron_export.wait_for_export(dest, failed, "bf16_checkpoint", poll=0.01) == dest
