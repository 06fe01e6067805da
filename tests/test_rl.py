"""The RL stages through the real CLI on this machine: the MOPD dry run on a GB200 profile, bad RL configs
(one line each, exit 2, nothing written or submitted), NeMo RL keys checked against the record of its configs,
and the runtime's merge of our values into NeMo RL's YAML read back."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ultra3 import nemo_rl_api

REPO = Path(__file__).resolve().parents[1]
POLICY, DATA = "policy=/lustre/ckpt/rlvr-hf", "data.dir=/lustre/data/rl"
GENRM = "judges.genrm_model=/lustre/models/genrm"
SANDBOX = "sandbox.image=/lustre/images/nemo-skills-sandbox.sqsh"
MOPD = ("rl", "mopd", "--batch", "gb200", POLICY, DATA, GENRM, SANDBOX, "teachers.general=/lustre/ckpt/rlvr-hf")
RLVR = ("rl", "rlvr", "-c", "rlvr1", "--batch", "gb200", POLICY, DATA, GENRM, SANDBOX)
FIVE_TEACHERS = ["teachers.rlhf=/lustre/ckpt/rlhf", "teachers.ifbench=/lustre/ckpt/ifbench",
                 "teachers.reasoning=/lustre/ckpt/reasoning", "teachers.swe=/lustre/ckpt/swe"]


def test_mopd_default_dry_run_splits_224_nodes(cli, gb200):
    """Five distinct teachers: 64 train / 128 generation / 20 teachers (5 x 4) / 12 gym, as NeMo RL's guide."""
    r = cli(*MOPD, *FIVE_TEACHERS, "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert "nodes 224 x gpus_per_node 4 = 896 GPUs (gb200)" in r.out
    assert "run.nodes" in r.out and "= 224  <- layout: 64 train + 128 generation + 20 teachers + 12 gym" in r.out
    layout = r.out.split("== ray layout (node groups) ==\n")[1].split("\n\n")[0].splitlines()
    assert [line.split("  ")[0].strip() for line in layout] == [
        "nodes 0-63", "nodes 64-191", "nodes 192-195", "nodes 196-199", "nodes 200-203", "nodes 204-207",
        "nodes 208-211", "nodes 212-223"]
    assert layout[2].endswith("teacher general: /lustre/ckpt/rlvr-hf")
    assert layout[6].endswith("teacher swe: /lustre/ckpt/swe")
    assert "#SBATCH --segment=16" in r.out
    # the materialized NeMo RL config: the recorded mopd.yaml with the derived values
    text = r.out.split("with nemo_rl.* merged) ==\n")[1].split("\n== ")[0]
    merged = yaml.safe_load(text)
    assert merged["cluster"] == {"gpus_per_node": 4, "num_nodes": 212, "segment_size": 16}  # the gym comes on top
    assert merged["env"]["nemo_gym"]["num_gpu_nodes"] == 12
    assert merged["policy"]["generation"]["colocated"]["resources"]["num_nodes"] == 128
    assert merged["_teachers"] == {"general": "/lustre/ckpt/rlvr-hf", "rlhf": "/lustre/ckpt/rlhf",
                                   "ifbench": "/lustre/ckpt/ifbench", "reasoning": "/lustre/ckpt/reasoning",
                                   "swe": "/lustre/ckpt/swe"}
    assert merged["checkpointing"]["checkpoint_must_save_by"] == "00:03:36:00"  # run.time 4 h less 24 min
    teacher = merged["on_policy_distillation"]["non_colocated_teachers"]["default_teacher_cfg"]
    assert (teacher["tensor_model_parallel_size"], teacher["context_parallel_size"],
            teacher["expert_model_parallel_size"], teacher["num_nodes"]) == (8, 2, 16, 4)
    assert merged["grpo"]["adv_estimator"]["name"] == "opd"
    assert merged["checkpointing"]["checkpoint_dir"].endswith("/ultra3-rl-mopd/ultra-mopd/checkpoints")
    assert "#SBATCH --nodes=224" in r.out and "#SBATCH --gpus-per-node=4" in r.out
    # NeMo Skills' sandbox beside the job step on every node
    assert "srun --overlap --nodes=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 " \
           "--container-image=/lustre/images/nemo-skills-sandbox.sqsh" in r.out


def test_mopd_teachers_falling_back_share_the_general_nodes(cli, gb200):
    """NeMo RL serves each distinct teacher checkpoint once and gives training the rest of its cluster: with
    only the general teacher, 4 teacher nodes, not 20 (the other 16 would land in training)."""
    r = cli(*MOPD, "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert "= 208  <- layout: 64 train + 128 generation + 4 teachers + 12 gym" in r.out
    assert "nodes 192-195  teacher general/rlhf/ifbench/reasoning/swe: /lustre/ckpt/rlvr-hf" in r.out
    merged = yaml.safe_load(r.out.split("with nemo_rl.* merged) ==\n")[1].split("\n== ")[0])
    assert merged["cluster"]["num_nodes"] == 196 and merged["_teachers"]["swe"] == "${_teachers.general}"


def test_rlvr_phases_share_one_experiment(cli, gb200):
    """rlvr2 resumes rlvr1: the same checkpoint directory, its own sequence length and step budget."""
    dirs, steps = [], []
    for config in ("rlvr1", "rlvr2"):
        r = cli("rl", "rlvr", "-c", config, "--batch", "gb200", POLICY, DATA, GENRM, SANDBOX, "--dry-run", "--full")
        assert r.rc == 0, r.err
        merged = yaml.safe_load(r.out.split("with nemo_rl.* merged) ==\n")[1].split("\n== ")[0])
        dirs.append(merged["checkpointing"]["checkpoint_dir"])
        steps.append((merged["grpo"]["max_num_steps"], merged["policy"]["max_total_sequence_length"],
                      merged["grpo"]["num_prompts_per_step"] * merged["grpo"]["num_generations_per_prompt"],
                      merged["policy"]["train_global_batch_size"]))
        assert "nodes 256 x gpus_per_node 4" in r.out
    assert dirs[0] == dirs[1] and dirs[0].endswith("/ultra3-rl-rlvr/ultra-student-rlvr/checkpoints")
    assert steps == [(128, 49152, 8192, 8192), (178, 65536, 8192, 8192)]


def test_steps_against_the_experiments_checkpoints(cli, gb200, tmp_path):
    """rlvr1's 128 steps already done (NeMo RL's step_128, beside an unfinished tmp_step_136): phase 1 has
    nothing left, phase 2 resumes from step 128."""
    outputs = tmp_path / "jobs" / "experiments" / "outputs"
    checkpoints = outputs / "ultra3-rl-rlvr" / "ultra-student-rlvr" / "checkpoints"
    for step in ("step_64", "step_128", "tmp_step_136"):
        (checkpoints / step).mkdir(parents=True)
    where = f"run.job_dir={tmp_path / 'jobs'}"
    done = cli(*RLVR, where, "--dry-run")
    assert done.rc == 2 and "error: max_steps: 128, but experiment 'ultra-student-rlvr' is already at step 128: " \
                              "nothing to train; raise max_steps or name a new experiment" in done.err, done.err
    phase2 = cli("rl", "rlvr", "-c", "rlvr2", "--batch", "gb200", POLICY, DATA, GENRM, SANDBOX, where, "--dry-run")
    assert phase2.rc == 0 and "note: experiment: 'ultra-student-rlvr' resumes from step 128" in phase2.out, phase2.err


def test_nemo_rl_add_takes_keys_the_yaml_lacks(cli, gb200):
    r = cli(*RLVR, "nemo_rl_add.cluster.master_port_range_low=20000", "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert "warning: nemo_rl_add.cluster.master_port_range_low: not in NeMo RL's " in r.out
    merged = yaml.safe_load(r.out.split("with nemo_rl.* merged) ==\n")[1].split("\n== ")[0])
    assert merged["cluster"]["master_port_range_low"] == 20000


def test_mtp_switch_sets_vllm_speculative_decoding(cli, gb200):
    r = cli(*RLVR, "mtp.enabled=true", "--dry-run", "--full")
    assert r.rc == 0, r.err
    merged = yaml.safe_load(r.out.split("with nemo_rl.* merged) ==\n")[1].split("\n== ")[0])
    kwargs = merged["policy"]["generation"]["vllm_kwargs"]
    assert kwargs["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 5}
    assert kwargs["max_num_batched_tokens"] == 8480 and kwargs["compilation_config"]["cudagraph_capture_sizes"] is None


# (id, extra args, the one error line's pattern); each on a config that is otherwise valid
BAD = [
    ("segment", ["layout.gym_nodes=19"], r"layout: 64 train \+ 172 generation \+ 19 gym = 255 nodes, not a multiple of "
                                          r"the 16-node NVLink segment"),
    ("segment-size", ["layout.segment_nodes=0"], r"layout\.segment_nodes: must be 1 or more, got 0"),
    ("no-train-nodes", ["layout.train_nodes=0", "layout.generation_nodes=188"],
     r"layout\.train_nodes: must be 1 or more"),
    ("no-generation-nodes", ["layout.generation_nodes=0", "layout.gym_nodes=192"],
     r"layout\.generation_nodes: must be 1 or more \(vLLM runs on its own nodes\)"),
    ("colocated-with-generation-nodes", ["layout.colocated=true", "layout.gym_nodes=32"],
     r"layout\.generation_nodes: is 172, but layout\.colocated"),
    ("teacher-nodes-outside-mopd", ["layout.nodes_per_teacher=4"],
     r"layout\.nodes_per_teacher: is 4, but student_rlvr1 has no teacher panel"),
    ("run-nodes-disagree", ["run.nodes=128"],
     r"run\.nodes: 128 \(set in command line\), but the layout adds up to 256"),
    ("tp-cp-vs-train-gpus", ["nemo_rl.policy.megatron_cfg.context_parallel_size=6"],
     r"nemo_rl\.policy\.megatron_cfg: TP·CP·PP = 48 does not divide the 256 training GPUs"),
    ("train-nodes-vs-segment", ["layout.segment_nodes=128"],
     r"layout\.train_nodes: 64 is not a multiple of the 128-node NVLink segment"),
    ("ep-vs-train-gpus", ["nemo_rl.policy.megatron_cfg.expert_model_parallel_size=96"],
     r"nemo_rl\.policy\.megatron_cfg\.expert_model_parallel_size: EP·ETP·PP = 96 does not divide the 256"),
    ("vllm-tp-vs-generation-gpus", ["nemo_rl.policy.generation.vllm_cfg.tensor_parallel_size=24",
                                    "nemo_rl.policy.generation.vllm_cfg.expert_parallel_size=24"],
     r"nemo_rl\.policy\.generation\.vllm_cfg\.tensor_parallel_size: a vLLM engine takes max\(TP, EP\)·PP = 24 GPUs, "
     r"which does not divide the 688"),
    ("vllm-ep-not-multiple-of-tp", ["nemo_rl.policy.generation.vllm_cfg.expert_parallel_size=2"],
     r"nemo_rl\.policy\.generation\.vllm_cfg\.expert_parallel_size: 2 is not a multiple of vLLM's TP 8"),
    ("vllm-ep-dp-with-async", ["nemo_rl.policy.generation.vllm_cfg.expert_parallel_size=16"],
     r"nemo_rl\.policy\.generation\.vllm_cfg\.expert_parallel_size: 16 with TP 8 runs vLLM data-parallel, .*"
     r"NVIDIA-NeMo/RL#1101"),
    ("gbs-arithmetic", ["nemo_rl.grpo.num_generations_per_prompt=8"],
     r"nemo_rl\.policy\.train_global_batch_size: 8192, but 512 prompts x 8 generations = 4096 samples"),
    ("gbs-vs-dp", ["nemo_rl.grpo.num_prompts_per_step=8190", "nemo_rl.grpo.num_generations_per_prompt=1",
                   "nemo_rl.policy.train_global_batch_size=8190"],
     r"nemo_rl\.policy\.train_global_batch_size: 8190 is not a multiple of the training data-parallel size 4"),
    ("generation-longer-than-sequence", ["nemo_rl.policy.generation.max_new_tokens=65536"],
     r"nemo_rl\.policy\.generation\.max_new_tokens: 65536 exceeds policy\.max_total_sequence_length 49152"),
    ("vllm-shorter-than-sequence", ["nemo_rl.policy.generation.vllm_cfg.max_model_len=32768"],
     r"nemo_rl\.policy\.generation\.vllm_cfg\.max_model_len: 32768 is shorter than policy\.max_total_sequence_length"),
    ("unknown-nemo-rl-key", ["nemo_rl.policy.megatron_cfg.tensor_parallel_size=8"],
     r"nemo_rl\.policy\.megatron_cfg\.tensor_parallel_size: not a key of NeMo RL's examples/nemo_gym/nemotron-3-ultra/"
     r"student_rlvr1\.yaml at [0-9a-f]{12} \(set in command line\); did you mean "
     r"policy\.megatron_cfg\.tensor_model_parallel_size\?"),
    ("nemo-rl-key-type", ["nemo_rl.grpo.num_prompts_per_step=many"],
     r"nemo_rl\.grpo\.num_prompts_per_step: NeMo RL's student_rlvr1\.yaml has a number here \(512\), not a string"),
    ("derived-nemo-rl-key", ["nemo_rl.cluster.num_nodes=300"],
     r"nemo_rl\.cluster\.num_nodes: is set by the launcher from layout \(set in command line\); set that instead"),
    ("unknown-recipe", ["recipe=student_rlvr3"], r"recipe: 'student_rlvr3' is not one of NeMo RL's Ultra configs"),
    ("missing-judge", ["judges.genrm_model=null"], r"judges\.genrm_model: student_rlvr1 scores with the genrm judge"),
    ("judge-url", ["judges.nl2bash_url=nl2bash:8000"],
     r"judges\.nl2bash_url: 'nl2bash:8000' is not an http\(s\):// URL"),
    ("judge-url-without-name", ["judges.genrm_model=null", "judges.genrm_url=http://genrm:8000/v1"],
     r"judges\.genrm_model: student_rlvr1 scores with the genrm judge: "
     r"set the name of the model judges\.genrm_url serves"),
    ("judges-vs-gym-gpus", ["layout.gym_nodes=4", "layout.generation_nodes=188"],
     r"layout\.gym_nodes: 4 nodes = 16 GPUs, but the judges served there need 40 \(genrm TP x DP = 16, "
     r"nl2bash TP x DP = 16, safety TP x DP = 8\)"),
    ("sandbox", ["sandbox.image=null"], r"sandbox\.image: student_rlvr1's Gym runs code in NeMo Skills' sandbox"),
    ("nemo-rl-add-known-key", ["nemo_rl_add.grpo.seed=7"], r"nemo_rl_add\.grpo\.seed: is a key of NeMo RL's"),
    ("teacher-outside-mopd", ["teachers.swe=/lustre/ckpt/swe"], r"teachers\.swe: student_rlvr1 has no teacher panel"),
    ("sif-outside-swe", ["sif_dir=/lustre/sif"], r"sif_dir: student_rlvr1 runs no SWE instances"),
    ("max-steps", ["max_steps=0"], r"max_steps: must be 1 or more"),
    ("no-gpus", ["run.gpus_per_node=0"], r"run\.gpus_per_node: RL needs GPUs on every node, got 0"),
    ("experiment-name", ["experiment=a/b"], r"experiment: names the run's checkpoint directory"),
    ("mtp-tokens", ["mtp.enabled=true", "mtp.num_speculative=0"], r"mtp\.num_speculative: must be 1 or more"),
    ("blend", ["data.blend=null"], r"data\.blend: names a blend of `ultra3 data prep rl`'s output"),
]
MOPD_BAD = [
    ("mopd-no-general-teacher", ["teachers.general="],
     r"teachers\.general: no rlvr-policy artifact for profile 'gb200' in .*: rl mopd needs its general teacher input"),
    ("mopd-no-teacher-nodes", ["layout.nodes_per_teacher=0", "layout.gym_nodes=32"],
     r"layout\.nodes_per_teacher: MOPD serves each teacher on its own nodes"),
    ("mopd-teachers-vs-segment", ["teachers.swe=/lustre/ckpt/swe"],
     r"layout: 64 train \+ 128 generation \+ 8 teachers \+ 12 gym = 212 nodes, not a multiple of the 16-node"),
    ("mopd-teacher-layout", ["nemo_rl.on_policy_distillation.non_colocated_teachers.default_teacher_cfg."
                             "context_parallel_size=3"],
     r"nemo_rl\.on_policy_distillation\.non_colocated_teachers\."
     r"default_teacher_cfg: a teacher's TP·CP·PP = 24 does not divide"),
]


@pytest.mark.parametrize("name,extra,pattern", [(*c,) for c in BAD], ids=[c[0] for c in BAD])
def test_bad_rlvr_config(cli_here, gb200, name, extra, pattern):
    _one_error(cli_here(*RLVR, *extra), gb200, pattern)


@pytest.mark.parametrize("name,extra,pattern", [(*c,) for c in MOPD_BAD], ids=[c[0] for c in MOPD_BAD])
def test_bad_mopd_config(cli_here, gb200, name, extra, pattern):
    _one_error(cli_here(*MOPD, *extra), gb200, pattern)


def test_swe_teacher_needs_its_images(cli, gb200):
    _one_error(cli("rl", "teacher", "-c", "swe", "--batch", "gb200", POLICY, DATA), gb200,
               r"sif_dir: swe_teacher runs each SWE instance in its apptainer image: set sif_dir")


def _one_error(r, home: Path, pattern: str) -> None:
    errors = [line for line in r.err.splitlines() if line.startswith("error: ")]
    assert r.rc == 2, f"rc {r.rc}\n{r.out}\n{r.err}"
    assert len(errors) == 1 and re.match("error: " + pattern, errors[0]), r.err
    assert "Traceback" not in r.out + r.err
    assert not home.exists() or not any(home.iterdir()), f"written: {list(home.rglob('*'))}"  # nor submitted


def test_record_matches_the_pinned_configs():
    """The record holds every Ultra YAML of NeMo RL at one commit, with the published shapes."""
    assert re.fullmatch(r"[0-9a-f]{40}", nemo_rl_api.commit())
    assert nemo_rl_api.names() == ["student_rlvr1", "student_rlvr2", "ifbench_teacher", "rlhf_teacher",
                                   "reasoning_teacher", "swe_teacher", "mopd"]
    rlvr1 = nemo_rl_api.keys("student_rlvr1")
    assert (rlvr1["policy.max_total_sequence_length"], rlvr1["policy.train_global_batch_size"],
            rlvr1["policy.megatron_cfg.tensor_model_parallel_size"],
            rlvr1["policy.megatron_cfg.expert_model_parallel_size"]) == (49152, 8192, 8, 64)
    assert nemo_rl_api.keys("mopd")["_teachers.rlhf"] == "${_teachers.general}"
    assert nemo_rl_api.known("student_rlvr1", "policy.generation.vllm_kwargs.speculative_config.method")
    assert not nemo_rl_api.known("student_rlvr1", "policy.megatron_cfg.tensor_parallel_size")


def test_runtime_merges_our_values_into_nemo_rl_yaml(tmp_path):
    """recipes.rl writes NeMo RL's own YAML (here: a checkout's file) with `nemo_rl` merged in, and W&B on only
    when the key reached the job."""
    from recipes import rl

    files = nemo_rl_api.files()
    checkout = tmp_path / "nemo-rl" / files["directory"]
    checkout.mkdir(parents=True)
    (checkout / "mopd.yaml").write_text("cluster: {num_nodes: 256, gpus_per_node: 4}\n_teachers:\n"
                                        "  general: /path/to/general_teacher\n  swe: ${_teachers.general}\n"
                                        "logger: {wandb_enabled: false, log_dir: logs}\n")
    cfg = {"nemo_rl_dir": str(tmp_path / "nemo-rl"), "recipe": "mopd",
           "job": {"dir": str(tmp_path), "stage": "rl mopd", "nemo_rl": files},
           "nemo_rl": {"cluster": {"num_nodes": 212}, "_teachers": {"general": "/ckpt/rlvr"}}}
    path = rl.write_config(cfg, "/ckpt/rlvr-hf")
    written = yaml.safe_load(Path(path).read_text())
    assert written == {"cluster": {"num_nodes": 212, "gpus_per_node": 4},
                       "_teachers": {"general": "/ckpt/rlvr", "swe": "${_teachers.general}"},
                       "logger": {"wandb_enabled": False, "log_dir": "logs"}, "policy": {"model_name": "/ckpt/rlvr-hf"}}
    env = {"WANDB_API_KEY": "x", "PATH": "/usr/bin"}
    code = ("import sys, yaml; from recipes import rl; "
            f"cfg = yaml.safe_load({yaml.safe_dump(cfg)!r}); p = rl.write_config(cfg, 'm'); "
            "print(yaml.safe_load(open(p))['logger']['wandb_enabled'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr
