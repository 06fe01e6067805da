"""The contract between the launcher and the job runtime: the one module both sides import.

Stdlib only. The launcher loads this very file (ultra3.contract); the runtime imports it as
`recipes.contract`. It holds what both sides must agree on and nothing else.

Artifacts. A job that completes publishes each output it declared (`job.produces` in its config) in the
artifact store, laid out as NVIDIA's CLI lays its manifest store:

    <root>/<name>/v<N>/manifest.json     one artifact version (one JSON object on one line)
    <root>/<name>/latest                 the newest version number, e.g. "3"

A version directory is claimed with an atomic mkdir, and files are written to a temporary name and
renamed, so two jobs publishing at once never share or half-write a version. The job's own record of
what it published is `<job dir>/outputs.json`. Readers read regular files only, and only so far: a
damaged store (a FIFO, a link to a device, a manifest of the wrong types) is skipped, never hangs them.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import secrets
import socket
import stat
from typing import Callable

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


# -- artifacts -----------------------------------------------------------------------------------
ARTIFACT_FORMAT = 1
JOB_OUTPUTS = "outputs.json"  # in the job dir: the manifests the job published
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# a checkpoint directory of Megatron-Bridge names its newest iteration in one of these
CHECKPOINT_TRACKERS = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")


def artifact_name(kind: str, config: str, sample: int | None = None, variant: str | None = None) -> str:
    """Outputs of different configs (and of samples, and of runs whose data the command line replaced: a variant,
    the digest of those values) never share a name, so a tiny, sampled or overridden run is never the `latest` of
    the config's own artifact."""
    return f"ultra3-{kind}-{config}" + (f"-{variant}" if variant else "") + (f"-sample-{sample}" if sample else "")


SMALL_FILE_MAX = 1 << 20  # bytes: a manifest, `latest`, a job record or an exit code is far smaller
CREATED_TS_MAX = 1e11  # seconds since the epoch (the year 5138): a later created_ts is damage, not a date


def read_small(path: str, limit: int = SMALL_FILE_MAX) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes, reading no further: ValueError for anything
    else (a FIFO or a device is never read), FileNotFoundError when there is nothing at `path`."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb") as f:  # swapped since: no wait
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        return small_text(f.read(limit + 1), limit)


def read_json(path: str) -> object:
    """The JSON of a small regular file (read_small); ValueError saying why there is none."""
    text = read_small(path)
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


def small_text(data: bytes, limit: int = SMALL_FILE_MAX) -> str:
    """The text of a small file's first `limit` + 1 bytes: ValueError when it has more, or is not UTF-8."""
    if len(data) > limit:
        raise ValueError(f"over {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"  # unique across nodes
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def publish(root: str, manifest: dict) -> dict:
    """Store one artifact version; returns the manifest with its version."""
    name = manifest["name"]
    if not NAME.match(name):
        raise ValueError(f"artifact name {name!r} is not [A-Za-z0-9._-]")
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    version = max(versions(folder), default=0) + 1
    while True:
        try:
            os.mkdir(os.path.join(folder, f"v{version}"))
            break
        except FileExistsError:  # another job claimed it first
            version += 1
    manifest = {**manifest, "version": version}
    # metadata.json beside it, as NVIDIA's store has it (what `${art:NAME,FIELD}` reads)
    write_atomic(os.path.join(folder, f"v{version}", "metadata.json"), json.dumps(manifest.get("metadata") or {}))
    write_atomic(os.path.join(folder, f"v{version}", "manifest.json"), json.dumps(manifest) + "\n")
    # `latest` names the highest complete version: a publisher whose write may have overtaken a newer one's
    # (it read the versions before that one was complete) sees it on reading them again and writes again
    newest = 0
    while (highest := max(_complete(folder), default=0)) != newest:
        newest = highest
        write_atomic(os.path.join(folder, "latest"), f"{newest}\n")
    return manifest


def _complete(folder: str) -> list[int]:
    """The versions whose manifest is written."""
    return [v for v in versions(folder) if os.path.exists(os.path.join(folder, f"v{v}", "manifest.json"))]


def versions(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [int(n[1:]) for n in names if n.startswith("v") and n[1:].isdigit()]


def read_manifest(path: str, bad: Callable[[str, str], None] | None = None) -> dict | None:
    """The manifest at `path`: None when it is not written yet, another tool's, or damaged (then `bad(path,
    why)` is told)."""
    try:
        return parse_manifest(read_small(path))
    except FileNotFoundError:
        return None  # a version claimed, its manifest not yet written
    except (OSError, ValueError) as e:
        if bad:
            bad(path, str(e))
        return None


def parse_manifest(text: str) -> dict | None:
    """A manifest file's text as the manifest, None when it is another tool's (NVIDIA's CLI, another format);
    ValueError saying what is damaged."""
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if isinstance(manifest, dict) and manifest.get("format") != ARTIFACT_FORMAT:
        return None
    if why := manifest_problem(manifest):
        raise ValueError(why)
    return manifest


# what readers of a manifest rely on: its fields' types; all but the first four may be absent or null
_MANIFEST_FIELDS = {"name": str, "type": str, "path": str, "version": int, "created_ts": (int, float),
                    "inputs": list, "metadata": dict, "producer": str, "stage": str, "config": str, "profile": str,
                    "config_digest": str}
_REQUIRED = ("name", "type", "path", "version")


def manifest_problem(manifest: object) -> str | None:
    """What makes a manifest of ours unfit to read (None when it is fit): a field missing or of a wrong type,
    a version below 1, a created_ts that is no date."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    for key, types in _MANIFEST_FIELDS.items():
        value = manifest.get(key)
        if value is None and key not in _REQUIRED:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types) if isinstance(types, tuple) else types.__name__
            return f"{key} is {json.dumps(value)[:40]}, not {want}"
    if manifest["version"] < 1:
        return f"version {manifest['version']} is below 1"
    if not 0 <= (manifest.get("created_ts") or 0) < CREATED_TS_MAX:  # NaN and infinity too
        return f"created_ts {manifest['created_ts']} is not a time (seconds since 1970)"
    if not all(isinstance(i, dict) and isinstance(i.get("producer"), (str, type(None)))
               for i in manifest.get("inputs") or []):
        return "an entry of inputs is not an object with a text or null producer"
    return None


def read_store(root: str, bad: Callable[[str, str], None] | None = None) -> list[dict]:
    """Every artifact version in the store, newest first; a damaged manifest is told to `bad(path, why)`."""
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        for version in versions(os.path.join(root, name)):
            if manifest := read_manifest(os.path.join(root, name, f"v{version}", "manifest.json"), bad):
                found.append(manifest)
    return newest_first(found)


def newest_first(manifests: list[dict]) -> list[dict]:
    return sorted(manifests, key=lambda m: (m.get("created_ts") or 0, m["version"]), reverse=True)


def resolve_ref(root: str, ref: str, bad: Callable[[str, str], None] | None = None) -> dict | None:
    """`NAME:latest`, `NAME:vN` or `NAME:N` to its manifest, or None; a damaged `latest` or manifest is told
    to `bad(path, why)`."""
    name, _, version = ref.rpartition(":")
    if not NAME.match(name or "-"):
        return None
    folder = os.path.join(root, name)
    if version == "latest":
        latest = os.path.join(folder, "latest")
        try:
            version = read_small(latest, 64).strip()
            if not version.isdigit():
                raise ValueError(f"{version[:40]!r} is not a version number")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            if bad:
                bad(latest, str(e))
            return None
    version = version.removeprefix("v")
    return read_manifest(os.path.join(folder, f"v{version}", "manifest.json"), bad) if version.isdigit() else None


CONVERSION_REPORT = "conversion_report.json"  # in a converted checkpoint: its parity figures
QUANT_CONFIG = "hf_quant_config.json"  # in a ModelOpt-quantized Hugging Face checkpoint: its quantization


def quantization(folder: str) -> str | None:
    """The quantization algorithm of a Hugging Face checkpoint dir ("NVFP4", ...); None for an unquantized one."""
    for name, path in ((QUANT_CONFIG, ("quantization", "quant_algo")), ("config.json", ("quantization_config",
                                                                                         "quant_algo"))):
        try:
            found = json.loads(read_small(os.path.join(folder, name)))
            for key in path:
                found = found.get(key) if isinstance(found, dict) else None
        except (OSError, ValueError):
            continue
        if found:
            return str(found)
    return None


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

