"""Cross-field findings of the RL, data-prep and quantize stages name where each value they quote came from
(a config file, a profile, the command line), through the real CLI in this process."""

from __future__ import annotations

from ultra3.findings import Report
from ultra3.validation.data_prep import validate_data_prep

INPUTS = ("policy=/lustre/ckpt/rlvr-hf", "data.dir=/lustre/data/rl", "judges.genrm_model=/lustre/models/genrm",
          "sandbox.image=/lustre/images/nemo-skills-sandbox.sqsh")
RLVR = ("rl", "rlvr", "-c", "rlvr1", "--batch", "gb200", "--dry-run", *INPUTS)
MOPD = ("rl", "mopd", "--batch", "gb200", "--dry-run", *INPUTS, "teachers.general=/lustre/ckpt/rlvr-hf")
SHARED, RLVR_CFG, MOPD_CFG = "configs/_shared/rl.yaml", "configs/rl/rlvr/default.yaml", "configs/rl/mopd/default.yaml"
TEACHER = "nemo_rl.on_policy_distillation.non_colocated_teachers.default_teacher_cfg"


def error(r, key: str) -> str:
    """The one error line about `key`, without its `error: key: ` start."""
    lines = [line for line in r.err_lines if line.startswith(f"error: {key}: ")]
    assert r.rc == 2 and len(lines) == 1, f"rc {r.rc}\n{r.out}\n{r.err}"
    return lines[0].removeprefix(f"error: {key}: ")


def test_rl_node_count_from_the_command_line_against_the_layout_of_the_config_files(cli_here, gb200):
    message = error(cli_here(*RLVR, "run.nodes=128"), "run.nodes")
    assert message == ("128 (set in command line), but the layout adds up to 256 nodes (64 train + 172 generation + "
                       "20 gym); change layout.* instead [run.nodes=128 from command line; layout.train_nodes=64, "
                       f"layout.generation_nodes=172, layout.gym_nodes=20 from {SHARED}]")


def test_mopd_node_count_names_the_teacher_checkpoints_it_counts(cli_here, gb200):
    message = error(cli_here(*MOPD, "run.nodes=100", "teachers.swe=/lustre/ckpt/swe"), "run.nodes")
    assert message.endswith("[run.nodes=100, teachers.general=/lustre/ckpt/rlvr-hf, teachers.swe=/lustre/ckpt/swe "
                            "from command line; layout.train_nodes=64, layout.generation_nodes=128, "
                            f"layout.nodes_per_teacher=4, layout.gym_nodes=12 from {MOPD_CFG}]"), message


def test_rl_train_nodes_against_the_segment(cli_here, gb200):
    message = error(cli_here(*RLVR, "layout.segment_nodes=128"), "layout.train_nodes")
    assert message.endswith(f"[layout.train_nodes=64 from {SHARED}; layout.segment_nodes=128 from command line]")


def test_rl_batch_arithmetic_names_prompts_and_generations(cli_here, gb200):
    message = error(cli_here(*RLVR, "nemo_rl.grpo.num_generations_per_prompt=8"),
                    "nemo_rl.policy.train_global_batch_size")
    assert message.startswith("8192, but 512 prompts x 8 generations = 4096 samples per step")
    assert message.endswith("[nemo_rl.policy.train_global_batch_size=8192, nemo_rl.grpo.num_prompts_per_step=512 "
                            f"from {RLVR_CFG}; nemo_rl.grpo.num_generations_per_prompt=8 from command line]")


def test_rl_batch_against_the_data_parallel_size_names_what_the_size_comes_from(cli_here, gb200):
    r = cli_here(*RLVR, "nemo_rl.grpo.num_prompts_per_step=8190", "nemo_rl.grpo.num_generations_per_prompt=1",
                 "nemo_rl.policy.train_global_batch_size=8190")
    message = error(r, "nemo_rl.policy.train_global_batch_size")
    megatron = "nemo_rl.policy.megatron_cfg"
    assert message == (f"8190 is not a multiple of the training data-parallel size 4 "
                       f"[nemo_rl.policy.train_global_batch_size=8190 from command line; layout.train_nodes=64, "
                       f"run.gpus_per_node=4 from {SHARED}; {megatron}.tensor_model_parallel_size=8, "
                       f"{megatron}.context_parallel_size=8, {megatron}.pipeline_model_parallel_size=1 "
                       f"from {RLVR_CFG}]")


def test_rl_vllm_engine_against_the_generation_gpus(cli_here, gb200):
    vllm = "nemo_rl.policy.generation.vllm_cfg"
    r = cli_here(*RLVR, f"{vllm}.tensor_parallel_size=24", f"{vllm}.expert_parallel_size=24")
    assert error(r, f"{vllm}.tensor_parallel_size").endswith(
        f"[{vllm}.tensor_parallel_size=24, {vllm}.expert_parallel_size=24 from command line; "
        f"layout.generation_nodes=172, run.gpus_per_node=4 from {SHARED}]")


def test_mopd_teacher_layout_names_its_nodes_and_gpus(cli_here, gb200):
    message = error(cli_here(*MOPD, f"{TEACHER}.expert_model_parallel_size=3"), f"{TEACHER}.expert_model_parallel_size")
    assert message == ("does not divide a teacher's 16 GPUs (layout.nodes_per_teacher x run.gpus_per_node) "
                       f"[{TEACHER}.expert_model_parallel_size=3 from command line; "
                       f"{TEACHER}.pipeline_model_parallel_size=1, layout.nodes_per_teacher=4 from {MOPD_CFG}; "
                       f"run.gpus_per_node=4 from {SHARED}]")


def test_teacher_nodes_outside_mopd_name_the_recipe(cli_here, gb200):
    message = error(cli_here(*RLVR, "layout.nodes_per_teacher=4"), "layout.nodes_per_teacher")
    assert message.endswith(f"[layout.nodes_per_teacher=4 from command line; recipe=student_rlvr1 from {RLVR_CFG}]")


def test_data_prep_packing_names_the_pack_size_of_the_config(cli_here, home):
    message = error(cli_here("data", "prep", "sft", "-c", "tiny", "--dry-run", "pad_seq_to_mult=7"), "pad_seq_to_mult")
    assert message == ("pack_size 512 is not a multiple of pad_seq_to_mult 7; use a pack size like 511 or 518 "
                       "[pad_seq_to_mult=7 from command line; pack_size=512 from configs/data_prep/sft/tiny.yaml]")


def test_data_prep_split_ratios(cli_here, home):
    message = error(cli_here("data", "prep", "sft", "-c", "tiny", "--dry-run", "valid_ratio=0.96"), "valid_ratio")
    assert message.endswith("[valid_ratio=0.96 from command line; test_ratio=0.05 from "
                            "configs/data_prep/sft/tiny.yaml]")


def test_rl_data_prep_sample_against_val_rows(cli_here, home):
    message = error(cli_here("data", "prep", "rl", "-c", "tiny", "--dry-run", "--sample", "5"), "sample")
    assert message.endswith("[sample=5 from command line; val_rows=5 from configs/data_prep/rl/tiny.yaml]"), message


def test_quantize_hf_backend_against_the_job_shape(cli_here, home):
    message = error(cli_here("quantize", "-c", "tiny", "--dry-run", "run.gpus_per_node=8"), "backend")
    assert message == ("the hf backend quantizes in one process, but the job has 1 node(s) x 8 GPU(s); set run.nodes=1 "
                       "run.gpus_per_node=1 (or 0), or backend=megatron [backend=hf, run.nodes=1 from "
                       "configs/quantize/tiny.yaml; run.gpus_per_node=8 from command line]")


def test_quantize_export_layout_names_export_keys_and_the_model_keys_it_keeps(cli_here, home):
    """The export layout is model.* with export.* over it: a value export does not set is quoted as model.*."""
    r = cli_here("quantize", "-c", "tiny", "--dry-run", "backend=megatron", "run.gpus_per_node=4",
                 "export.tensor_model_parallel_size=3")
    lines = [line for line in r.err_lines if line.startswith("error: export.tensor_model_parallel_size: "
                                                             "num_attention_heads=4 is not divisible by TP=3")]
    assert r.rc == 2 and len(lines) == 1, r.err
    assert lines[0].endswith("[export.tensor_model_parallel_size=3 from command line; model.num_attention_heads=4 "
                             "from configs/quantize/tiny.yaml]")


def test_a_rule_run_on_its_own_quotes_no_sources():
    report = Report()
    validate_data_prep({"output_dir": "/tmp/out", "tokenizer": "gpt2", "pack_size": 512, "pad_seq_to_mult": 7,
                        "datasets": [{"name": "a", "path": "hf://org/a"}]}, report)
    assert [f.message for f in report.errors] == ["pack_size 512 is not a multiple of pad_seq_to_mult 7; use a pack "
                                                  "size like 511 or 518"]
