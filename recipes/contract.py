"""The contract between the launcher and the job runtime: the one module both sides import.

Stdlib only. The launcher loads this very file (ultra3.contract); the runtime imports it as
`recipes.contract`. It holds what both sides must agree on and nothing else. The artifact store's format is
recipes/store.py's, re-exported here.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re

from .store import (  # noqa: F401  (re-exported: the launcher reads the store's format through this module)
    ARTIFACT_FORMAT, CHECKPOINT_TRACKERS, CONVERSION_REPORT, CREATED_TS_MAX, JOB_OUTPUTS, NAME, QUANT_CONFIG,
    SMALL_FILE_MAX, artifact_name, manifest_problem, newest_first, parse_manifest, publish, quantization, read_json,
    read_manifest, read_small, read_store, resolve_ref, small_text, versions, write_atomic)

# -- how a job ends and speaks -------------------------------------------------------------------
INPUT_ERROR_EXIT = 2  # the runtime refused its input: one line `<where>: error: <what and the fix>`
PREFLIGHT_EXIT = 3  # a preflight check failed: one line starting with PREFLIGHT_MARK
PREFLIGHT_MARK = "PREFLIGHT FAILED"
INPUT_ERROR = re.compile(r"^[\w. -]+: error: ")  # the start of a runtime's input-error line
CONFIG_FILE = "config.yaml"  # the job's resolved config, in its working directory
ENTRY_MODULE = "recipes.launch"  # `python -m recipes.launch --config config.yaml`, on every node
HEAD_NODE_VAR = "ULTRA3_HEAD_NODE"  # the first node's address, exported by the job script
VERBOSE_VAR = "ULTRA3_VERBOSE"  # "1" in the job's environment (`ultra3 -v`): third-party noise stays in the log
GROUP_RESOURCE = "ultra3_group_"  # + a layout group's name: the Ray resource each node of that group has
IMAGE_ID = "/opt/ultra3/image.json"  # in an image `ultra3 container build` made: {"kind", "digest"}

# -- one run, many allocations (a Slurm job requeued until its work is done) -----------------------------
CONTINUE_SIGNAL = "SIGUSR1"  # sent by Slurm run.grace_s before the time limit (--signal=USR1@grace_s)
CONTINUE_EXIT = 75  # the stage stopped early with its work saved (the signal, exit_duration_in_mins): go on
RERUN_EXIT = 16  # Megatron's re-run state machine: resume from the checkpoint it saved to disambiguate a fault
VALIDATION_EXIT = 17  # Megatron's re-run state machine: a result failed validation again; never retried
ATTEMPTS_FILE = "attempts.jsonl"  # in the job dir: the ledger, one JSON line as each attempt starts and ends
FINISHED_FILE = "finished.json"  # in the job dir: the run is done; an attempt started after it runs nothing
ATTEMPT_MARK = "ultra3 attempt"  # the first node's log line as an attempt starts: `ultra3 attempt N: ...`
ATTEMPT_ENDED = "ultra3: attempt"  # its line as the attempt ends: `ultra3: attempt N OUTCOME: why; what follows`


def ledger_entries(text: str) -> list[dict]:
    """The ledger's entries ({"event": "start"|"end", "attempt": N, ...}); a torn line (a node died while
    writing it) is skipped."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("attempt"), int) and not isinstance(entry["attempt"], bool):
            entries.append(entry)
    return entries


# -- a training stage's ranks under nvidia-resiliency-ext's ft_launcher (run.fault_tolerance) ------------
FT_LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"  # the ft_launcher script's module, run with -m
RDZV_PORT = 29500  # the c10d rendezvous on the first node, torchrun's and ft_launcher's
FT_SECTIONS = ("setup", "step", "checkpointing")  # Megatron-Bridge's FT sections: run.fault_tolerance.<name>_timeout_s


def ft_launcher_argv(run: dict, python: str, head: str, rdzv_id: str, module: str, config: str) -> list[str]:
    """ft_launcher in place of torchrun, one per node (the dry run shows this line): every rank restarted in the job
    (--max-restarts) when one dies or overstays a Megatron-Bridge FT section or the time between them. No heartbeat
    timeouts: Megatron-Bridge 0.6 sends no heartbeats, so nvidia-resiliency-ext 0.6 would end healthy ranks."""
    ft = run["fault_tolerance"]
    nodes, per_node = int(run.get("nodes") or 1), int(run.get("gpus_per_node") or 1)
    sections = ",".join(f"{name}:{ft[f'{name}_timeout_s']}" for name in FT_SECTIONS)
    argv = [python, "-m", FT_LAUNCHER, f"--nproc-per-node={per_node}", f"--max-restarts={ft['max_restarts']}",
            f"--ft-rank-section-timeouts={sections}",
            f"--ft-rank-out-of-section-timeout={ft['out_of_section_timeout_s']}"]
    if nodes == 1:
        argv.append("--standalone")
    else:
        argv += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={head}:{RDZV_PORT}",
                 f"--rdzv-id={rdzv_id}"]
    return [*argv, "--module", module, "--config", config]


# -- rules both sides apply ----------------------------------------------------------------------
NVFP4_CAPABILITIES = ((10, 0), (10, 3))  # Transformer Engine trains NVFP4 on SM 10.0 / 10.3 only
HUB_MODEL = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")  # a data prep's hub tokenizer: org/name[@revision]


def trains_nvfp4(capability: tuple[int, int]) -> bool:
    return tuple(capability) in NVFP4_CAPABILITIES


def pad_seq_to_mult(tp: int, cp: int, sequence_parallel: bool) -> int:
    """The multiple every packed sequence is padded to: 2·CP for context parallelism's load balancing,
    CP·TP when sequence parallelism splits it over TP too (their lcm when both apply)."""
    cp_multiple = 2 * cp if cp > 1 else 1
    sp_multiple = cp * tp if sequence_parallel and tp > 1 else 1
    return cp_multiple * sp_multiple // math.gcd(cp_multiple, sp_multiple)


# -- compile caches (recipes/compile_cache.py keys them; the dry run names them) --------------------
COMPILE_CACHE_VAR = "ULTRA3_COMPILE_CACHE"  # the job's keyed compile-cache directory, in every process it starts


def compile_cache_dir(root: str, arch: str, key: str) -> str:
    """<root>/<arch>/<key>: arch like sm_90, key image-<digest 16> or pkgs-<hash of the package versions>."""
    return f"{root.rstrip('/')}/{arch}/{key}"


def image_key(digest: str) -> str:
    return f"image-{digest[:16]}"


# -- evaluation results (an eval-results artifact's results.json, read by `nemotron jobs status|compare`) ------
RESULTS_FILE = "results.json"


def score_lines(results: dict) -> list[str]:
    """One line per task of a results.json: task, metric, score ± stderr, samples, few-shot count."""
    lines = []
    for name, task in (results.get("tasks") or {}).items():
        if not isinstance(task, dict):
            continue
        score, stderr = task.get("score"), task.get("stderr")
        shown = f"{score:.4f}" if isinstance(score, (int, float)) else "n/a"
        if isinstance(stderr, (int, float)):
            shown += f" ± {stderr:.4f}"
        metric = str(task.get("metric") or "?").removesuffix(",none")  # lm-eval's metric,filter: no filter
        lines.append(f"{name:<28} {metric:<22} {shown:<20} {task.get('samples')} samples, "
                     f"{task.get('num_fewshot')}-shot")
    return lines


def checkpoint_iteration(folder: str | None) -> int | None:
    """The newest iteration a Megatron-Bridge checkpoint directory holds: its text tracker's, else (a
    latest_train_state.pt tracker only) its newest iter_NNNNNNN directory's; None without a tracker."""
    if not folder or not any(os.path.isfile(os.path.join(folder, t)) for t in CHECKPOINT_TRACKERS):
        return None
    try:
        text = read_small(os.path.join(folder, CHECKPOINT_TRACKERS[1])).strip()
    except (OSError, ValueError):
        text = ""
    if text.isdigit():
        return int(text)
    steps = [int(n[5:]) for n in os.listdir(folder) if n.startswith("iter_") and n[5:].isdigit()]
    return max(steps) if steps else None


# -- pretraining phases ----------------------------------------------------------------------------
def phase2_start(cfg: dict) -> int | None:
    """The iteration a two-phase pretraining run switches to its phase-2 blend at: phase2.start_tokens over the
    tokens of one iteration (model.seq_length x train.global_batch_size), rounded up; None without a phase 2."""
    def value(section: str, key: str) -> object:
        table = cfg.get(section)
        return table.get(key) if isinstance(table, dict) else None

    tokens, seq = value("phase2", "start_tokens"), value("model", "seq_length")
    gbs = value("train", "global_batch_size")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (tokens, seq, gbs)):
        return None
    return -(-int(tokens) // (int(seq) * int(gbs)))


def next_phase(cfg: dict) -> bool:
    """Whether a run that just ended well has a phase still to run in this allocation: its checkpoint stands at
    the phase-2 switch, short of train.train_iters (phase 1 trains up to the switch and saves there)."""
    start = phase2_start(cfg)
    saved = checkpoint_iteration(cfg["checkpoint"].get("save")) if start else None
    return start is not None and saved == start and start < int(cfg["train"].get("train_iters") or 0)


def sample_dir(output_dir: str, sample: int | None) -> str:
    """Where a data-prep run of only the first `sample` records writes (never over the full run's output)."""
    return f"{output_dir}/sample-{sample}" if sample else output_dir


def newest_step(checkpoints: str) -> tuple[int, str] | None:
    """NeMo RL's newest finished checkpoint in an experiment's checkpoint dir: (N, path of step_N); its
    unfinished saves are tmp_step_N."""
    found = [(int(m.group(1)), path) for path in glob.glob(os.path.join(checkpoints, "step_*"))
             if (m := re.fullmatch(r"step_(\d+)", os.path.basename(path)))]
    return max(found) if found else None

