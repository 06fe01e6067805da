"""Figures of the one-GPU training smoke tests (scripts/gpu/smoke.sh), from the logs it kept.

    python benchmarks/gpu_smoke.py DIR [--plot loss.png]

DIR holds what smoke.sh wrote: <step>.log for each step (pretrain, resume, sft, quantize),
<step>.memory.csv (nvidia-smi's memory.used in MiB, sampled every 200 ms while the step ran) and
versions.json (GPU, driver, Python packages). Prints, per training step: iterations, the loss of the first and
last iteration and the lowest, the first iteration's time (kernel compilation and autotuning happen there), the
median step time of the iterations after the first 3, tokens/s (global batch x sequence length / step time),
Megatron's own peak allocated memory, and the GPU's peak memory as nvidia-smi saw it (the CUDA context and the
caching allocator's reserve included), and the seconds Triton spent autotuning (the sum of the times it prints
under TRITON_PRINT_AUTOTUNING=1, which smoke.sh sets); then the validation losses, the checkpoints saved and
loaded, and the quantize step's accuracy and size. Where smoke.sh's `again` step ran (<step>.again.log: the same
training with the compile cache the first run filled), a second table puts each step's first iteration and
autotuning beside the first run's, with the autotune results the job pinned from the cache and the largest
difference of the per-iteration loss between the two runs. Where the `rl` step ran (rl.log: `ultra3 rl rlvr -c tiny`),
a table of its GRPO steps from the runtime's `rl: step` lines (recipes/rl_steps.py): the mean reward, the KL
(NeMo RL's generation KL error), the loss, the step's seconds and those spent generating and training, and the GPU's
peak memory over the step. Writes DIR/results.json with every iteration's figures and, when matplotlib is there,
the loss curves as a PNG.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

from ultra3 import progress  # Megatron-Bridge's log lines, read as `nemotron jobs status` reads them

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the runtime package `recipes`
from recipes import rl_steps  # noqa: E402  the RL runtime's per-step line

STEPS = ("pretrain", "resume", "phases", "sft", "quantize")
AUTOTUNED = re.compile(r"^finished after ([0-9.]+)s,")
ACCURACY = re.compile(r"accuracy on (\d+) held-out tokens: relative logit error ([0-9.]+), top-1 agreement ([0-9.]+), "
                      r"perplexity ([0-9.]+) -> ([0-9.]+)")
QUANTIZED = re.compile(r"ultra3 quantize: wrote (\S+) \(bits per element ([0-9.]+)\) in ([0-9.]+) s")
PINNED = re.compile(r"^ultra3: pinned (\d+) recorded autotune")  # recipes/training/tune_cache.py
CACHE = re.compile(r"^compile cache: (\S+) \((warm|cold|off)")  # recipes/compile_cache.py


def parse(text: str) -> dict:
    step = {"iterations": [], "memory_gb": {}, "saved": [], "loaded": [], "validation": []}
    autotuned, quantized, pinned, cache = [], {}, None, None
    for line in text.splitlines():
        if found := progress.iteration(line, keep=None):  # every field
            step["iterations"].append(found[0])
        elif said := progress.event(line):
            kind, values = said
            if kind == "memory":
                step["memory_gb"] = values
            else:
                step[kind].append(values)
        elif match := AUTOTUNED.search(line):
            autotuned.append(float(match.group(1)))
        elif match := ACCURACY.search(line):
            quantized.update(zip(("held_out_tokens", "relative_logit_error", "top1_agreement", "perplexity_bf16",
                                  "perplexity_quantized"), map(float, match.groups())))
        elif match := QUANTIZED.search(line):
            quantized.update(output=match.group(1), bits_per_element=float(match.group(2)),
                             seconds=float(match.group(3)))
        elif match := PINNED.search(line):
            pinned = (pinned or 0) + int(match.group(1))
        elif match := CACHE.search(line):
            cache = match.group(2)
    return {**step, "autotune_s": round(sum(autotuned), 2) if autotuned else None,
            "autotuned_kernels": len(autotuned), "quantized": quantized, "pinned": pinned, "cache": cache}


def loss_difference(first: dict, again: dict) -> float | None:
    """The largest |loss difference| at the iterations both runs logged."""
    losses = {it["iteration"]: it["lm loss"] for it in first["iterations"] if "lm loss" in it}
    diffs = [abs(it["lm loss"] - losses[it["iteration"]]) for it in again["iterations"]
             if "lm loss" in it and it["iteration"] in losses]
    return max(diffs) if diffs else None


def second_run(steps: dict, again: dict) -> dict:
    """Each step run again with the compile cache: its first iteration and autotuning beside the first run's."""
    print(f"\n{'again':9} {'cache':>5} {'1st it s':>8} {'then s':>8} {'autotune s':>10} {'then s':>8} {'pinned':>6} "
          f"{'max loss diff':>13}")
    rows = {}
    for name, step in again.items():
        first = summary(steps.get(name) or {"iterations": []}, 0)
        row = {"cache": step["cache"], "first_iteration_s": summary(step, 0).get("first_iteration_s"),
               "first_run_first_iteration_s": first.get("first_iteration_s"), "autotune_s": step["autotune_s"] or 0.0,
               "first_run_autotune_s": (steps.get(name) or {}).get("autotune_s"), "pinned": step["pinned"],
               "max_loss_difference": loss_difference(steps[name], step) if name in steps else None}
        rows[name] = row
        print(f"{name:9} {row['cache'] or '-':>5} {_num(row['first_iteration_s'], 8, 1)} "
              f"{_num(row['first_run_first_iteration_s'], 8, 1)} {_num(row['autotune_s'], 10, 1)} "
              f"{_num(row['first_run_autotune_s'], 8, 1)} {_num(row['pinned'], 6)} "
              f"{_num(row['max_loss_difference'], 13, 5)}")
    return rows


def rl_table(text: str, gpu_peak_mib: float | None) -> list[dict]:
    """The `rl: step` lines of the rl step's log, printed as a table."""
    rows = [row for line in text.splitlines() if (row := rl_steps.parse(line))]
    print(f"\n{'rl step':7} {'reward':>7} {'kl':>9} {'loss':>8} {'step s':>7} {'generation s':>12} {'training s':>10}")
    for row in rows:
        print(f"{row['step']:>3}/{row['steps']:<3} {_num(row.get('reward'), 7, 4)} {_num(row.get('kl'), 9, 6)} "
              f"{_num(row.get('loss'), 8, 4)} {_num(row.get('step_s'), 7, 1)} {_num(row.get('generation_s'), 12, 2)} "
              f"{_num(row.get('training_s'), 10, 2)}")
    print(f"rl: {len(rows)} GRPO step(s), GPU peak {_num(gpu_peak_mib, 0)} MiB")
    return rows


def peak_mib(path: Path) -> float | None:
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        values = [float(row[-1]) for row in csv.reader(f) if row and row[-1].strip().replace(".", "", 1).isdigit()]
    return max(values) if values else None


def summary(step: dict, seq_length: int) -> dict:
    its = step["iterations"]
    if not its:
        return {}
    times = [it["elapsed time per iteration (ms)"] for it in its[progress.WARMUP:] or its]
    losses = [it["lm loss"] for it in its if "lm loss" in it]
    ms = statistics.median(times)
    batch = its[-1].get("global batch size", 0)
    memory = step["memory_gb"]
    return {"iterations": f"{its[0]['iteration']}-{its[-1]['iteration']}", "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "min_loss": min(losses) if losses else None,
            "first_iteration_s": its[0]["elapsed time per iteration (ms)"] / 1000, "step_ms": ms,
            "tokens_per_s": batch * seq_length / (ms / 1000) if ms else None,
            "peak_allocated_gb": memory.get("mem-max-allocated-gigabytes", memory.get("peak_allocated_mem"))}


def plot(steps: dict, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, step in steps.items():
        points = [(it["iteration"], it["lm loss"]) for it in step["iterations"] if "lm loss" in it]
        if points:
            ax.plot(*zip(*points), marker=".", label=name)
        for v in step["validation"]:
            if v["set"] != "test":
                ax.scatter([v["iteration"]], [v["lm loss"]], marker="x", color="black")
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--seq-length", type=int, default=512, help="the tiny configs' sequence and pack length")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    versions = json.loads((args.dir / "versions.json").read_text()) if (args.dir / "versions.json").is_file() else {}
    steps = {name: parse((args.dir / f"{name}.log").read_text(errors="replace"))
             for name in STEPS if (args.dir / f"{name}.log").is_file()}
    rl_log = args.dir / "rl.log"
    if not steps and not rl_log.is_file():
        print(f"gpu_smoke: no <step>.log in {args.dir}", file=sys.stderr)
        return 2
    rows = {}
    print(f"GPU: {versions.get('gpu', '?')}; " + ", ".join(f"{k} {v}" for k, v in versions.get("packages", {}).items()))
    if steps:
        print(f"{'step':9} {'iterations':>10} {'first loss':>10} {'last loss':>9} {'min loss':>8} {'1st it s':>8} "
              f"{'autotune s':>10} {'step ms':>8} {'tokens/s':>9} {'peak alloc GB':>13} {'GPU peak MiB':>12}")
    for name, step in steps.items():
        row = {**summary(step, args.seq_length), "autotune_s": step["autotune_s"],
               "gpu_peak_mib": peak_mib(args.dir / f"{name}.memory.csv")}
        rows[name] = row
        if "step_ms" not in row:
            print(f"{name:9} {'-':>10} {'':>38} {_num(row['autotune_s'], 10, 1)} {'':>32} "
                  f"{_num(row['gpu_peak_mib'], 12)}")
            continue
        print(f"{name:9} {row['iterations']:>10} {_num(row['first_loss'], 10, 3)} {_num(row['last_loss'], 9, 3)} "
              f"{_num(row['min_loss'], 8, 3)} {_num(row['first_iteration_s'], 8, 1)} {_num(row['autotune_s'], 10, 1)} "
              f"{_num(row['step_ms'], 8, 1)} {_num(row['tokens_per_s'], 9)} "
              f"{_num(row['peak_allocated_gb'], 13, 2)} {_num(row['gpu_peak_mib'], 12)}")
    for name, step in steps.items():
        for v in step["validation"]:
            print(f"{name}: {v['set']} lm loss {v['lm loss']:.3f} at iteration {v['iteration']}")
        for s in step["saved"]:
            print(f"{name}: saved iteration {s['iteration']} to {s['dir']}")
        for s in step["loaded"]:
            print(f"{name}: loaded iteration {s['iteration']} from {s['dir']}")
        q = step["quantized"]
        if "relative_logit_error" in q:
            print(f"{name}: {q['held_out_tokens']:.0f} held-out tokens, relative logit error "
                  f"{q['relative_logit_error']:.4f}, top-1 agreement {q['top1_agreement']:.3f}, "
                  f"perplexity {q['perplexity_bf16']:.3f} -> {q['perplexity_quantized']:.3f}")
        if "bits_per_element" in q:
            print(f"{name}: wrote {q['output']}, {q['bits_per_element']:.3f} bits per element, {q['seconds']:.1f} s")
    again = {name: parse((args.dir / f"{name}.again.log").read_text(errors="replace"))
             for name in STEPS if (args.dir / f"{name}.again.log").is_file()}
    results = {"versions": versions, "summary": rows, "steps": steps,
               **({"again": {"summary": second_run(steps, again), "steps": again}} if again else {})}
    if rl_log.is_file():
        peak = peak_mib(args.dir / "rl.memory.csv")
        results["rl"] = {"steps": rl_table(rl_log.read_text(errors="replace"), peak), "gpu_peak_mib": peak}
    (args.dir / "results.json").write_text(json.dumps(results, indent=1))
    if args.plot:
        title = f"ultra3 tiny smoke test: {versions.get('gpu', '')}, BF16"
        print(f"plot: {args.plot}" if plot(steps, args.plot, title) else "plot: matplotlib not installed")
    return 0


def _num(value: float | None, width: int, digits: int = 0) -> str:
    return f"{value:>{width},.{digits}f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


if __name__ == "__main__":
    raise SystemExit(main())
