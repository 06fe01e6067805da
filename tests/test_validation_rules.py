"""Validation rules over the real configs (configs/*.yaml) plus targeted mutations. CPU only: PyYAML + pytest."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ultra3.findings import Report
from ultra3.validation import validate_training

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _load(path: Path) -> dict:
    """A config with its `defaults:` bases merged first (in order), then the file itself."""
    data = yaml.safe_load(path.read_text()) or {}
    merged: dict = {}
    for ref in data.pop("defaults", None) or []:
        merged = _merge(merged, _load((path.parent / ref).with_suffix(".yaml")))
    return _merge(merged, data)


def config(name: str, **run) -> dict:
    """A shipped config; `gpu` and `nvlink_domain_size` describe the cluster, the rest is the job's run."""
    cfg = _load(CONFIGS / f"{name}.yaml")
    cfg["cluster"] = {k: run.pop(k) for k in ("gpu", "nvlink_domain_size") if k in run}
    cfg["run"] = {**cfg.get("run", {}), **run}
    return cfg


def setting(cfg: dict, dotted: str, value) -> dict:
    node = cfg
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return cfg


def validate(cfg: dict) -> Report:
    report = Report()
    validate_training(cfg, report)
    assert not [f for f in report.findings if f.key.startswith("validation.")], report.findings
    return report


def keys(report: Report, level: str) -> list[str]:
    return [f.key for f in report.findings if f.level == level]


def one(report: Report, level: str, key: str):
    found = [f for f in report.findings if f.level == level and f.key == key]
    assert found, f"no {level} on {key}: {[f.line() for f in report.findings]}"
    return found[0]


def pretrain(**run) -> dict:
    return config("pretrain/default", **{"gpu": "b200", **run})


def tiny(**run) -> dict:
    return config("pretrain/tiny", **{"gpu": "h100", **run})


# --- the shipped configs -----------------------------------------------------------------------------------------


def test_default_pretrain_on_b200_has_no_errors_and_shows_the_token_budget():
    report = validate(pretrain())
    assert report.errors == []
    assert report.facts["world_size"] == 768
    assert report.facts["data_parallel_size"] == 32
    assert report.facts["expert_data_parallel_size"] == 2
    assert report.facts["num_microbatches"] == 96
    assert report.facts["tokens_per_iteration"] == 25_165_824
    assert report.facts["total_tokens"] == pytest.approx(20.0e12, rel=1e-3)
    schedule = dict(report.tables["schedule"])
    assert schedule["tokens per iteration"].startswith("25,165,824")
    assert schedule["total tokens"].startswith("20.00T")
    assert "200.0B tokens" in schedule["warmup"]
    assert report.facts["decay_tokens"] == pytest.approx(5.0e12, rel=1e-3)  # the final 5T-token anneal


def test_default_pretrain_memory_estimate_is_plausible_on_b200():
    report = validate(pretrain())
    memory = dict(report.tables["memory"])
    for row in ("weights", "gradients", "optimizer state", "activations", "total"):
        assert row in memory
    assert "b200" in memory["total"]
    assert 0.2 < report.facts["memory_fraction"] < 0.9
    assert "model.recompute_granularity" not in keys(report, "warning")


def test_parameter_count_matches_the_ultra_model_card():
    report = validate(pretrain())
    assert report.facts["params_total"] == 560_524_603_904  # HF card: 560,524,603,904 parameters
    assert report.facts["params_total_without_mtp"] == pytest.approx(550e9, rel=0.01)  # "550B"
    assert report.facts["params_active"] == pytest.approx(55e9, rel=0.02)  # "A55B"
    assert "assumed Ultra layer mix" in dict(report.tables["memory"])["layer mix"]


def test_default_pretrain_on_h100_errors_on_mixed_precision_with_the_fix():
    finding = one(validate(pretrain(gpu="h100")), "error", "mixed_precision")
    assert "h100" in finding.message
    assert "b200" in finding.message and "bf16_mixed" in finding.message


@pytest.mark.parametrize("name", ["pretrain/tiny", "sft/tiny"])
def test_tiny_configs_on_one_h100_have_no_errors_and_fit_easily(name):
    report = validate(config(name, gpu="h100", nodes=1, gpus_per_node=1))
    assert report.errors == []
    assert report.warnings == []
    assert report.facts["memory_fraction"] < 0.25
    assert report.facts["params_total"] < 20e6


def test_default_sft_covers_its_pipeline_and_has_no_errors():
    report = validate(config("sft/default", gpu="b200"))
    assert report.errors == []
    assert not [w for w in report.warnings if w.key == "train.global_batch_size"]  # no pipeline-bubble warning
    assert report.facts["pad_seq_to_mult"] == 16  # lcm(2·CP, CP·TP) for CP8 TP2


def test_pattern_unset_is_noted_as_checked_at_run_time():
    finding = one(validate(pretrain()), "note", "model.hybrid_layer_pattern")
    assert "run time" in finding.message


def test_nvfp4_bf16_layer_set_is_shown():
    finding = one(validate(pretrain()), "note", "model.num_layers_at_end_in_bf16")
    assert "layers 93-108 (16 of 108) stay BF16" in finding.message


# --- parallelism ---------------------------------------------------------------------------------------------------


def test_pipeline_size_that_does_not_divide_the_layers_errors():
    cfg = setting(pretrain(nodes=7), "model.pipeline_model_parallel_size", 7)  # 56 GPUs = 2·7·4
    cfg = setting(cfg, "model.expert_model_parallel_size", 8)
    finding = one(validate(cfg), "error", "model.pipeline_model_parallel_size")
    assert "108 layers" in finding.message and "PP=7" in finding.message
    assert "1, 2, 3, 4, 6, 9, 12" in finding.message


def test_pipeline_layout_lifts_the_layer_divisibility_rule():
    cfg = setting(pretrain(nodes=7), "model.pipeline_model_parallel_size", 7)
    cfg = setting(cfg, "model.expert_model_parallel_size", 8)
    cfg = setting(cfg, "model.pipeline_model_parallel_layout", "Et*15|t*16|t*16|t*16|t*16|t*16|t*13L")
    assert "model.pipeline_model_parallel_size" not in keys(validate(cfg), "error")


def test_world_size_not_a_multiple_of_tp_pp_cp_errors():
    finding = one(validate(pretrain(nodes=95)), "error", "run.nodes")
    assert "760" in finding.message and "24" in finding.message


def test_expert_parallel_size_that_does_not_divide_the_experts_errors():
    cfg = setting(pretrain(), "model.expert_model_parallel_size", 24)
    messages = [f.message for f in validate(cfg).errors if f.key == "model.expert_model_parallel_size"]
    assert any("512 experts" in m and "EP=24" in m for m in messages)


def test_expert_mesh_needs_enough_gpus():
    finding = one(validate(pretrain(nodes=1)), "error", "model.expert_model_parallel_size")
    assert "at least" in finding.message and "384" in finding.message  # PP12 · max(2, 32)


def test_heads_and_query_groups_not_fitting_tp_error():
    cfg = setting(pretrain(nodes=108), "model.tensor_model_parallel_size", 3)
    messages = [f.message for f in validate(cfg).errors if f.key == "model.tensor_model_parallel_size"]
    assert any("num_attention_heads=64 is not divisible by TP=3" in m for m in messages), messages
    assert any("num_query_groups=2 and TP=3: one must divide the other" in m for m in messages), messages


def test_tp_a_multiple_of_query_groups_replicates_kv_heads():  # Megatron-Core 0.19 accepts TP8 with 2 groups
    cfg = setting(pretrain(nodes=384), "model.tensor_model_parallel_size", 8)
    messages = [f.message for f in validate(cfg).errors if f.key == "model.tensor_model_parallel_size"]
    assert not any("num_query_groups" in m for m in messages), messages


def test_pattern_length_mismatch_errors():
    cfg = setting(tiny(), "model.hybrid_layer_pattern", "MEM*EM")
    finding = one(validate(cfg), "error", "model.hybrid_layer_pattern")
    assert "6 layers" in finding.message and "num_layers=7" in finding.message


def test_bad_pattern_symbol_errors():
    cfg = setting(tiny(), "model.hybrid_layer_pattern", "MEX*EME")
    finding = one(validate(cfg), "error", "model.hybrid_layer_pattern")
    assert "'X'" in finding.message


def test_pattern_pipeline_splits_must_match_pp():
    bad = setting(tiny(), "model.hybrid_layer_pattern", "MEM|*EME")  # one split, PP=1
    assert "'|'" in one(validate(bad), "error", "model.hybrid_layer_pattern").message
    good = setting(tiny(gpus_per_node=2), "model.hybrid_layer_pattern", "MEM|*EME")
    good = setting(good, "model.pipeline_model_parallel_size", 2)  # 7 layers, PP2: the '|' places them
    assert validate(good).errors == []


def test_mamba_context_parallel_needs_heads_divisible_by_tp_cp():
    cfg = setting(tiny(gpus_per_node=16), "model.context_parallel_size", 16)  # 8 Mamba heads over CP16
    finding = one(validate(cfg), "error", "model.context_parallel_size")
    assert "mamba_num_heads" in finding.message


# --- batch and sequence ------------------------------------------------------------------------------------------


def test_global_batch_not_divisible_by_mbs_times_dp_errors():
    cfg = setting(pretrain(), "train.global_batch_size", 3000)
    finding = one(validate(cfg), "error", "train.global_batch_size")
    assert "3,000" in finding.message and "32" in finding.message and "2,976" in finding.message


def test_fewer_microbatches_than_pipeline_stages_warns_with_the_bubble():
    cfg = setting(setting(pretrain(), "train.global_batch_size", 64), "phase2.start_tokens", None)  # 2 microbatches,
    # PP12; one blend (15T tokens would be past this run's 417B)
    report = validate(cfg)
    assert report.errors == []
    warning = one(report, "warning", "train.global_batch_size")
    assert "PP=12" in warning.message and "85%" in warning.message


def test_virtual_pipeline_needs_microbatches_divisible_by_pp():
    cfg = setting(pretrain(), "model.virtual_pipeline_model_parallel_size", 3)  # 108 = 12·3·3
    assert validate(cfg).errors == []  # 96 microbatches, multiple of 12
    cfg = setting(cfg, "train.global_batch_size", 3072 + 32 * 6)  # 102 microbatches
    assert "virtual pipeline" in one(validate(cfg), "error", "train.global_batch_size").message


def test_context_parallel_needs_seq_length_divisible():
    cfg = setting(pretrain(), "model.context_parallel_size", 4)
    assert validate(cfg).errors == []
    cfg = setting(cfg, "model.seq_length", 8196)
    finding = one(validate(cfg), "error", "model.seq_length")
    assert "8,196" in finding.message and "multiple of 8" in finding.message and "8,200" in finding.message


def test_sequence_parallel_without_tp_warns():
    cfg = setting(tiny(), "model.sequence_parallel", True)
    assert "TP=1" in one(validate(cfg), "warning", "model.sequence_parallel").message


def test_expert_and_tensor_parallel_need_sequence_parallel():
    cfg = setting(pretrain(), "model.sequence_parallel", False)
    one(validate(cfg), "error", "model.sequence_parallel")


def test_packed_sft_needs_mbs_1_and_pack_size_equal_to_seq_length():
    cfg = setting(config("sft/tiny", gpu="h100"), "train.micro_batch_size", 2)
    cfg = setting(cfg, "dataset.pack_size", 1024)
    report = validate(cfg)
    assert "micro_batch_size 1" in one(report, "error", "train.micro_batch_size").message
    assert "1,024" in one(report, "error", "dataset.pack_size").message


# --- precision and topology ----------------------------------------------------------------------------------------


def test_bf16_gradient_reduction_with_mtp_warns():
    cfg = setting(pretrain(), "ddp.grad_reduce_in_fp32", False)
    finding = one(validate(cfg), "warning", "ddp.grad_reduce_in_fp32")
    assert "8T" in finding.message and "grad_reduce_in_fp32=true" in finding.message
    cfg = setting(cfg, "model.mtp_num_layers", 0)
    assert "ddp.grad_reduce_in_fp32" not in keys(validate(cfg), "warning")


def test_nvfp4_with_an_fp8_recipe_errors():
    cfg = setting(pretrain(), "model.fp8_recipe", "tensorwise")
    assert "fp8_recipe=None" in one(validate(cfg), "error", "model.fp8_recipe").message


def test_nvfp4_with_every_layer_quantized_warns():
    cfg = setting(pretrain(), "model.first_last_layers_bf16", False)
    assert "all 108 layers" in one(validate(cfg), "warning", "model.first_last_layers_bf16").message


def test_mxfp8_needs_blackwell_but_fp8_runs_on_hopper():
    cfg = setting(pretrain(gpu="h100"), "mixed_precision", "bf16_with_mxfp8_mixed")
    one(validate(cfg), "error", "mixed_precision")
    cfg = setting(cfg, "mixed_precision", "bf16_with_fp8_current_scaling_mixed")
    assert "mixed_precision" not in keys(validate(cfg), "error")


def test_expert_group_beyond_the_nvlink_domain_warns_past_the_recipes_own_but_fits_nvl72():
    note = one(validate(pretrain()), "note", "model.expert_model_parallel_size")  # the recipe's EP=32 on B200
    assert "EP·ETP = 32 spans 4 NVLink domains of 8 GPUs" in note.message and "HybridEP" in note.message
    warning = one(validate(setting(pretrain(), "model.expert_model_parallel_size", 64)), "warning",
                  "model.expert_model_parallel_size")
    assert "64" in warning.message and "8 GPUs" in warning.message and "PR#6043" in warning.message
    report = validate(pretrain(gpu="gb200", nodes=192, gpus_per_node=4))
    assert "model.expert_model_parallel_size" not in keys(report, "warning")
    assert report.errors == []


def test_tensor_parallel_beyond_a_node_warns():
    cfg = setting(tiny(gpus_per_node=2, nodes=2), "model.tensor_model_parallel_size", 4)
    cfg = setting(cfg, "model.num_attention_heads", 4)
    cfg = setting(cfg, "model.num_query_groups", 4)
    assert "TP=4 > 2 GPUs per node" in one(validate(cfg), "warning", "model.tensor_model_parallel_size").message


# --- unknown cluster facts -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus_per_node", [None, 0])
def test_unknown_gpus_per_node_gives_one_warning_and_skips_world_checks(gpus_per_node):
    report = validate(tiny(gpus_per_node=gpus_per_node))
    assert report.errors == []
    assert len(report.warnings) == 1 and report.warnings[0].key == "run.gpus_per_node"
    assert "skipped" in report.warnings[0].message
    assert "data_parallel_size" not in report.facts and "memory_per_gpu_gib" not in report.facts

    # the full model, whose world-size rules would otherwise run: still no world-size error
    report = validate(pretrain(gpus_per_node=gpus_per_node, nodes=1))
    assert report.errors == []
    assert [w.key for w in report.warnings if "gpus_per_node" in w.message] == ["run.gpus_per_node"]


def test_unknown_gpu_warns_and_skips_the_precision_check():
    report = validate(pretrain(gpu=None))
    assert report.errors == []
    assert "GPU-type checks" in one(report, "warning", "cluster.gpu").message
    assert "memory_fraction" not in report.facts
    assert "mixed_precision" not in keys(report, "error")


def test_unknown_gpu_name_errors():
    assert "h100" in one(validate(pretrain(gpu="a100x")), "error", "cluster.gpu").message


# --- schedule ------------------------------------------------------------------------------------------------------


def test_warmup_not_shorter_than_training_errors():
    cfg = setting(tiny(), "scheduler.lr_warmup_iters", 40)
    assert "train_iters 40" in one(validate(cfg), "error", "scheduler.lr_warmup_iters").message


def test_wsd_anneal_longer_than_decay_errors():
    cfg = setting(pretrain(), "scheduler.lr_wsd_decay_iters", 800_000)
    assert "794,728" in one(validate(cfg), "error", "scheduler.lr_wsd_decay_iters").message


def test_wsd_needs_an_anneal_length():
    cfg = setting(pretrain(), "scheduler.lr_wsd_decay_iters", None)
    one(validate(cfg), "error", "scheduler.lr_wsd_decay_iters")


def test_decay_beyond_training_warns():
    cfg = setting(setting(pretrain(), "scheduler.lr_decay_iters", 900_000), "phase2.start_tokens", None)  # one blend:
    # a run in phases refuses any lr_decay_iters but train_iters
    report = validate(cfg)
    assert "900,000" in one(report, "warning", "scheduler.lr_decay_iters").message
    assert "scheduler.lr_decay_iters" not in keys(report, "error")


def test_min_lr_above_lr_errors():
    cfg = setting(pretrain(), "optimizer.min_lr", 1e-3)
    assert "0.00025" in one(validate(cfg), "error", "optimizer.min_lr").message


# --- memory --------------------------------------------------------------------------------------------------------


def test_the_full_model_on_one_gpu_errors_on_memory():
    cfg = pretrain(gpu="h100", nodes=1, gpus_per_node=1)
    for key in ("tensor", "pipeline", "expert"):
        setting(cfg, f"model.{key}_model_parallel_size", 1)
    report = validate(cfg)
    memory_errors = [f for f in report.errors if "exceeds the 80 GiB of h100" in f.message]
    assert len(memory_errors) == 1
    assert memory_errors[0].key == "model.expert_model_parallel_size"  # the experts dominate
    assert report.facts["memory_per_gpu_gib"] > 1000


def test_bf16_gradient_buffers_shrink_the_estimate():
    fp32 = validate(pretrain()).facts["memory_per_gpu_gib"]
    bf16 = validate(setting(pretrain(), "ddp.grad_reduce_in_fp32", False)).facts["memory_per_gpu_gib"]
    assert bf16 < fp32


# --- collection and robustness -------------------------------------------------------------------------------------


def test_several_errors_are_all_reported():
    cfg = pretrain(gpu="h100")
    setting(cfg, "model.expert_model_parallel_size", 24)
    setting(cfg, "optimizer.min_lr", 1.0)
    setting(cfg, "model.hybrid_layer_pattern", "M" * 100)
    setting(cfg, "scheduler.lr_warmup_iters", 10**6)
    errors = set(keys(validate(cfg), "error"))
    assert {
        "mixed_precision",
        "model.expert_model_parallel_size",
        "optimizer.min_lr",
        "model.hybrid_layer_pattern",
        "scheduler.lr_warmup_iters",
    } <= errors


def test_every_message_is_one_line_with_a_key():
    cfg = setting(config("sft/default", gpu="h100"), "train.global_batch_size", 65)
    for finding in validate(cfg).findings:
        assert finding.key and "\n" not in finding.message


@pytest.mark.parametrize("section", ["run", "model", "train", "scheduler", "optimizer", "dataset", "ddp"])
@pytest.mark.parametrize("value", [None, {}, "oops"])
def test_missing_or_broken_sections_never_crash(section, value):
    cfg = pretrain()
    cfg[section] = value
    validate(cfg)  # asserts no internal-error finding


def test_none_values_anywhere_never_crash():
    base = pretrain()
    for section, values in base.items():
        if not isinstance(values, dict):
            continue
        for key in values:
            cfg = copy.deepcopy(base)
            cfg[section][key] = None
            validate(cfg)
    validate({})
