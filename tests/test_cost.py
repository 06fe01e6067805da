"""Cost estimates (ultra3.cost) of real configs through the real compile: the assumed throughput models against
the published figures, a measured run replacing the assumption, CPU runs, data prep on the shipped local
sample, the total of a chain and the one-line format."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from ultra3 import cost, cost_data_prep
from ultra3.compile import compile_job
from ultra3.job import Options
from ultra3.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny"
STAGE = {s.name: s for s in STAGES}
INPUTS = {"pretrain": ["dataset.blend_path=/lustre/data/blend.json",
                       "phase2.blend_path=/lustre/data/phase2/blend.json"],
          "sft": ["dataset.packed_dir=/lustre/data/sft", "recipe.pretrained_checkpoint=/lustre/ckpt/pretrain"]}
ULTRA_TOKENS = 794_728 * 3_072 * 8_192  # train_iters x global_batch_size x seq_length of pretrain default: 20.0T


def config(stage: str, name: str = "default", profile: str | None = None, *overrides: str) -> dict:
    inputs = INPUTS.get(stage, []) if name == "default" else []
    return compile_job(STAGE[stage], Options(config=name, batch=profile, dry_run=True,
                                             overrides=[*inputs, *overrides])).config


def manifest(cfg: dict, seconds: float | None, job: str = "ultra3-pretrain_20260101-000000-abcdef", **metadata) -> dict:
    """An artifact manifest as recipes/contract.py publishes it for a completed job of this config."""
    return {"format": 1, "name": f"x-{cfg['job']['config']}", "kind": "x", "path": "/jobs/x", "producer": job,
            "stage": cfg["job"]["stage"], "config": cfg["job"]["config"], "config_digest": cfg["job"].get("digest"),
            "seconds": seconds, "metadata": {"bytes": 1, **metadata}}


# -- training -------------------------------------------------------------------------------------------------


def test_ultra_pretrain_on_b200_within_the_published_band(home):
    e = cost.training(config("pretrain", "default", "blackwell"), [])
    # Published (field.md §3.4, Megatron-Bridge perf summary 26.08): Ultra at seq 8192 in MXFP8 does 2,528 tokens/s
    # per GB200. NVFP4 adds about 4% on hybrid MoE (Super on GB300: 864 vs 831 TFLOP/s); a B200's dense NVFP4 peak
    # is 0.9 of a GB200's (9 vs 10 PFLOP/s): 2,528 x 1.04 x 0.9 = 2,366 tokens/s per GPU.
    # 20.0T tokens / 2,366 / 3,600 = 2.35 M GPU-h, on 96 x 8 GPUs 3,060 h = 128 days.
    published = ULTRA_TOKENS / (2_528 * 1.04 * 0.9) / 3600
    assert published == pytest.approx(2.35e6, rel=0.01)
    assert e.gpu_hours == pytest.approx(published, rel=0.25)
    assert e.wall_hours == pytest.approx(e.gpu_hours / 768)
    assert e.cpu_core_hours is None and not e.unknown
    assert "MFU of 9 PFLOP/s dense NVFP4 per b200 (assumed)" in e.basis
    assert "20.00T tokens" in e.basis and "6·59.01B active params/token" in e.basis


def test_ultra_pretrain_on_gb300_matches_the_published_rate(home):
    cfg = config("pretrain", "default", "blackwell", "cluster.gpu=gb300")
    e = cost.training(cfg, [])
    # Published: 3,552 tokens/s per GB300 in MXFP8, +4% for NVFP4: 20.0T / 3,694 / 3,600 = 1.50 M GPU-h.
    assert e.gpu_hours == pytest.approx(ULTRA_TOKENS / (3_552 * 1.04) / 3600, rel=0.15)
    # The FLOPs per token behind it: NVIDIA's 1,281 model TFLOP/s at 3,552 tokens/s per GPU = 360.6 GFLOP/token.
    rate = cost.MFU["nvfp4"] * cost.PEAK_TFLOPS["gb300"]["nvfp4"] * 1e12
    assert e.gpu_hours * 3600 * rate / ULTRA_TOKENS == pytest.approx(1_281e12 / 3_552, rel=0.02)


def test_sft_runs_bf16_with_full_recompute_and_long_packs(home):
    e = cost.training(config("sft", "default", "blackwell"), [])
    assert "35% MFU of 2.25 PFLOP/s dense BF16 per b200, x4/3 for full recompute (assumed)" in e.basis
    assert "seq 294,912 (upper bound" in e.basis and "60.40B tokens" in e.basis  # 3,200 x 64 x 294,912
    assert 0 < e.gpu_hours < cost.training(config("pretrain", "default", "blackwell"), []).gpu_hours


def test_a_measured_run_replaces_the_assumption_and_scales_with_train_iters(home):
    cfg = config("pretrain", "tiny", "blackwell", "train.train_iters=40")
    old = manifest(cfg, 900.0, "ultra3-pretrain_20251231-000000-000000", iterations=40)
    newest = manifest(cfg, 412.0, iterations=20)
    unusable = manifest(cfg, None, "ultra3-pretrain_20260102-000000-ffffff", iterations=20)  # no duration
    e = cost.training(cfg, [unusable, newest, old])  # newest first
    assert e.basis == "measured: 6.9 min for 20 iterations by ultra3-pretrain_20260101-000000-abcdef, scaled to 40"
    assert e.wall_hours * 3600 == pytest.approx(412 * 40 / 20)
    assert e.gpu_hours == pytest.approx(e.wall_hours * 1)  # tiny: 1 GPU
    twice = cost.training(config("pretrain", "tiny", "blackwell", "train.train_iters=80"), [newest])
    assert twice.wall_hours == pytest.approx(2 * e.wall_hours)
    # the same manifest against the full run: its GPUs, its 794,728 iterations
    full = cost.training(config("pretrain", "default", "blackwell"), [newest])
    assert full.wall_hours * 3600 == pytest.approx(412 * 794_728 / 20)
    assert full.gpu_hours == pytest.approx(full.wall_hours * 768)


def test_tiny_on_cpu_is_unknown_without_a_measurement(home):
    cfg = config("pretrain", "tiny", None, "run.gpus_per_node=0")
    e = cost.training(cfg, [])
    assert e.unknown.startswith("no GPU (run.gpus_per_node=0)")
    assert (e.wall_hours, e.gpu_hours, e.cpu_core_hours) == (None, None, None)
    assert cost.format_line(e).startswith("pretrain           ? unknown: no GPU")
    measured = cost.training(cfg, [manifest(cfg, 30.0, iterations=40)])
    assert measured.wall_hours * 3600 == pytest.approx(30.0) and measured.gpu_hours is None


def test_a_profile_without_a_gpu_type_is_unknown(home):
    e = cost.training(config("pretrain", "tiny"), [])
    assert e.unknown.startswith("cluster.gpu is unset")


# -- quantization ---------------------------------------------------------------------------------------------


def test_quantize_default_on_gpus(home):
    e = cost.quantize(config("quantize", "default", "blackwell"), [])
    assert not e.unknown and e.gpu_hours == pytest.approx(e.wall_hours * 72)
    # (512 calibration + 2 x 16 held-out windows) x 4,096 tokens = 2.23M; 55B active from the checkpoint's name
    assert "2·55.00B active params/token (from the checkpoint's name) over 2.23M calibration tokens" in e.basis
    assert "checkpoint I/O at 1 GB/s per node (assumed)" in e.basis


def test_quantize_tiny_on_cpu_from_measured_only(home):
    cfg = config("quantize", "tiny")
    assert cost.quantize(cfg, []).unknown.startswith("no GPU")
    e = cost.quantize(cfg, [manifest(cfg, 7.2, "ultra3-quantize_20260101-000000-abcdef")])
    assert e.basis == "measured: 7.2 s by ultra3-quantize_20260101-000000-abcdef"
    assert e.wall_hours * 3600 == pytest.approx(7.2) and e.gpu_hours is None


# -- data prep ------------------------------------------------------------------------------------------------


def test_data_prep_of_the_local_sample_gives_core_hours(home):
    e = cost_data_prep.data_prep(config("data prep pretrain", "tiny"), [])
    text = len(gzip.open(TINY / "corpus.jsonl.gz").read()) + (TINY / "encyclopedia.parquet").stat().st_size
    assert e.cpu_core_hours * 3600 == pytest.approx(text / 4 / cost_data_prep.TEXT_TOKENS_PER_S, rel=1e-3)
    assert e.gpu_hours is None and "local bytes/4" in e.basis and "per core" in e.basis
    assert e.wall_hours is not None  # on this machine's cores
    sft = cost_data_prep.data_prep(config("data prep sft", "tiny"), [])
    assert "HF tokenizers" in sft.basis and sft.cpu_core_hours > 0


def test_data_prep_of_hub_datasets_needs_a_sample_or_a_measurement(home):
    cfg = config("data prep pretrain")
    assert "hf://" in cost_data_prep.data_prep(cfg, []).unknown
    sampled = cost_data_prep.data_prep(config("data prep pretrain", "default", None, "sample=1000"), [])
    assert sampled.cpu_core_hours * 3600 == pytest.approx(12 * 1000 * 2300 / 4 / cost_data_prep.TEXT_TOKENS_PER_S,
                                                          rel=1e-3)
    e = cost_data_prep.data_prep(cfg, [manifest(cfg, 3600.0, "ultra3-data-prep-pretrain_1", tokens=10**9)])
    assert e.basis == "measured: 1 h for 1,000,000,000 tokens by ultra3-data-prep-pretrain_1"
    assert e.wall_hours == pytest.approx(1.0)


# -- total and format -----------------------------------------------------------------------------------------


def test_total_sums_what_is_known_and_counts_the_unknown(home):
    prep = cost_data_prep.data_prep(config("data prep pretrain", "tiny"), [])
    train = cost.training(config("pretrain", "default", "blackwell"), [])
    quant = cost.quantize(config("quantize", "tiny"), [])
    t = cost.total([prep, train, quant])
    assert t.stage == "total" and not t.unknown
    assert t.wall_hours == pytest.approx(prep.wall_hours + train.wall_hours)
    assert t.gpu_hours == train.gpu_hours and t.cpu_core_hours == prep.cpu_core_hours
    assert t.basis == "sum of 2 of 3 stages; unknown: quantize"
    assert cost.total([quant]).unknown == "no stage could be estimated (1 unknown)"


def test_format_line_in_human_units():
    line = cost.format_line(cost.Estimate("pretrain", 41 * 24, 7.6e6, None, "6·55.0B ... (assumed)"))
    assert line == "pretrain           ~ 41 d wall, 7.6 M GPU-h   (6·55.0B ... (assumed))"
    small = cost.format_line(cost.Estimate("data prep sft", 0.5, None, 0.25, "b"))
    assert small == "data prep sft      ~ 30 min wall, 15 core-min   (b)"
    assert "3.5 h wall, 12 k GPU-h, 3 core-s" in cost.format_line(cost.Estimate("x", 3.5, 12_000, 3 / 3600, "b"))
    assert "wall unknown, 410 core-h" in cost.format_line(cost.Estimate("x", None, None, 410, "b"))
    assert "~ <1 s wall, <1 core-s" in cost.format_line(cost.Estimate("x", 1e-5, None, 2e-5, "b"))


def test_every_stage_has_a_cost_model():
    models = {s.name: s.parts().cost.__name__ for s in STAGES}
    assert models == {"pretrain": "training", "sft": "training", "data prep pretrain": "data_prep",
                      "data prep sft": "data_prep", "data prep rl": "data_prep", "quantize": "quantize",
                      "rl rlvr": "rl", "rl teacher": "rl", "rl mopd": "rl", "container build": "image_build",
                      "convert hf-to-megatron": "_cost", "convert megatron-to-hf": "_cost", "eval": "_cost"}
