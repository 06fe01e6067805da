"""Runtime of `ultra3 eval`: score a checkpoint on lm-evaluation-harness tasks into results.json.

    python -m recipes.eval --config config.yaml

Started by recipes.launch (one process) after the preflight; it runs just as well by hand. Needs the `eval` extra
(lm-eval[hf,api]); the vllm backend also needs vLLM (the rl image's).

Config keys (others, such as `run` and `job`, are ignored):

    checkpoint: DIR|NAME       # a Hugging Face checkpoint (dir or hub id), or the Megatron-Bridge checkpoint dir of a
                               # pretrain/sft job, exported to <job.dir>/hf first (recipes/quantization/megatron_export)
    make_checkpoint: false     # build a seeded random checkpoint of `model` at `checkpoint` first (-c tiny)
    tokenizer: null            # tokenizer.json of a made checkpoint
    output_dir: DIR            # results.json, and tasks/<task>.json as each task ends (a re-run skips those)
    backend: hf                # hf: lm-eval's HF model in this process (a ModelOpt-quantized checkpoint emulated:
                               # recipes/evaluation/emulate.py); vllm: `vllm serve` here, lm-eval's
                               # local-completions against it
    device: auto               # hf backend: auto (cuda when visible) | cpu | cuda
    batch_size: 8              # requests per forward pass (hf), concurrent requests (vllm)
    tasks: [{name: ultra3_tiny_choice, num_fewshot: 0, limit: 8}]   # limit: samples per task (null: all)
    generation: {temperature: 0.0, top_p: null, max_new_tokens: 256}  # generation tasks' sampling
    serve: {command: [vllm, serve], tensor_parallel_size: 8, pipeline_parallel_size: 1, port: 8000,
            start_timeout_s: 1800, max_model_len: null, extra_args: []}
    hf_datasets_cache: null    # a prefilled datasets cache: lm-eval's hub tasks read it offline
    seed: 1234
    model: {...}               # Megatron-Bridge names: the made checkpoint's shape

Output (output_dir/results.json): the checkpoint (path, kind, lineage), backend, harness and version, per task its
metric, score, stderr, samples, version, few-shot count and all metrics, the generation settings, the seconds.

Exit codes: 0 done (or already done); 2 a config or input problem (one line on stderr, nothing written: an unknown
task, a checkpoint that is not there); 1 the machine's failure (one line:
a model server that did not come up, lm-eval missing) or anything else (with its traceback).
"""

from __future__ import annotations

import json
import os
import sys
import time

from . import entry
from .contract import RESULTS_FILE, quantization, score_lines, write_atomic
from .dataprep.errors import HubUnreachable
from .dataprep.settings import load_config
from .evaluation import emulate
from .evaluation.errors import EvalError, EvalFailed

PROG = "ultra3 eval"
HARNESS = "lm-evaluation-harness"
TASK_DIR = "tasks"  # under output_dir: one finished task's results each
SKIP = ("alias", "name", "sample_len", " ")  # results entries that are no metric


def log(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def precheck(cfg: dict) -> list[dict]:
    """What needs no torch or lm-eval, checked first: the tasks and the checkpoint path. Returns the tasks."""
    if not cfg.get("output_dir"):
        raise EvalError("output_dir is not set; set where results.json goes")
    tasks = cfg.get("tasks") or []
    if not tasks or not all(isinstance(t, dict) and t.get("name") for t in tasks):
        raise EvalError("tasks: give a list of {name, num_fewshot, limit}, e.g. tasks=[{name: ultra3_tiny_choice}]")
    if cfg.get("backend", "hf") not in ("hf", "vllm"):
        raise EvalError(f"backend: {cfg.get('backend')!r} is not hf or vllm")
    ckpt = cfg.get("checkpoint")
    if not ckpt:
        raise EvalError("checkpoint is not set; give a Hugging Face checkpoint (dir or hub id) or a Megatron-Bridge "
                        "checkpoint dir")
    if not cfg.get("make_checkpoint") and ckpt.startswith(("/", ".", "~")) and not os.path.isdir(
            os.path.expanduser(ckpt)):
        raise EvalError(f"checkpoint: {ckpt} does not exist; fix the path")
    return tasks


def request(cfg: dict, tasks: list[dict]) -> dict:
    """What the results answer: the same request finds them already there."""
    return {"checkpoint": cfg.get("checkpoint"), "backend": cfg.get("backend") or "hf", "tasks": tasks,
            "generation": cfg.get("generation") or {}, "batch_size": cfg.get("batch_size"), "seed": cfg.get("seed")}


def done_before(path: str, wanted: dict) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("request") == wanted else None


def checkpoint(cfg: dict) -> str:
    """The Hugging Face checkpoint to load: made (tiny), exported from Megatron once, or as given."""
    from .quantization import megatron_export

    ckpt = cfg["checkpoint"]
    if cfg.get("make_checkpoint"):
        if not os.path.isdir(ckpt):
            from .quantization import tiny_checkpoint

            tok = cfg.get("tokenizer")
            if not tok or not os.path.isfile(tok):
                raise EvalError(f"tokenizer: {tok} is not a tokenizer.json file (make_checkpoint needs one)")
            tiny_checkpoint.make(cfg["model"], tok, ckpt, cfg.get("seed") or 0)
            log(f"made the checkpoint {ckpt}")
        return ckpt
    if megatron_export.is_megatron(ckpt):
        dest = os.path.join((cfg.get("job") or {}).get("dir") or os.path.dirname(cfg["output_dir"]), "hf")
        return megatron_export.export_once(ckpt, dest, "checkpoint", log)
    if cfg.get("backend", "hf") == "hf" and os.path.isdir(ckpt) and (algo := quantization(ckpt)):
        dest = os.path.join((cfg.get("job") or {}).get("dir") or os.path.dirname(cfg["output_dir"]), "bf16-emulated")
        log(f"{ckpt} is quantized ({algo}): emulated from a BF16 copy at {dest} ({emulate.SUMMARY})")
        return emulate.bf16_copy(ckpt, dest)
    return ckpt


def model(cfg: dict, path: str, url: str | None):
    """lm-eval's model: its HF model in this process, or its completions client against the served endpoint."""
    from lm_eval.api.registry import get_model

    batch = int(cfg.get("batch_size") or 8)
    if url:
        from .evaluation.serve import SERVED_NAME

        return get_model("local-completions").create_from_arg_obj(
            {"base_url": f"{url}/completions", "model": SERVED_NAME, "tokenizer": path,
             "tokenizer_backend": "huggingface", "num_concurrent": batch, "max_retries": 3}, {})
    import torch

    device = cfg.get("device") or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # a tiny model on busy cores: extra threads only spin
    lm = get_model("hf").create_from_arg_obj({"pretrained": path, "dtype": "bfloat16", "device": device},
                                             {"batch_size": batch})
    if emulated(path):
        log(f"quantized activations: {emulate.quantize_activations(lm.model, path)} module(s) hooked")
    return lm


def emulated(path: str) -> bool:
    return os.path.isfile(os.path.join(path, emulate.SCALES))


def generation(cfg: dict) -> dict:
    gen = cfg.get("generation") or {}
    out = {"temperature": gen.get("temperature"), "top_p": gen.get("top_p"), "max_gen_toks": gen.get("max_new_tokens")}
    return {k: v for k, v in out.items() if v is not None}


def summary(name: str, found: dict) -> dict:
    """One task's figures from lm-eval's results: its first metric (the task's metric_list order), its stderr,
    every metric, the samples it scored, its version and few-shot count."""
    metrics = {k: v for k, v in found["results"][name].items() if not k.startswith(SKIP) and "_stderr," not in k
               and isinstance(v, (int, float))}
    first = next(iter(metrics), None)
    stderr = found["results"][name].get(first.replace(",", "_stderr,", 1)) if first else None
    counts = found.get("n-samples") or {}
    leaves = [n for n in counts if n == name or n in (found.get("group_subtasks") or {}).get(name, [])]
    return {"metric": first, "score": metrics.get(first),
            "stderr": stderr if isinstance(stderr, (int, float)) else None,
            "samples": sum(int(counts[n].get("effective") or 0) for n in leaves),
            "version": (found.get("versions") or {}).get(name), "num_fewshot": (found.get("n-shot") or {}).get(name),
            "metrics": metrics}


def evaluate(cfg: dict, tasks: list[dict], path: str, url: str | None, out: str) -> dict:
    """Each task not already scored in out/tasks/, written there as it ends (a requeued job resumes)."""
    from lm_eval import evaluator, simple_evaluate

    evaluator.get_git_commit_hash = lambda: None  # it asks git in the job's code dir, no repository: a `fatal:` line

    from .evaluation.tasks import resolve

    manager, loads = resolve([t["name"] for t in tasks])
    lm, scored = None, {}
    os.makedirs(os.path.join(out, TASK_DIR), exist_ok=True)
    for task in tasks:
        name = task["name"]
        saved = os.path.join(out, TASK_DIR, f"{name}.json")
        if prior := done_before(saved, task):
            scored[name] = prior["summary"]
            log(f"{name}: scored before ({saved})")
            continue
        lm = lm or model(cfg, path, url)
        started = time.time()
        found = simple_evaluate(model=lm, tasks=[loads[name]], num_fewshot=task.get("num_fewshot"),
                                limit=task.get("limit"), task_manager=manager, gen_kwargs=generation(cfg) or None,
                                log_samples=False, random_seed=cfg.get("seed") or 0, bootstrap_iters=1000)
        scored[name] = {**summary(name, found), "seconds": round(time.time() - started, 1)}
        write_atomic(saved, json.dumps({"request": task, "summary": scored[name]}, indent=2))
    return scored


def run(config_path: str) -> int:
    started = time.time()
    cfg = load_config(config_path)
    tasks = precheck(cfg)
    out = cfg["output_dir"]
    wanted = request(cfg, tasks)
    results_path = os.path.join(out, RESULTS_FILE)
    if prior := done_before(results_path, wanted):
        log(f"{results_path} already answers this request: nothing to do\n" + "\n".join(score_lines(prior)))
        return 0
    try:
        import lm_eval
    except ImportError:
        raise EvalFailed(f"lm-eval is not installed in the job's Python ({sys.executable}); install the launcher's "
                         "`eval` extra there (pip install '.[eval]')") from None
    if cache := cfg.get("hf_datasets_cache"):
        os.environ.update(HF_DATASETS_CACHE=cache, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    from .evaluation.lineage import kind, lineage

    path = checkpoint(cfg)
    chain = lineage(cfg, "checkpoint")
    backend = cfg.get("backend") or "hf"
    log(f"{len(tasks)} task(s) on {path} ({kind(path, chain)}), backend {backend}, lm-eval {lm_eval.__version__}")
    if backend == "vllm":
        from .evaluation.serve import served

        serve = cfg.get("serve") or {}
        log_file = os.path.join((cfg.get("job") or {}).get("dir") or out, "vllm-server.log")
        with served(serve, path, int(serve.get("port") or 8000), log_file, log) as url:
            scored = evaluate(cfg, tasks, path, url, out)
    else:
        scored = evaluate(cfg, tasks, path, None, out)
    results = {"request": wanted,
               "checkpoint": {"path": path, "given": cfg["checkpoint"], "kind": kind(path, chain), "lineage": chain},
               "backend": backend, "harness": {"name": HARNESS, "version": lm_eval.__version__},
               **({"emulation": emulate.SUMMARY} if emulated(path) else {}),
               "tasks": scored, "generation": generation(cfg), "seconds": round(time.time() - started, 1)}
    write_atomic(results_path, json.dumps(results, indent=2) + "\n")
    log(f"wrote {results_path} in {time.time() - started:.1f} s\n" + "\n".join(score_lines(results)))
    return 0


def main(argv: list[str] | None = None) -> int:
    # input: EvalError, a Megatron export's input error, the config unreadable; the machine: a model server that
    # did not come up, lm-eval missing, the hub unreachable
    return entry.main(__doc__, run, PROG, (EvalFailed, HubUnreachable), argv)


if __name__ == "__main__":
    sys.exit(main())
