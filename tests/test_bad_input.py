"""Bad input, through the CLI's own entry point (in this process): every mistake is exit 2 with one line per
error naming the key or file, no traceback, nothing written under $NEMOTRON_HOME and, where a Slurm profile
would submit, no new job in the queue."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from conftest import our_jobs

# Profiles with one mistake each, read with --env-file bad.toml.
BAD_TOML = """
[typo]
executor = "slurm"
container_image = ""
account = "ultra3"
acount = "ultra3"

[localacct]
executor = "local"
account = "ultra3"

[wrongtype]
executor = "slurm"
container_image = ""
account = "ultra3"
gpus_per_node = "eight"

[gputype]
executor = "slurm"
container_image = ""
account = "ultra3"
gpu = 8

[noexec]
account = "ultra3"

[badexec]
executor = "k8s"

[loop1]
extends = "loop2"

[loop2]
extends = "loop1"

[orphan]
extends = "nosuch"

[extnum]
extends = 3

[secret]
executor = "slurm"
container_image = ""
account = "ultra3"
[secret.env]
HF_TOKEN = "hf_FAKEsecretvalue123"

[noacct]
executor = "slurm"
container_image = ""
partition = "debug"
gpu = "b200"

[ssh]
executor = "slurm"
container_image = ""
account = "ultra3"
host = "login.example.com"
"""

NVFP4 = "nemotron_3_ultra_bf16_with_nvfp4_mixed"
PROFILES = "blackwell, ci, ci-cpu, hopper, workstation"


@dataclass
class Case:
    id: str
    args: list[str]
    errors: list[str]  # one regex per stderr line, matched after "error: "
    files: dict[str, str | None] = field(default_factory=dict)  # written in the cwd first; None removes
    env: dict[str, str] = field(default_factory=dict)
    prog: str = "ultra3"
    submits: bool = False  # a Slurm profile without --dry-run: a job would be queued if this got through
    hidden: tuple[str, ...] = ()  # must not be echoed anywhere (secret values)


CASES = [
    # -- configs ---------------------------------------------------------------------------------------
    Case("config-missing-name", ["pretrain", "-c"], [r"Option '-c' requires an argument\.$"]),
    Case("config-unknown-name-eq", ["pretrain", "--config=nope", "-d"],
         [r"--config: no config 'nope' for this stage; choose one of: default, long_context, smoke, tiny, tiny_phases, "
          r"or give a path$"]),
    Case("config-unknown-name-before-stage", ["--config", "nope", "sft", "-d"],
         [r"--config: no config 'nope' for this stage; choose one of: default, tiny"]),
    # a Megatron-Bridge key not in its 0.6.x config classes (the schema comes from the recorded API)
    Case("mb-key-misspelt", ["pretrain", "-c", "tiny", "-d", "checkpoint.most_recent=2", "model.moe_router_dtyp=fp32"],
         [r"model.moe_router_dtyp: unknown key \(set in command line\); did you mean 'moe_router_dtype'\?$",
          r"checkpoint.most_recent: unknown key \(set in command line\); did you mean 'most_recent_k'\?$"]),
    Case("mb-key-wrong-type", ["sft", "-c", "tiny", "-d", "dataset.offline_packing_specs.pad_cu_seqlens=maybe"],
         [r"dataset.offline_packing_specs.pad_cu_seqlens: must be true/false, got 'maybe' \(set in command line\)$"]),
    Case("mb-key-in-file", ["pretrain", "-c", "./mine.yaml", "-d"],
         [r"optimizer.adam_epsilon: unknown key \(set in .*mine.yaml\); did you mean 'adam_eps'\?$"],
         files={"mine.yaml": "defaults: [tiny]\noptimizer:\n  adam_epsilon: 1.0e-8\n"}),
    Case("config-short-option-equals", ["pretrain", "-c=tiny", "-d"], [r"--config: no config '=tiny' for this stage"]),
    Case("config-missing-path", ["pretrain", "-c", "./missing.yaml", "-d"],
         [r"--config: no such file '\./missing\.yaml'$"]),
    Case("config-invalid-yaml", ["pretrain", "-c", "./bad.yaml", "-d"],
         [r"\S*/bad\.yaml:2: invalid YAML: found character '\\t'"],
         files={"bad.yaml": "train:\n\ttrain_iters: 1\n"}),
    Case("config-not-a-mapping", ["pretrain", "-d", "-c", "./list.yaml"],
         [r"\S*/list\.yaml: must be a mapping of keys, got list$"], files={"list.yaml": "- a\n- b\n"}),
    Case("config-circular-defaults", ["-c", "./a.yaml", "pretrain", "-d"],
         [r"\S*/a\.yaml: circular defaults: \S*/a\.yaml -> \S*/b\.yaml -> \S*/a\.yaml$"],
         files={"a.yaml": "defaults: [b]\n", "b.yaml": "defaults: [a]\n"}),
    Case("config-defaults-missing-base", ["pretrain", "-c", "./orphan.yaml", "-d"],
         [r"\S*/orphan\.yaml: defaults names 'nosuchbase', which is not a config next to it or of this stage$"],
         files={"orphan.yaml": "defaults: [nosuchbase]\n"}),
    Case("config-defaults-not-names", ["pretrain", "-c", "./baddef.yaml", "-d"],
         [r"\S*/baddef\.yaml: defaults must be a config name or a list of names, got 3$"],
         files={"baddef.yaml": "defaults: 3\n"}),
    Case("config-file-unknown-key", ["pretrain", "-c", "./typo.yaml", "-d"],
         [r"model\.tensor_parallel_size: unknown key \(set in \S*/typo\.yaml\); "
          r"did you mean 'tensor_model_parallel_size'\?$"],
         files={"typo.yaml": "defaults: [tiny]\nmodel:\n  tensor_parallel_size: 2\n"}),
    # -- overrides -------------------------------------------------------------------------------------
    Case("override-did-you-mean", ["pretrain", "-c", "tiny", "--batch", "ci", "model.tensor_parallel_size=2"],
         [r"model\.tensor_parallel_size: unknown key \(set in command line\); "
          r"did you mean 'tensor_model_parallel_size'\?$"], submits=True),
    Case("override-null-section", ["pretrain", "-c", "tiny", "-d", "model=null"],
         [r"model: must be a table of keys, got None \(set in command line\)$"]),
    Case("override-cluster-key-under-run", ["pretrain", "-c", "tiny", "-d", "run.gpu=h100"],
         [r"run\.gpu: unknown key; the machines are described by cluster\.gpu$"]),
    Case("env-file-missing-without-profile", ["pretrain", "-c", "tiny", "-d", "--env-file", "nope.toml"],
         [r"--env-file: no such file 'nope\.toml'$"]),
    Case("override-unknown-section", ["pretrain", "-c", "tiny", "-d", "foo.bar=1"],
         [r"foo: unknown key \(set in command line\); known keys: .*\bmodel\b.*\btrain\b"]),
    Case("override-wrong-int", ["pretrain", "--batch=ci", "--config=tiny", "train.train_iters=abc"],
         [r"train\.train_iters: must be an integer, got 'abc' \(set in command line\)$"], submits=True),
    Case("override-wrong-bool", ["-d", "pretrain", "-c", "tiny", "model.sequence_parallel=maybe"],
         [r"model\.sequence_parallel: must be true/false, got 'maybe' \(set in command line\)$"]),
    Case("override-no-equals", ["pretrain", "-c", "tiny", "notakv", "-d"],
         [r"'notakv': not an option or a key=value override; overrides look like model\.seq_length=4096$"]),
    Case("override-bad-key", ["pretrain", "-c", "tiny", "-d", "1abc=2"],
         [r"'1abc=2': '1abc' is not a dotted config key"]),
    Case("override-empty-key-segment", ["pretrain", "-c", "tiny", "-d", "model..x=1"],
         [r"'model\.\.x=1': 'model\.\.x' is not a dotted config key"]),
    Case("override-job-dir", ["pretrain", "-c", "tiny", "job.dir=x", "-d"],
         [r"job\.dir: job\.\* is set by the launcher for each job \(set in command line\); remove it$"]),
    Case("override-job-value", ["pretrain", "-c", "tiny", "job=5", "-d"],
         [r"job: job\.\* is set by the launcher for each job \(set in command line\); remove it$"]),
    Case("override-unparsable-value", ["pretrain", "-c", "tiny", "-d", "model.recompute_modules=[a"],
         [r"'model\.recompute_modules=\[a': cannot parse the value '\[a'; quote strings"]),
    Case("override-value-for-table", ["pretrain", "-c", "tiny", "-d", "train=5"],
         [r"train: must be a table of keys, got 5 \(set in command line\)$"]),
    Case("override-table-for-value", ["pretrain", "-c", "tiny", "-d", "model.num_layers.x=1"],
         [r"model\.num_layers: must be an integer, got \{'x': 1\} \(set in command line\)$"]),
    Case("override-run-null", ["pretrain", "-c", "tiny", "-d", "run=null"],
         [r"run: must be a table of keys, got None \(set in command line\)$"]),
    Case("override-cluster-value", ["pretrain", "-c", "tiny", "--batch", "ci", "cluster=8"],
         [r"cluster: must be a table of keys, got 8 \(set in command line\)$"], submits=True),
    Case("override-list-item-type", ["pretrain", "-c", "tiny", "-d", "model.recompute_modules=[1,2]"],
         [r"model\.recompute_modules: must be a list of str, got \[1, 2\] \(set in command line\)$"]),
    Case("override-dangling-interpolation", ["pretrain", "-c", "tiny", "-d", "checkpoint.save=${nope.x}"],
         [r"checkpoint\.save: cannot resolve the interpolation: .*'nope\.x'"]),
    Case("override-secret-reference", ["pretrain", "-c", "tiny", "-d", "logger.wandb_project=${oc.env:WANDB_API_KEY}"],
         [r"logger\.wandb_project: references the secret WANDB_API_KEY \(set in command line\); "]),
    Case("override-secret-value", ["pretrain", "-c", "tiny", "--batch", "ci", "run.env.HF_TOKEN=hf_FAKEcli12345"],
         [r"run\.env\.HF_TOKEN: a secret would be written to the job dir \(set in command line\); .*export HF_TOKEN"],
         submits=True, hidden=("hf_FAKEcli12345",)),
    Case("override-slurm-key-locally", ["pretrain", "-c", "tiny", "run.time=01:00:00", "-d"],
         [r"run\.time: is only used by the slurm executor, not local; "]),
    Case("override-data-prep-unknown-section", ["data", "prep", "sft", "-c", "tiny", "model.seq_length=4", "-d"],
         [r"model: unknown key \(set in command line\); known keys: .*\bpack_size\b"]),
    # -- profiles --------------------------------------------------------------------------------------
    Case("profile-unknown", ["pretrain", "-c", "tiny", "--run", "mycluster", "-d"],
         [rf"--run 'mycluster': no such profile in \S*/env\.toml \(profiles: {PROFILES}\)$"]),
    Case("profile-unknown-did-you-mean", ["--batch=hoper", "pretrain", "-c", "tiny"],
         [r"--batch 'hoper': no such profile in \S*env\.toml \(profiles: .*\); did you mean 'hopper'\?$"]),
    Case("profile-no-env-toml", ["pretrain", "-c", "tiny", "--run", "ci", "-d"],
         [r"--run ci: no env\.toml found \(looked in --env-file, \$NEMOTRON_ENV_FILE, and from the current "
          r"directory upwards\); copy env\.toml\.example to \./env\.toml$"], files={"env.toml": None}),
    Case("profile-env-file-missing", ["pretrain", "-c", "tiny", "--env-file", "/nonexistent/env.toml", "--run",
                                      "ci", "-d"], [r"--env-file: no such file '/nonexistent/env\.toml'$"]),
    # the cwd's env.toml has a Slurm `ci`: the missing file must not fall back to it
    Case("profile-env-file-missing-eq-before-stage",
         ["--env-file=nope.toml", "pretrain", "--batch", "ci", "-c", "tiny"],
         [r"--env-file: no such file 'nope\.toml'$"], submits=True),
    Case("profile-env-var-missing", ["pretrain", "-c", "tiny", "--batch", "ci"],
         [r"NEMOTRON_ENV_FILE: no such file '/nonexistent/x\.toml'$"], env={"NEMOTRON_ENV_FILE": "/nonexistent/x.toml"},
         submits=True),
    Case("profile-unknown-key", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--batch", "typo"],
         [r"bad\.toml \[typo\] acount: unknown key; did you mean 'account'\?$"], submits=True),
    Case("profile-key-of-other-executor", ["pretrain", "-c", "tiny", "--env-file=bad.toml", "--run=localacct", "-d"],
         [r"bad\.toml \[localacct\] account: is only used by the slurm executor, not local; "]),
    Case("profile-wrong-type", ["--env-file", "bad.toml", "pretrain", "-c", "tiny", "--batch", "wrongtype"],
         [r"bad\.toml \[wrongtype\] gpus_per_node: must be an integer >= 0, got 'eight'$"], submits=True),
    Case("profile-wrong-type-cluster-key", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--batch", "gputype"],
         [r"bad\.toml \[gputype\] gpu: must be a string, got 8$"], submits=True),
    Case("profile-missing-executor", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--run", "noexec", "-d"],
         [r"bad\.toml \[noexec\]: executor is none; set executor = \"local\" or \"slurm\" or \"ray\"$"]),
    Case("profile-unknown-executor", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--run", "badexec", "-d"],
         [r"bad\.toml \[badexec\]: executor is 'k8s'; set executor = \"local\" or \"slurm\" or \"ray\"$"]),
    Case("profile-circular-extends", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--run", "loop1", "-d"],
         [r"bad\.toml: circular extends: loop1 -> loop2 -> loop1$"]),
    Case("profile-extends-unknown", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--run", "orphan", "-d"],
         [r"\[orphan\] extends 'nosuch': no such profile in bad\.toml \(profiles: "]),
    Case("profile-extends-not-a-name", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--run", "extnum", "-d"],
         [r"bad\.toml \[extnum\]: extends must be a profile name, got 3$"]),
    Case("profile-secret-env", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--batch", "secret"],
         [r"bad\.toml \[secret\] env\.HF_TOKEN: secrets don't belong in env\.toml: export HF_TOKEN where you "
          r"submit from"], submits=True, hidden=("hf_FAKEsecretvalue123",)),
    Case("profile-invalid-toml", ["pretrain", "-c", "tiny", "--batch", "ci"],
         [r"\S*/env\.toml: invalid TOML: .*line 2"],
         files={"env.toml": '[ci]\nexecutor = "slurm\naccount = "ultra3"\n'}, submits=True),
    Case("profile-top-level-value", ["pretrain", "-c", "tiny", "--batch", "ci"],
         [r"\S*/env\.toml: top-level key 'executor' must be a \[profile\] table$"],
         files={"env.toml": 'executor = "slurm"\n[ci]\nexecutor = "slurm"\naccount = "ultra3"\n'}, submits=True),
    # -- flags -----------------------------------------------------------------------------------------
    Case("flag-unknown", ["pretrain", "-c", "tiny", "--frobnicate"],  # none near it: no `Possible options:`
         [r"No such option: --frobnicate \(see 'ultra3 pretrain --help'\)$"]),
    Case("flag-unknown-before-stage", ["--foo", "pretrain", "-c", "tiny"],
         [r"No such option: --foo \(see 'ultra3 --help'\)$"]),
    Case("flag-unknown-nemotron", ["ultra3", "pretrain", "-c", "tiny", "--frobnicate"],
         [r"No such option: --frobnicate \(see 'nemotron ultra3 pretrain --help'\)$"], prog="nemotron"),
    # NVIDIA's CLI turns `--sample 100` into sample=True: here it is refused
    Case("flag-data-prep-only", ["pretrain", "-c", "tiny", "--sample", "100"],
         [r"No such option: --sample \(see 'ultra3 pretrain --help'\)$"]),
    Case("flag-sample-without-value", ["data", "prep", "pretrain", "-c", "tiny", "--sample"],
         [r"Option '--sample' requires an argument\.$"]),
    Case("flag-unknown-stage", ["pretrian", "-c", "tiny"], [r"No such command 'pretrian'\. Did you mean 'pretrain'\?"]),
    Case("flag-run-without-value", ["pretrain", "-c", "tiny", "--run"], [r"Option '--run' requires an argument\.$"]),
    Case("flag-batch-without-value-short", ["-c", "tiny", "pretrain", "-b"], [r"Option '-b' requires an argument\.$"]),
    Case("flag-run-and-batch-eq", ["pretrain", "-c", "tiny", "--run=ci", "--batch=blackwell"],
         [r"--run and --batch: choose one "], submits=True),
    Case("flag-run-before-batch-after", ["--run", "ci", "pretrain", "-c", "tiny", "--batch", "blackwell"],
         [r"--run and --batch: choose one "], submits=True),
    Case("flag-run-twice", ["--run", "ci", "pretrain", "-c", "tiny", "--run", "blackwell"],
         [r"--run given twice with different values \(see 'ultra3 pretrain --help'\)$"], submits=True),
    Case("flag-run-twice-eq", ["--run=blackwell", "pretrain", "--config=tiny", "--run=ci"],
         [r"--run given twice with different values "], submits=True),
    Case("flag-config-twice", ["-c", "tiny", "pretrain", "-c", "default", "-d"],
         [r"--config given twice with different values "]),
    Case("flag-dry-run-with-value", ["pretrain", "-c", "tiny", "--dry-run=true"],
         [r"Option '--dry-run' does not take a value\.$"]),
    # -- executor rules --------------------------------------------------------------------------------
    Case("executor-local-96-nodes", ["pretrain", "-d", "dataset.mock=true"],
         [r"run\.nodes: 96 nodes, but the local executor runs on this machine only; submit with --run/--batch"]),
    Case("executor-local-nodes-override", ["pretrain", "-c", "tiny", "run.nodes=2", "-d"],
         [r"run\.nodes: 2 nodes, but the local executor runs on this machine only; "]),
    Case("executor-account-locally", ["pretrain", "-c", "tiny", "run.account=me", "-d"],
         [r"run\.account: is only used by the slurm executor, not local; "]),
    Case("executor-slurm-without-account", ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--batch", "noacct"],
         [r"run\.account: the slurm executor needs an account; set account in bad\.toml \[noacct\] "
          r"or run\.account=NAME$"], submits=True),
    Case("executor-ssh-without-user-and-job-dir",
         ["pretrain", "-c", "tiny", "--env-file", "bad.toml", "--batch", "ssh"],
         [r"run\.user: submitting through SSH \(host=login\.example\.com\) needs user; set it in bad\.toml \[ssh\]$",
          r"run\.job_dir: submitting through SSH \(host=login\.example\.com\) needs job_dir; "
          r"set it in bad\.toml \[ssh\]$"],
         submits=True),
    Case("executor-more-gpus-than-the-nodes", ["pretrain", "-c", "tiny", "--batch", "ci", "run.gpus_per_node=8",
                                              "train.global_batch_size=8"],
         [r"run\.gpus_per_node: the job wants 8 GPUs per node but the nodes have 1 \(cluster\.gpus_per_node, "
          r"from profile 'ci'"], submits=True),
    Case("executor-unknown-gpu", ["pretrain", "-c", "tiny", "cluster.gpu=v100", "-d"],
         [r"cluster\.gpu: unknown GPU type 'v100'; use one of a100, h100, h200, b200, gb200, gb300$"]),
    Case("data-prep-relative-output-dir", ["data", "prep", "pretrain", "-c", "tiny", "output_dir=out"],
         [r"output_dir: 'out' is relative, but the job runs in its own code dir; give an absolute path, e\.g\. "
          r"output_dir=/.*/out$"]),
    Case("data-prep-no-train-shards", ["data", "prep", "pretrain", "-c", "tiny", "valid_shards=3", "-d"],
         [r"valid_shards: valid_shards \+ test_shards = 4 of num_shards 4 leave no shard to train on; "]),
    Case("data-prep-empty-text-field", ["data", "prep", "pretrain", "-c", "tiny", "text_field=", "-d"],
         [r"text_field: must be a column name \(not empty\), got '' \(set in command line\)$"]),
    Case("data-prep-unknown-encoder", ["data", "prep", "pretrain", "-c", "tiny", "encoder=fast", "-d"],
         [r"encoder: must be auto, gigatoken or tokenizers, got 'fast' \(set in command line\)$"]),
    Case("data-prep-unknown-template", ["data", "prep", "sft", "-c", "tiny", "chat_template=llama", "-d"],
         [r"chat_template: 'llama' is no shipped template \(nemotron3\); name one or give a \.jinja path$"]),
    Case("data-prep-zero-row-group", ["data", "prep", "sft", "-c", "tiny", "row_group_size=0", "-d"],
         [r"row_group_size: must be an integer >= 1, got 0 \(set in command line\)$"]),
    Case("data-prep-zero-pad", ["data", "prep", "sft", "-c", "tiny", "pad_seq_to_mult=0", "-d"],
         [r"pad_seq_to_mult: must be an integer >= 1, got 0 \(set in command line\)$"]),
    # the data prep runtimes check no range of their own: each is here, at compile time
    Case("data-prep-negative-seed", ["data", "prep", "sft", "-c", "tiny", "seed=-1", "-d"],
         [r"seed: must be an integer >= 0, got -1 \(set in command line\)$"]),
    Case("data-prep-one-token-pack", ["data", "prep", "sft", "-c", "tiny", "pack_size=1", "-d"],
         [r"pack_size: must be an integer >= 2, got 1 \(set in command line\)$"]),
    Case("data-prep-small-object-store", ["data", "prep", "rl", "-c", "tiny", "object_store_mb=50", "-d"],
         [r"object_store_mb: must be an integer >= 80, got 50 \(set in command line\)$"]),
    Case("data-prep-zero-val-rows", ["data", "prep", "rl", "-c", "tiny", "val_rows=0", "-d"],
         [r"val_rows: must be an integer >= 1, got 0 \(set in command line\)$"]),
    Case("data-prep-zero-progress-interval", ["data", "prep", "pretrain", "-c", "tiny", "progress_interval=0", "-d"],
         [r"progress_interval: 0 seconds between progress lines: use a number > 0, e\.g\. 30$"]),
    Case("data-prep-null-default", ["data", "prep", "pretrain", "-c", "tiny", "max_bad_fraction=null", "-d"],
         [r"max_bad_fraction: null \(set in command line\), but the job needs a value: give one$"]),
    Case("data-prep-config-without-defaults", ["data", "prep", "rl", "-c", "own.yaml", "-d"],
         [r"backend: not set \(nor force, max_bad_fraction, max_record_bytes, object_store_mb, progress_interval, "
          r"strict, val_rows\), but the job needs a value of each: set them, or start the config with `defaults: "
          r"\[default\]` \(the stage's defaults\)$"],
         files={"own.yaml": "source: hf://nvidia/Nemotron-RL-Ultra-Training-Blends\nblends: [rlvr1]\n"
                            "output_dir: /tmp/rl-data\n"}),
    # -- values Megatron or Slurm would refuse ---------------------------------------------------------
    Case("value-nan-lr", ["pretrain", "-c", "tiny", "optimizer.lr=.nan", "-d"],
         [r"optimizer\.lr: must be a finite number, got nan \(set in command line\)$"]),
    Case("value-inf-lr", ["pretrain", "-c", "tiny", "optimizer.lr=.inf", "-d"],
         [r"optimizer\.lr: must be a finite number, got inf \(set in command line\)$"]),
    Case("value-past-int64", ["pretrain", "-c", "tiny", "train.train_iters=99999999999999999999999", "-d"],
         [r"train\.train_iters: must be an integer within 64 bits, got 99999999999999999999999 "
          r"\(set in command line\)$"]),
    *[Case(f"value-zero-{key.split('.')[-1]}", ["pretrain", "-c", "tiny", f"{key}=0", "-d"],
           [rf"{key.replace('.', chr(92) + '.')}: {key.replace('.', chr(92) + '.')}=0 must be 1 or more; "]
           + extra)
      for key, extra in (("model.hidden_size", []), ("model.vocab_size", []), ("model.mamba_num_heads", []))],
    Case("value-unknown-precision", ["pretrain", "-c", "tiny", "mixed_precision=bf16_mixd", "-d"],
         [r"mixed_precision: 'bf16_mixd' is no Megatron-Bridge 0\.6\.2 preset; did you mean 'bf16_mixed'\?$"]),
    Case("value-slurm-time", ["pretrain", "-c", "tiny", "--batch", "ci", "run.time=tomorrow", "-d"],
         [r"run\.time: must be a Slurm time limit: MM, HH:MM:SS or D-HH:MM:SS \(e\.g\. 04:00:00\), got 'tomorrow'"]),
    Case("value-slurm-mem", ["pretrain", "-c", "tiny", "--batch", "ci", "run.mem=lots", "-d"],
         [r"run\.mem: must be a Slurm memory size"]),
    Case("value-slurm-cpus", ["pretrain", "-c", "tiny", "--batch", "ci", "run.cpus_per_task=0", "-d"],
         [r"run\.cpus_per_task: must be an integer >= 1, got 0 \(set in command line\)$"]),
    Case("value-ssh-port", ["pretrain", "-c", "tiny", "--batch", "ci", "run.port=70000", "-d"],
         [r"run\.port: must be an integer from 1 to 65535, got 70000 \(set in command line\)$"]),
    Case("value-zero-nodes", ["pretrain", "-c", "tiny", "run.nodes=0", "-d"],
         [r"run\.nodes: must be an integer >= 1, got 0 \(set in command line\)$"]),
    # -- parallel layout and precision (the validation rules) -----------------------------------------
    Case("layout-pp-does-not-fit", ["pretrain", "-c", "tiny", "model.pipeline_model_parallel_size=3", "-d"],
         [r"run\.nodes: PP·max\(TP·CP, EP·ETP\) = 3·max\(1, 1\) = 3 GPUs at least, but the run has 1",
          r"run\.nodes: world size 1 \(1 nodes x 1 GPUs\) is not a multiple of TP·PP·CP = 1·3·1 = 3",
          r"model\.pipeline_model_parallel_size: 7 layers do not split evenly over PP=3"]),
    Case("layout-tp-vs-heads", ["pretrain", "-c", "tiny", "--batch", "blackwell", "run.nodes=2", "run.gpus_per_node=8",
                                "model.tensor_model_parallel_size=16"],
         [r"model\.tensor_model_parallel_size: num_attention_heads=4 is not divisible by TP=16",
          r"model\.tensor_model_parallel_size: mamba_num_heads=8 is not divisible by TP=16",
          r"model\.tensor_model_parallel_size: mamba_num_groups=8 is not divisible by TP=16"], submits=True),
    Case("layout-global-batch-vs-dp", ["pretrain", "-c", "tiny", "--batch", "blackwell", "run.gpus_per_node=8"],
         [r"train\.global_batch_size: global batch 4 is not divisible by MBS·DP = 1·8 = 8"], submits=True),
    Case("layout-global-batch-vs-mbs", ["pretrain", "--config=tiny", "--batch=blackwell", "train.micro_batch_size=3",
                                        "--dry-run"],
         [r"train\.global_batch_size: global batch 4 is not divisible by MBS·DP = 3·1 = 3"]),
    Case("precision-nvfp4-on-hopper-dry-run", ["pretrain", "--batch", "hopper", "--dry-run", "dataset.mock=true"],
         [rf"mixed_precision: {NVFP4} trains in NVFP4, which needs SM 10\.0/10\.3 \(Blackwell\), but h100 is SM 9\.0",
          r"model\.recompute_granularity: estimated [\d.]+ GiB per GPU .* exceeds the 80 GiB of h100"]),
    Case("precision-nvfp4-on-hopper", ["-b", "hopper", "pretrain", "-c", "tiny", f"mixed_precision={NVFP4}"],
         [rf"mixed_precision: {NVFP4} trains in NVFP4, which needs SM 10\.0/10\.3 \(Blackwell\), but h100 is SM 9\.0; "
          r"use a Blackwell profile"], submits=True),
    Case("precision-misspelt-knob", ["pretrain", "-c", "tiny", "precision.stochastic_roundng=false", "-d"],
         [r"precision\.stochastic_roundng: unknown key \(set in command line\); "
          r"did you mean 'stochastic_rounding'\?$"]),
    Case("precision-knob-not-a-bool", ["pretrain", "-c", "tiny", "precision.random_hadamard_transform=maybe", "-d"],
         [r"precision\.random_hadamard_transform: must be true/false, got 'maybe' \(set in command line\)$"]),
    Case("precision-bf16-modules-not-a-list", ["pretrain", "-c", "tiny", "precision.bf16_modules='*.mixer.out_proj'",
                                              "-d"],
         [r"precision\.bf16_modules: must be a list of str, got '\*\.mixer\.out_proj' \(set in command line\)$"]),
    Case("precision-knob-env-set-by-hand", ["pretrain", "-c", "tiny", "--batch", "blackwell",
                                           f"mixed_precision={NVFP4}", "run.env.NVTE_NVFP4_DISABLE_RHT=1",
                                           "model.mamba_num_heads=16"],
         [r"run\.env\.NVTE_NVFP4_DISABLE_RHT: NVTE_NVFP4_DISABLE_RHT is exported from "
          r"precision\.random_hadamard_transform \(set in command line\); remove it and set "
          r"precision\.random_hadamard_transform=true/false$"], submits=True),
    Case("quantize-unknown-recipe", ["quantize", "-c", "tiny", "modelopt_recipe=models/nvidia/ultra-nvfp4"],
         [r"modelopt_recipe: 'models/nvidia/ultra-nvfp4' is not a recipe shipped with ModelOpt nor a YAML file; "
          r"did you mean models/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16/ptq/nvfp4-4o6\?"]),
    Case("quantize-missing-inputs", ["quantize", "-c", "tiny", "make_checkpoint=false",
                                     "bf16_checkpoint=/nonexistent/ultra-bf16", "calibration.path=missing.jsonl"],
         [r"bf16_checkpoint: /nonexistent/ultra-bf16 does not exist \(set in command line\); run `ultra3 rl mopd -c "
          r"tiny` or fix the path",
          r"calibration\.path: missing\.jsonl matches no file on this machine \(set in command line\); fix the path"]),
    Case("quantize-input-in-its-own-job-dir", ["quantize", "-c", "tiny", "make_checkpoint=false", "--dry-run"],
         [r"bf16_checkpoint: \$\{job\.dir\}/tiny-bf16 is inside this job's own new directory, empty until the job "
          r"starts \(set in configs/quantize/tiny\.yaml\); set bf16_checkpoint=PATH, or bf16_checkpoint=null for the "
          r"newest mopd-policy or rlvr-policy or sft-checkpoint or pretrain-checkpoint artifact, or "
          r"make_checkpoint=true to make it$"]),
    Case("quantize-hf-backend-on-many-gpus", ["quantize", "-c", "tiny", "run.gpus_per_node=8", "--dry-run"],
         [r"backend: the hf backend quantizes in one process, but the job has 1 node\(s\) x 8 GPU\(s\)"]),
]


def test_enough_cases():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, cli_here, home, request, tmp_path):
    work = tmp_path / "work"
    (work / "bad.toml").write_text(BAD_TOML)
    for name, text in case.files.items():
        if text is None:
            (work / name).unlink()
        else:
            (work / name).write_text(text)
    if case.submits:
        request.getfixturevalue("slurm")

    r = cli_here(*case.args, prog=case.prog, env=case.env)

    assert r.rc == 2, f"rc {r.rc}\nstdout:\n{r.out}\nstderr:\n{r.err}"
    assert len(r.err_lines) == len(case.errors), f"expected {len(case.errors)} error line(s), got:\n{r.err}"
    for line, pattern in zip(r.err_lines, case.errors):
        assert re.match("error: " + pattern, line), f"{line!r} does not match {pattern!r}"
    assert "Traceback" not in r.out + r.err
    for secret in case.hidden:
        assert secret not in r.out + r.err
    assert not home.exists() or not any(home.iterdir()), f"written under NEMOTRON_HOME: {list(home.rglob('*'))}"
    if case.submits:
        assert not our_jobs(tmp_path), "a job was queued"


@pytest.mark.parametrize("name,content,problem", [
    ("empty.jsonl", b"", "is empty (no records)"),
    ("blank.jsonl", b"\n\n  \n", "is empty (no records)"),
    ("fake.parquet", b"PAR1 not really", "is not a .parquet file (it does not start and end as one does)"),
    ("fake.jsonl.gz", b'{"text": "plain"}\n', "is not a .gz file (it does not start as one does)"),
    ("fake.jsonl.zst", b'{"text": "plain"}\n', "is not a .zst file (it does not start as one does)"),
])
def test_a_local_data_prep_checks_its_input_files_before_writing_anything(cli_here, home, tmp_path, name, content,
                                                                           problem):
    corpus = tmp_path / name
    corpus.write_bytes(content)
    r = cli_here("data", "prep", "pretrain", "-c", "tiny", f"datasets=[{{name: x, path: {corpus}}}]")
    assert r.rc == 2 and r.err_lines == [f"error: datasets[0].path: {corpus} {problem} on this machine (set in command "
                                         "line); fix the path"], r.err
    assert not (home / "state").exists() or not any((home / "state").rglob("config.yaml"))


@pytest.mark.parametrize("name,args,kind", [("env.toml", ("-c", "tiny", "--batch", "a", "--env-file"), "TOML"),
                                            ("config.yaml", ("-c",), "YAML")])
def test_a_file_that_is_not_utf8_is_one_line(cli_here, home, tmp_path, name, args, kind):
    path = tmp_path / name
    path.write_bytes("[a]\nexecutor = 'slurm'\n".encode("utf-16"))
    r = cli_here("pretrain", *args, str(path), "--dry-run")
    assert r.rc == 2 and r.err_lines == [f"error: {path}: not UTF-8 text (byte 0); save it as UTF-8 {kind}"], r.err


@pytest.mark.parametrize("make,problem", [
    (lambda d: d.mkdir(), "has no readable metadata.json, so it is no output of `ultra3 data prep sft`"),
    (lambda d: d.write_text("x"), "is not a directory"),
    (lambda d: (d.mkdir(), (d / "metadata.json").write_text('{"format": "ultra3-binidx/1"}')),
     "is no output of `ultra3 data prep sft` (its metadata.json is of 'ultra3-binidx/1')"),
    (lambda d: (d.mkdir(), (d / "metadata.json").write_text('{"format": "ultra3-sft-packed-parquet/1", '
                                                              '"pack_size": 1024}')),
     "is packed at 1024 tokens but this run trains on 512 (dataset.pack_size); pack it again at 512 or set "
     "dataset.pack_size=1024"),
])
def test_the_dry_run_checks_a_packed_sft_dir_as_training_would(cli_here, home, tmp_path, make, problem):
    packed = tmp_path / "packed"
    make(packed)
    r = cli_here("sft", "-c", "tiny", "--dry-run", "dataset.mock=false", f"dataset.packed_dir={packed}")
    assert r.rc == 2 and r.err_lines == [f"error: dataset.packed_dir: {packed} {problem} (set in command line); run "
                                         "`ultra3 data prep sft -c tiny` or fix the path"], r.err
