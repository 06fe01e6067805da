"""`ultra3 rl rlvr|teacher|mopd`: NeMo RL's entry point on Ray over the allocation, its config derived from ours
(settle), its checkpoints an experiment's, its output the final policy in Hugging Face format."""

from __future__ import annotations

from ..nemo_rl_api import TEACHER_ROLES
from ..stage import Input, Output, Parts, Stage

# check_only leaves out NeMo RL (and, over several nodes, the GPUs: the cluster preflight checks them there)
CHECKS = ("python_version", "image", "shared_dir", "nemo_rl", "gpus", "inputs")
DATA = Input("data", "data.dir", ("rl-data",), same_config=False)


def parts() -> Parts:
    from ..cost import rl
    from ..nemo_rl_config import settle
    from ..schema import RL
    from ..validation.rl import validate_rl

    return Parts(RL, validate_rl, rl, settle=settle)


def _rl(step: str, summary: str, inputs: tuple[Input, ...], output: str, examples: tuple[str, ...]) -> Stage:
    return Stage(("rl", step), summary, f"rl/{step}", "rl", "ray", CHECKS, parts, examples=examples, inputs=inputs,
                 outputs=(Output(output, "output_dir"),), outputs_by="experiment", image="rl",
                 compile_cache=True)


RLVR = _rl("rlvr", "Student RLVR: GRPO with verifiable rewards from the SFT policy, NeMo RL on Ray over Slurm.",
           (Input("policy", "policy", ("sft-checkpoint",)), DATA), "rlvr-policy",
           ("ultra3 rl rlvr -c rlvr1 --batch gb200 --dry-run policy=/lustre/ckpt/sft-hf data.dir=/lustre/data/rl "
            "judges.genrm_model=/lustre/models/genrm sandbox.image=/lustre/sandbox.sqsh",
            "ultra3 rl rlvr -c rlvr2 --batch gb200 policy=/lustre/ckpt/rlvr1-hf data.dir=/lustre/data/rl "
            "judges.genrm_url=http://genrm:8000/v1 judges.genrm_model=genrm sandbox.image=/lustre/sandbox.sqsh",
            "ultra3 rl rlvr -c tiny --batch mycluster check_only=true policy=/lustre/ckpt/sft-hf "
            "data.dir=/lustre/data/rl"))
TEACHER = _rl("teacher", "A specialised teacher (ifbench, rlhf, reasoning, swe): RL from the Student RLVR policy.",
              (Input("policy", "policy", ("rlvr-policy",), same_config=False), DATA), "teacher-policy",
              ("ultra3 rl teacher -c ifbench --batch gb200 --dry-run policy=/lustre/ckpt/rlvr-hf "
               "data.dir=/lustre/data/rl judges.genrm_model=/lustre/models/genrm",
               "ultra3 rl teacher -c swe --batch gb200 policy=/lustre/ckpt/rlvr-hf data.dir=/lustre/data/rl "
               "sif_dir=/lustre/sif"))
MOPD = _rl("mopd", "Multi-teacher on-policy distillation of the Student RLVR policy from the teacher panel.",
           (Input("policy", "policy", ("rlvr-policy",), same_config=False), DATA,
            Input("general teacher", "teachers.general", ("rlvr-policy",), same_config=False),
            # each role: its teacher config's output (`rl teacher` with no -c is the ifbench teacher)
            *(Input(f"{role} teacher", f"teachers.{role}", ("teacher-policy",), required=False,
                    configs=(role, "default") if role == "ifbench" else (role,))
              for role in TEACHER_ROLES[1:])), "mopd-policy",
           ("ultra3 rl mopd --batch gb200 --dry-run policy=/lustre/ckpt/rlvr-hf data.dir=/lustre/data/rl "
            "teachers.general=/lustre/ckpt/rlvr-hf judges.genrm_model=/lustre/models/genrm "
            "sandbox.image=/lustre/sandbox.sqsh",))
