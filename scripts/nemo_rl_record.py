"""Regenerate src/ultra3/nemo_rl_api/record.json from a NeMo RL git repository at the pinned commit.

The record is what the launcher knows of NeMo RL's Nemotron 3 Ultra configs without NeMo RL installed: for
each stage YAML under examples/nemo_gym/nemotron-3-ultra/, every key (dotted) with its value, so that the
dry run can check a `nemo_rl.*` override against the real keys (with a did-you-mean) and their types, and
show the config the job will hand to NeMo RL. Long strings (prompts) are recorded by their length only;
the job itself merges our values into the YAML of the NeMo RL checkout in its container.

    git clone https://github.com/NVIDIA-NeMo/RL nemo-rl
    python scripts/nemo_rl_record.py nemo-rl 7ea279abfbeb698b092856d0dab61e7cf39bc909
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "src" / "ultra3" / "nemo_rl_api" / "record.json"
DIRECTORY = "examples/nemo_gym/nemotron-3-ultra"
ENTRY = "examples/nemo_gym/run_grpo_nemo_gym.py"
CONVERTER = "examples/converters/convert_megatron_to_hf.py"
CONFIGS = ("student_rlvr1", "student_rlvr2", "ifbench_teacher", "rlhf_teacher", "reasoning_teacher",
           "swe_teacher", "mopd")
LONGEST = 160  # characters of a recorded string; longer ones are prose (judge prompts)
# Tables NeMo RL hands on without a schema of its own (vLLM engine arguments, the Megatron inference engine's
# settings merged over megatron_cfg, NeMo Gym server configs, HF config overrides, environment variables): any
# key below them is accepted.
OPEN = ("policy.generation.vllm_kwargs", "policy.generation.mcore_generation_config", "policy.hf_config_overrides",
        "policy.megatron_cfg.env_vars",
        "env.nemo_gym", "_teachers", "on_policy_distillation.teacher_model_by_agent_name")


def flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{path}."))
        elif isinstance(value, str) and len(value) > LONGEST:
            flat[path] = {"elided_chars": len(value)}
        else:
            flat[path] = value
    return flat


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repo", help="a NeMo RL git repository (a clone or a bare mirror)")
    parser.add_argument("commit")
    args = parser.parse_args()
    commit = git(args.repo, "rev-parse", args.commit).strip()
    configs = {name: flatten(yaml.safe_load(git(args.repo, "show", f"{commit}:{DIRECTORY}/{name}.yaml")))
               for name in CONFIGS}
    for path in (ENTRY, CONVERTER):
        git(args.repo, "cat-file", "-e", f"{commit}:{path}")  # the record names files that exist there
    record = {"repository": "NVIDIA-NeMo/RL", "commit": commit, "directory": DIRECTORY, "entry": ENTRY,
              "converter": CONVERTER, "open": list(OPEN), "configs": configs}
    OUT.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    print(f"wrote {OUT} ({len(CONFIGS)} configs, {sum(map(len, configs.values()))} keys) at {commit[:12]}")


if __name__ == "__main__":
    main()
