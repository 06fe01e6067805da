"""The NVFP4 precision recipe: the layer and module map, the Transformer Engine knobs as job env vars, FP32 gradient
reduction with MTP, the Hopper error, and the runtime's decision, checked against the recorded Megatron-Bridge,
Megatron-Core and Transformer Engine APIs (tests/data/precision_api.json, src/ultra3/megatron_api/record.json) and the
installed Megatron-Core's own per-module recipe matcher. CPU only."""

from __future__ import annotations

import copy
import fnmatch
import json
from pathlib import Path

import pytest

from ultra3 import megatron_api
from conftest import inputs
from ultra3.compile import compile_job
from ultra3.job import Options
from ultra3.paths import JOB_DIR_PLACEHOLDER
from ultra3.errors import InvalidConfig
from ultra3.findings import Report
from ultra3.jobprep.plan import slurm_spec
from ultra3.executors.sbatch import render_sbatch
from ultra3.precision_map import MODULE_PATHS, TE_KNOBS, layer_map, module_rows
from ultra3.stages import STAGES
from ultra3.validation.precision import GRAD_REDUCE, settle

from recipes.training.precision import (
    DDP_FIELDS,
    MODEL_FIELDS,
    NVFP4_PRESET,
    ULTRA_LAYERS,
    ULTRA_PRESET,
    PrecisionError,
    check_te_env,
    decide,
)

API = json.loads((Path(__file__).parent / "data" / "precision_api.json").read_text())
PRESETS = set(megatron_api.mixed_precision_presets())
NVFP4 = f"mixed_precision={ULTRA_PRESET}"
BLEND = ("dataset.blend_path=/lustre/data/blend.json", "phase2.blend_path=/lustre/data/phase2/blend.json")


def compile_(stage: str, *overrides: str, config: str = "default", profile: str = "blackwell"):
    stage_ = next(s for s in STAGES if s.name == stage)
    return compile_job(stage_, Options(config=config, batch=profile, dry_run=True,
                                       overrides=[*(inputs(stage, config) if stage == "sft" else []), *overrides]))


def messages(report: Report, level: str, key: str) -> list[str]:
    return [f.message for f in report.findings if f.level == level and f.key == key]


# --- the layer map --------------------------------------------------------------------------------------------------


def test_ultra_keeps_its_last_16_layers_in_bf16(home):
    job = compile_("pretrain", *BLEND)
    m = layer_map(job.config)
    assert len(m.symbols) == 108 and m.quantized.count(False) == 16
    assert m.quantized == [True] * 92 + [False] * 16
    rows = dict(job.report.tables["precision by layer"])
    assert rows["layers 1-92"].startswith("NVFP4") and rows["layers 93-108"].startswith("BF16 (last 16")
    assert rows["layer precision"].startswith("4" * 92 + "B" * 16 + " ")

    m = layer_map(compile_("pretrain", *BLEND, "model.num_layers_at_start_in_bf16=2").config)
    assert m.quantized.count(False) == 18 and m.quantized[:3] == [False, False, True]
    m = layer_map(compile_("pretrain", *BLEND, "model.first_last_layers_bf16=false").config)
    assert m.quantized.count(False) == 0


def test_tiny_runs_bf16_and_its_pattern_maps_layer_by_layer(home):
    job = compile_("pretrain", config="tiny")
    m = layer_map(job.config)
    assert "".join(m.symbols) == "MEM*EME" and not any(m.quantized)
    assert job.config["mixed_precision"] == "bf16_mixed" and compile_("sft", config="tiny").config["mixed_precision"] \
        == "bf16_mixed"
    assert not [k for k in job.config["run"].get("env") or {} if k.startswith("NVTE_")]
    assert "precision by module" not in job.report.tables

    with pytest.raises(InvalidConfig, match="1 error"):  # its Mamba in_proj is 2440 wide: not for FP4 GEMMs
        compile_("pretrain", NVFP4, "model.num_layers_at_end_in_bf16=2", config="tiny")
    job = compile_("pretrain", NVFP4, "model.num_layers_at_end_in_bf16=2", "model.mamba_num_heads=16", config="tiny")
    m = layer_map(job.config)
    assert m.quantized == [True] * 5 + [False] * 2
    assert dict(job.report.tables["precision by layer"])["layer types"].startswith("MEM*EME  (")


def test_module_table_follows_the_bf16_globs(home):
    rows = dict(compile_("pretrain", *BLEND).report.tables["precision by module"])
    for kind in ("Mamba-2 out_proj", "attention QKV", "attention out", "latent projections", "MTP", "embedding",
                 "output layer"):
        assert rows[kind].startswith("BF16"), (kind, rows[kind])
    for kind in ("Mamba-2 in_proj", "routed experts", "shared expert"):
        assert rows[kind].startswith("NVFP4  in 41 of the 48"), (kind, rows[kind])
    assert rows["router"].startswith("FP32")

    job = compile_("pretrain", *BLEND, "precision.bf16_modules=['*.mixer.out_proj']")
    rows = dict(job.report.tables["precision by module"])
    assert rows["Mamba-2 out_proj"].startswith("BF16") and rows["attention QKV"].startswith("NVFP4")
    assert rows["MTP"].startswith("NVFP4")

    job = compile_("pretrain", *BLEND, "precision.bf16_modules=[]")
    assert "Ultra tech report keeps them" in messages(job.report, "warning", "precision.bf16_modules")[0]
    job = compile_("pretrain", *BLEND, "precision.bf16_modules=['*.mixer.outproj']")
    assert "'*.mixer.outproj' matches none" in messages(job.report, "warning", "precision.bf16_modules")[0]


def test_module_table_skips_modules_the_model_lacks(home):
    job = compile_("pretrain", *BLEND, "model.moe_latent_size=null", "model.moe_shared_expert_intermediate_size=null")
    names = [name for name, _ in module_rows(job.config, layer_map(job.config))]
    assert "latent projections" not in names and "shared expert" not in names and "routed experts" in names


# --- the knobs: env vars of the job ---------------------------------------------------------------------------------


def test_knobs_become_env_vars_of_the_job_and_its_sbatch_script(home):
    job = compile_("pretrain", *BLEND, "precision.stochastic_rounding=false")
    env = job.config["run"]["env"]
    assert {k.env: env[k.env] for k in TE_KNOBS} == {"NVTE_NVFP4_DISABLE_RHT": "0",
                                                     "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "1",
                                                     "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "0"}
    assert env["NCCL_DEBUG"] == "WARN"  # the profile's env stays
    script = render_sbatch(slurm_spec(job, job_dir=JOB_DIR_PLACEHOLDER))
    assert "export NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING=1\n" in script
    assert "export NVTE_NVFP4_DISABLE_RHT=0\n" in script
    # the config the job receives (config.yaml in its code dir) carries them for the runtime's check
    received = job.with_job({"id": "x", "dir": "/tmp/x"})
    assert received["run"]["env"]["NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING"] == "1"
    assert "stochastic rounding OFF" in dict(job.report.tables["precision by layer"])["NVFP4 knobs"]


def test_knobs_mean_nothing_without_nvfp4(home):
    job = compile_("sft", "dataset.packed_dir=/lustre/data/sft", "recipe.pretrained_checkpoint=/lustre/ckpt",
                   "precision.weight_2d_blocks=false")
    assert "has no effect" in messages(job.report, "warning", "precision.weight_2d_blocks")[0]
    assert not [k for k in job.config["run"]["env"] if k.startswith("NVTE_")]


def test_an_env_var_of_a_knob_set_by_hand_is_an_error(home):
    with pytest.raises(InvalidConfig) as e:
        compile_("pretrain", *BLEND, "run.env.NVTE_NVFP4_DISABLE_RHT=1")
    (finding,) = e.value.findings
    assert finding.key == "run.env.NVTE_NVFP4_DISABLE_RHT" and "precision.random_hadamard_transform" in finding.message


# --- FP32 gradient reduction with MTP -------------------------------------------------------------------------------


def test_fp32_gradient_reduction_is_forced_with_mtp_when_no_layer_sets_it(home):
    job = compile_("pretrain", *BLEND)
    cfg = copy.deepcopy(job.config)
    del cfg["ddp"][GRAD_REDUCE.split(".")[1]]
    origin = {k: v for k, v in job.origin.items() if k != GRAD_REDUCE}
    report = Report()
    assert settle(cfg, origin, report)[GRAD_REDUCE] is True
    assert "8T tokens" in messages(report, "note", GRAD_REDUCE)[0]

    for key, value in (("model.mtp_num_layers", 0), ("mixed_precision", "bf16_mixed")):
        other = copy.deepcopy(cfg)
        section, name = key.split(".") if "." in key else (None, key)
        (other[section] if section else other)[name] = value
        assert GRAD_REDUCE not in settle(other, origin, Report())


def test_explicit_bf16_gradient_reduction_with_mtp_stays_with_a_warning(home):
    job = compile_("pretrain", *BLEND, "ddp.grad_reduce_in_fp32=false")
    assert job.config["ddp"]["grad_reduce_in_fp32"] is False
    assert "~8T tokens" in messages(job.report, "warning", GRAD_REDUCE)[0]
    assert not messages(job.report, "note", GRAD_REDUCE)
    assert decide(job.config, PRESETS, (10, 0)).fields["grad_reduce_in_fp32"] is False


def test_nvfp4_on_hopper_errors_naming_bf16_and_fp8(home):
    with pytest.raises(InvalidConfig) as e:
        compile_("pretrain", "dataset.mock=true", profile="hopper")
    (message,) = [f.message for f in e.value.findings if f.key == "mixed_precision"]
    assert "bf16_mixed" in message and "bf16_with_fp8_current_scaling_mixed" in message


def test_a100_is_known_trains_bf16_and_refuses_what_ampere_cannot(home):
    """The tiny configs train in BF16 on A100 (the dry run's memory and cost on its 80 GB and 312 TFLOP/s); NVFP4 and
    FP8 are refused as what SM 8.0 lacks, with no FP8 suggestion."""
    job = compile_("pretrain", "cluster.gpu=a100", config="tiny")
    assert not [f for f in job.report.findings if f.key == "cluster.gpu"], job.report.findings
    with pytest.raises(InvalidConfig) as nvfp4:
        compile_("pretrain", "mixed_precision=bf16_with_nvfp4_mixed", "cluster.gpu=a100", "model.mamba_num_heads=16",
                 config="tiny")
    (line,) = [f.message for f in nvfp4.value.findings if f.key == "mixed_precision"]
    assert "needs SM 10.0/10.3 (Blackwell), but a100 is SM 8.0" in line and "fp8" not in line.split("[")[0], line
    with pytest.raises(InvalidConfig) as fp8:
        compile_("pretrain", "mixed_precision=bf16_with_fp8_current_scaling_mixed", "cluster.gpu=a100",
                 "model.mamba_num_heads=16", config="tiny")
    assert any("trains in FP8, which needs SM 8.9+, but a100 is SM 8.0; set mixed_precision=bf16_mixed" in f.message
               for f in fp8.value.findings), fp8.value.findings


# --- the runtime's decision -----------------------------------------------------------------------------------------


def test_runtime_uses_the_ultra_preset_or_composes_it(home):
    cfg = compile_("pretrain", *BLEND).with_job({"id": "x", "dir": "/tmp/x"})
    d = decide(cfg, PRESETS, (10, 0))
    assert d.preset == ULTRA_PRESET and ULTRA_PRESET in PRESETS
    assert d.bf16_modules == tuple(cfg["precision"]["bf16_modules"])
    assert d.fields == {"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 0,
                        "num_layers_at_end_in_bf16": 16, "grad_reduce_in_fp32": True}

    composed = decide(cfg, PRESETS - {ULTRA_PRESET}, (10, 0))
    assert composed.preset == NVFP4_PRESET and "composed from" in composed.lines()[0]
    # the composition is what Megatron-Bridge 0.6.2's preset sets on top of bf16_with_nvfp4_mixed
    assert ULTRA_LAYERS == API["megatron_bridge"]["preset_assignments"][ULTRA_PRESET]
    assert API["megatron_bridge"]["preset_assignments"][NVFP4_PRESET]["fp4"] == "e2m1"
    assert {k: composed.fields[k] for k in ULTRA_LAYERS} == ULTRA_LAYERS


def test_runtime_takes_the_bf16_path_for_tiny_and_refuses_nvfp4_on_hopper(home):
    tiny = compile_("pretrain", config="tiny").with_job({"id": "x", "dir": "/tmp/x"})
    d = decide(tiny, PRESETS, (9, 0))
    assert d.preset == "bf16_mixed" and d.quant_recipe() is None and not check_te_env(tiny, {})
    with pytest.raises(PrecisionError, match=r"SM 9\.0; set mixed_precision=bf16_mixed"):
        decide({**tiny, "mixed_precision": ULTRA_PRESET}, PRESETS, (9, 0))
    with pytest.raises(PrecisionError, match="not a Megatron-Bridge preset"):
        decide({**tiny, "mixed_precision": "bf16_nvfp4"}, PRESETS, None)


def test_runtime_checks_the_knob_env_it_was_started_with(home):
    cfg = compile_("pretrain", *BLEND).with_job({"id": "x", "dir": "/tmp/x"})
    env = {k.env: "0" for k in TE_KNOBS}
    assert "NVTE_NVFP4_DISABLE_RHT=0" in check_te_env(cfg, env)[0]
    with pytest.raises(PrecisionError, match="NVTE_NVFP4_DISABLE_RHT=None"):
        check_te_env(cfg, {})


def test_every_name_the_recipe_uses_is_in_the_released_apis():
    mp_fields = megatron_api.class_fields("MixedPrecisionConfig")
    assert set(MODEL_FIELDS) | set(ULTRA_LAYERS) | set(DDP_FIELDS) <= set(mp_fields)
    assert {"quant_recipe", *MODEL_FIELDS[:3]} <= set(megatron_api.class_fields("HybridModelProvider"))
    assert set(DDP_FIELDS) <= set(megatron_api.class_fields("DistributedDataParallelConfig"))
    assert {"bf16_mixed", "bf16_with_fp8_current_scaling_mixed", NVFP4_PRESET} <= PRESETS
    assert "megatron.bridge.training.mixed_precision.get_mixed_precision_config" in megatron_api.record()["functions"]
    assert "MIXED_PRECISION_RECIPES" in API["megatron_bridge"]["mixed_precision_module_names"]

    te = API["transformer_engine"]["nvfp4_block_scaling_env"]
    assert {k.env: te[k.env]["field"] for k in TE_KNOBS} == {
        "NVTE_NVFP4_DISABLE_RHT": "disable_rht",
        "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "disable_stochastic_rounding",
        "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "disable_2d_quantization"}
    assert all(te[k.env]["default"] == "0" for k in TE_KNOBS)  # unset = on, as knob_values assumes

    core = API["megatron_core"]
    recipe = decide({"mixed_precision": ULTRA_PRESET, "precision": {"bf16_modules": ["mtp.*"]}}, PRESETS,
                    None).quant_recipe()
    (config,) = recipe["configs"].values()
    assert config[core["te_config_type_key"]] in core["te_config_types"]
    assert set(config) - {core["te_config_type_key"]} <= set(core["te_quantization_params_fields"])
    assert set(config["training_recipe"]) <= set(core["te_quantization_recipe_fields"])
    assert {"RecipeConfig", "GlobMatcher"} <= set(core["quant_config_classes"])
    assert "from_config_dict" in core["recipe_config_methods"]
    segments = {s for p in MODULE_PATHS for s in p.split(".") if not s.isdigit()}
    assert segments <= set(core["module_path_segments"]), segments - set(core["module_path_segments"])


@pytest.mark.heavy  # imports Megatron-Core and torch (10 s)
def test_megatron_core_matches_the_recipe_as_the_dry_run_says(home):
    """The installed Megatron-Core's own matcher and TE config parser (quant_config.py is identical in 0.16.1 and
    0.19.2) give every module path the precision the dry-run table shows."""
    from megatron.core.extensions.transformer_engine import TEQuantizationParams
    from megatron.core.quantization.quant_config import RecipeConfig
    from megatron.core.quantization.utils import get_quant_config_or_none

    cfg = compile_("pretrain", *BLEND).with_job({"id": "x", "dir": "/tmp/x"})
    d = decide(cfg, PRESETS, (10, 0))
    recipe = RecipeConfig.from_config_dict(d.quant_recipe())
    for path in MODULE_PATHS:
        q = get_quant_config_or_none(path, recipe)
        assert (q is not None) == any(fnmatch.fnmatch(path, g) for g in d.bf16_modules), path
        if q is not None:
            params = TEQuantizationParams.parse_from_config(q)
            assert params.training_recipe.fp4_quantization_recipe is None
            assert params.training_recipe.fp8_quantization_recipe is None  # BF16, overriding the layer's NVFP4
            assert params.training_recipe.override_quantized_autocast


def test_a_suggested_precision_passes_the_dry_run(home):
    """On Hopper the NVFP4 error suggests FP8 only where the model's GEMM widths allow it."""
    with pytest.raises(InvalidConfig) as tiny:
        compile_("pretrain", "mixed_precision=bf16_with_nvfp4_mixed", "cluster.gpu=h100", config="tiny")
    line = next(f.message for f in tiny.value.findings if "needs SM 10.0" in f.message)
    assert "bf16_mixed (BF16)" in line and "fp8" not in line.split("[")[0], line
    with pytest.raises(InvalidConfig, match="1 error"):  # what it would otherwise have suggested
        compile_("pretrain", "mixed_precision=bf16_with_fp8_current_scaling_mixed", "cluster.gpu=h100", config="tiny")
    compile_("pretrain", "mixed_precision=bf16_mixed", "cluster.gpu=h100", config="tiny")
    with pytest.raises(InvalidConfig) as aligned:
        compile_("pretrain", "mixed_precision=bf16_with_nvfp4_mixed", "cluster.gpu=h100", "model.mamba_num_heads=16",
                 config="tiny")
    assert any("or bf16_with_fp8_current_scaling_mixed (FP8, SM 8.9+)" in f.message for f in aligned.value.findings)
    compile_("pretrain", "mixed_precision=bf16_with_fp8_current_scaling_mixed", "cluster.gpu=h100",
             "model.mamba_num_heads=16", config="tiny")
