"""A cross-field finding names where each value it quotes came from: a config file, a profile or the command line.

Dry runs of `pretrain -c tiny` through the CLI in this process, with a Slurm profile of 8-GPU H100 nodes."""

from __future__ import annotations

import pytest

from ultra3.findings import Report
from ultra3.validation import batch

PROFILE = '[p]\nexecutor = "slurm"\naccount = "ultra3"\ngpu = "h100"\ngpus_per_node = 8\ntime = "01:00:00"\n'
TINY = "configs/_shared/tiny.yaml"
FROM_PROFILE = "profile 'p' (gpus.toml)"


@pytest.fixture
def dry_run(cli_here, tmp_path):
    env = tmp_path / "gpus.toml"
    env.write_text(PROFILE)

    def run(*overrides: str):
        return cli_here("pretrain", "-c", "tiny", "--batch", "p", "--env-file", str(env), "--dry-run", *overrides)

    return run


def finding(result, start: str) -> str:
    """The one line of the dry run's output (errors or warnings) that starts with `start`."""
    lines = [line for line in (result.err + result.out).splitlines() if line.startswith(start)]
    assert len(lines) == 1, result.err + result.out[:3000]
    return lines[0]


def test_batch_error_names_the_command_line_the_config_file_and_the_profile(dry_run):
    # run.gpus_per_node=null: the job takes the profile's GPUs per node instead of tiny.yaml's 1
    r = dry_run("train.micro_batch_size=2", "run.gpus_per_node=null")
    assert r.rc == 2
    assert finding(r, "error: train.global_batch_size:") == (
        "error: train.global_batch_size: global batch 4 is not divisible by MBS·DP = 2·8 = 16; use a multiple of 16 "
        "(e.g. 16) [train.global_batch_size=4, run.nodes=1, model.tensor_model_parallel_size=1, "
        f"model.pipeline_model_parallel_size=1, model.context_parallel_size=1 from {TINY}; "
        f"train.micro_batch_size=2 from command line; run.gpus_per_node=8 from {FROM_PROFILE}]"
    )


def test_parallelism_error_names_the_sizes_of_the_world_and_the_expert_mesh(dry_run):
    r = dry_run("model.expert_model_parallel_size=32", "run.nodes=2")
    assert r.rc == 2
    assert finding(r, "error: model.expert_model_parallel_size: PP·max") == (
        "error: model.expert_model_parallel_size: PP·max(TP·CP, EP·ETP) = 1·max(1, 32) = 32 GPUs at least, but the "
        "run has 2; add nodes or lower the parallel sizes [model.expert_model_parallel_size=32, run.nodes=2 from "
        "command line; model.pipeline_model_parallel_size=1, model.tensor_model_parallel_size=1, "
        f"model.context_parallel_size=1, model.expert_tensor_parallel_size=1, run.gpus_per_node=1 from {TINY}]"
    )
    assert finding(r, "error: model.expert_model_parallel_size: 16 experts").endswith(
        f"[model.expert_model_parallel_size=32 from command line; model.num_moe_experts=16 from {TINY}]"
    )


def test_sequence_error_names_what_the_padding_multiple_comes_from(dry_run):
    r = dry_run("model.context_parallel_size=2", "model.seq_length=510", "run.nodes=2")
    assert r.rc == 2
    assert finding(r, "error: model.seq_length:") == (
        "error: model.seq_length: seq_length 510 is not a multiple of 4 (2·CP = 4 for CP=2); use 512 or 508 "
        "[model.seq_length=510, model.context_parallel_size=2 from command line; model.tensor_model_parallel_size=1, "
        f"model.sequence_parallel=false from {TINY}]"
    )


def test_schedule_error_names_the_warmup_and_the_run_length(dry_run):
    r = dry_run("scheduler.lr_warmup_iters=40")
    assert r.rc == 2
    assert finding(r, "error: scheduler.lr_warmup_iters:") == (
        "error: scheduler.lr_warmup_iters: warmup 40 iterations ≥ train_iters 40: the run never reaches the peak LR; "
        "use a warmup well below 40 (e.g. 1% = 1) [scheduler.lr_warmup_iters=40 from command line; "
        f"train.train_iters=40 from {TINY}]"
    )


def test_precision_error_names_the_profile_gpu(dry_run):
    r = dry_run("mixed_precision=bf16_with_nvfp4_mixed", "model.mamba_num_heads=16")  # GEMM widths FP8 can take
    assert r.rc == 2
    assert finding(r, "error: mixed_precision:").endswith(
        "or bf16_with_fp8_current_scaling_mixed (FP8, SM 8.9+) [mixed_precision=bf16_with_nvfp4_mixed from command "
        f"line; cluster.gpu=h100 from {FROM_PROFILE}]"
    )


def test_topology_warning_names_the_gpus_per_node(dry_run):
    r = dry_run("model.tensor_model_parallel_size=2", "run.nodes=2")
    assert r.rc == 0, r.err
    assert finding(r, "warning: model.tensor_model_parallel_size:") == (
        "warning: model.tensor_model_parallel_size: TP=2 > 1 GPUs per node: every layer's tensor-parallel "
        "collectives cross the inter-node network; keep TP ≤ 1 (inside the node's NVLink) and scale with PP/EP/DP "
        f"instead [model.tensor_model_parallel_size=2 from command line; run.gpus_per_node=1 from {TINY}]"
    )


def test_keys_no_layer_set_show_as_default_and_unset_ones_are_left_out():
    cfg = {"run": {"nodes": 2, "gpus_per_node": 8}, "train": {"global_batch_size": 12, "micro_batch_size": 1},
           "model": {"tensor_model_parallel_size": 2, "context_parallel_size": None}}
    report = Report(config=cfg, origin={"run.nodes": "command line", "train.global_batch_size": "a.yaml"})
    batch.check(cfg, report)
    assert [f.line() for f in report.findings] == [
        "error: train.global_batch_size: global batch 12 is not divisible by MBS·DP = 1·8 = 8; use a multiple of 8 "
        "(e.g. 8, 16) [train.global_batch_size=12 from a.yaml; train.micro_batch_size=1, run.gpus_per_node=8, "
        "model.tensor_model_parallel_size=2 from default; run.nodes=2 from command line]"
    ]


def test_a_rule_run_on_its_own_quotes_nothing():
    cfg = {"run": {"nodes": 2, "gpus_per_node": 8}, "train": {"global_batch_size": 12, "micro_batch_size": 1}}
    report = Report()
    batch.check(cfg, report)
    assert [f.line() for f in report.findings] == [
        "error: train.global_batch_size: global batch 12 is not divisible by MBS·DP = 1·16 = 16; use a multiple of "
        "16 (e.g. 16)"
    ]
