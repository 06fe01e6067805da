"""`ultra3 data prep pretrain` beside Megatron-LM's fast path (`tools/preprocess_data_fast.py --use-gigatoken`),
on the same corpus, tokenizer and machine, in one run.

    python benchmarks/data_prep_vs_megatron.py --megatron-lm DIR [--megatron-python PY] [--size-mb 279 [1000]]
                                               [--runs 5] [--vocab 32000] [--dir /tmp/u3bench-vs-megatron]

Megatron-LM's tools are not on PyPI. Fetch them at the commit these figures were taken with into a scratch
directory (never into this repository) and give its path:

    git clone https://github.com/NVIDIA/Megatron-LM /tmp/megatron-lm
    git -C /tmp/megatron-lm checkout d98e8a64ddf34856e74b24714e3bedb2f5a39553

`--megatron-python` is the Python that runs it (default: this one); it needs torch (`torch==2.13.0`), triton,
transformers, gigatoken, awkward and numpy. Its tools import `typing.override` (Python 3.12+): on an older
Python a pass-through `sitecustomize.py`, written into --dir, is put first on its PYTHONPATH.

For each --size-mb: generates the corpus as one JSONL file (the English-like stories of
recipes.samples.make_tiny, seeded; benchmarks/data_prep_pretrain.py's generator), trains a byte-level BPE of
--vocab tokens on it (cached), then runs, alternating, --runs times each:

- Megatron-LM: `preprocess_data_fast.py --input CORPUS --tokenizer-type HuggingFaceTokenizer --use-gigatoken
  --append-eod` (the tokenizer's directory has a tokenizer_config.json naming its EOS, so that EOD is appended);
- ours: `ultra3 data prep pretrain -c tiny datasets=[CORPUS] tokenizer=... num_shards=16 --force` on the
  embedded default (this machine), the whole command: the launcher, the job, the published artifact.

Each is timed as a whole process (its start to its exit) with the peak RSS of all its processes (its
process tree, sampled every 0.1 s); Megatron's own `Elapsed time` (its tokenizing and writing, without its
imports) is printed too.
Then the tokens are compared: Megatron's .bin against our shards' .bin concatenated in shard order must be
the same bytes; and each run's steady state (its `steady state:` line: the tokens of all shards over the shard
phase) is set beside rates measured right after it (raw_gigatoken): gigatoken's on 32 MB of the same texts
already decoded, on 1 thread and on all; Arrow's decoding and gigatoken's encoding alone, the two calls at the
heart of a shard task, on 64 MB of the JSONL in one process per CPU (decode_and_encode); and gigatoken's own
one-pass decoding and encoding of the same 64 MB on all threads. The table gives medians (min-max) and the
ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import data_prep_pretrain as bench  # noqa: E402  (the corpus and the tokenizer)

PINNED = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
SHIM = 'import typing\nif not hasattr(typing, "override"):\n    typing.override = lambda f: f\n'


def corpus(work: Path, size_mb: int) -> Path:
    """One JSONL file of the generated corpus (its parts concatenated)."""
    path = work / f"corpus-{size_mb}mb.jsonl"
    if not path.exists():
        parts = bench.generate(work / f"corpus-{size_mb}mb-jsonl", size_mb, "jsonl")
        with open(f"{path}.tmp", "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 24)
        os.replace(f"{path}.tmp", path)
        shutil.rmtree(work / f"corpus-{size_mb}mb-jsonl")
    return path


def tree_rss(root: int) -> int:
    """RSS in bytes of `root` and all its descendants, whatever their session (the local executor starts the
    job in a session of its own)."""
    parent, rss = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(pid)], rss[int(pid)] = int(fields[1]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += [child for child, p in parent.items() if p == pid]
    return total


def timed(argv: list[str], env: dict, cwd: Path) -> dict:
    started = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    wall = time.time() - started
    reader.join()
    log = "".join(out)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed (exit {proc.returncode}):\n{log[-3000:]}")
    return {"wall": wall, "rss": peak, "log": log}


def megatron(args, work: Path, data: Path, tokenizer: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work / "shim"), args.megatron_lm])}
    prefix = work / "megatron-out" / data.stem
    prefix.parent.mkdir(exist_ok=True)
    r = timed([args.megatron_python, "tools/preprocess_data_fast.py", "--input", str(data), "--output-prefix",
               str(prefix), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer,
               "--use-gigatoken", "--append-eod"], env, Path(args.megatron_lm))
    r["inner"] = float(re.search(r"Elapsed time: ([\d.]+) seconds", r["log"])[1])
    r["bin"] = Path(f"{prefix}_text_document.bin")
    return r


def ours(work: Path, data: Path, tokenizer: str) -> dict:
    out = work / "ours-out" / data.stem
    ultra3 = Path(sys.executable).with_name("ultra3")
    r = timed([str(ultra3), "data", "prep", "pretrain", "-c", "tiny",
               f"datasets=[{{name: corpus, path: {data}, weight: 1}}]", f"tokenizer={tokenizer}", "num_shards=16",
               f"output_dir={out}", "--force"], dict(os.environ), REPO)
    manifest = json.loads((out / "manifest.json").read_text())
    r["tokens"] = manifest["totals"]["tokens"]
    r["shards"] = [out / "corpus" / f"shard_{s['index']:06d}.bin" for s in manifest["datasets"][0]["shards"]]
    r["time_line"] = next(line for line in r["log"].splitlines() if line.startswith("time: "))
    r["steady"] = float(re.search(r"steady state: ([\d.]+)M tokens/s", r["log"])[1])
    return r


def raw_gigatoken(data: Path, tokenizer: str, work: Path) -> dict:
    """gigatoken's own rates (M tokens/s), the ceilings the steady state is held to:
    - on the texts of the first 32 MB of the corpus, already decoded, called as the shard tasks call it
      (GigatokenEncoder.ids on Arrow string arrays, about 8 MB of text a batch), on 1 thread and on all;
    - on the JSONL itself, its first 64 MB (a copy in --dir), decoded and encoded in one Rust pass by
      `encode_files` (what Megatron-LM's fast path calls), on all threads.
    Each is run once untimed first (the tokenizer's caches, the page cache)."""
    import gigatoken
    import numpy as np
    import pyarrow as pa

    from recipes.dataprep.encoders import GigatokenEncoder

    texts = bench.sample_texts([data], 32_000_000)
    cuts = np.searchsorted(np.cumsum([len(t) for t in texts]), np.arange(8_000_000, 32_000_000, 8_000_000))
    batches = [pa.array(list(part), pa.large_string())
               for part in np.split(np.array(texts, dtype=object), cuts) if len(part)]
    tokenizer_json = Path(tokenizer, "tokenizer.json").read_text()
    rates = {}
    for label, parallel in (("1 thread", False), ("all threads", True)):
        encoder = GigatokenEncoder(tokenizer_json, parallel)
        encoder.ids(batches[0])
        tokens, started = 0, time.perf_counter()
        for batch in batches:
            tokens += len(encoder.ids(batch)[0])
        rates[label] = tokens / (time.perf_counter() - started) / 1e6
    head = work / "head-64mb.jsonl"
    with open(data, "rb") as f:
        chunk = f.read(64 << 20)
    head.write_bytes(chunk[:chunk.rfind(b"\n") + 1])
    rates["Arrow + gigatoken, all processes"] = decode_and_encode(head, tokenizer_json)
    backend = gigatoken.Tokenizer.from_json(tokenizer_json).backend
    source = gigatoken.JsonlFileSource([str(head)], "text")
    backend.encode_files(source, parallel=True)
    started = time.perf_counter()
    docs = backend.encode_files(source, parallel=True)
    rates["JSONL, all threads"] = int(np.asarray(docs.layout.offsets)[-1]) / (time.perf_counter() - started) / 1e6
    head.unlink()
    return rates


def decode_and_encode(head: Path, tokenizer_json: str) -> float:
    """M tokens/s of the two calls at the heart of a shard task alone, on `head`'s 8 MB blocks shared out to one
    forked process per CPU: Arrow's JSON decoding (record_texts.jsonl_block: UTF-8 check, parse, one text per line)
    and gigatoken's encoding of the texts (GigatokenEncoder.ids), each block read from the page cache -- no EOD,
    writing, hashing or fsync.
    The bound on any shard task that decodes its JSON with Arrow, on these cores."""
    import multiprocessing

    data = head.read_bytes()
    blocks, at = [], 0
    while at < len(data):
        end = data.rfind(b"\n", at, at + (8 << 20)) + 1 or len(data)
        blocks.append((at, end - at))
        at = end
    with multiprocessing.get_context("forkserver").Pool(os.cpu_count(), _worker_encoder,
                                                         (str(head), tokenizer_json)) as pool:
        pool.map(_decode_encode, blocks * 2, chunksize=1)  # every worker started and warm
        started = time.perf_counter()
        tokens = sum(pool.map(_decode_encode, blocks, chunksize=1))
        return tokens / (time.perf_counter() - started) / 1e6


_worker: dict = {}


def _worker_encoder(path: str, tokenizer_json: str) -> None:
    from recipes.dataprep.encoders import GigatokenEncoder

    _worker.update(path=path, encoder=GigatokenEncoder(tokenizer_json))


def _decode_encode(block: tuple[int, int]) -> int:
    from recipes.dataprep.bad_records import BadRecords
    from recipes.dataprep.record_texts import jsonl_block

    with open(_worker["path"], "rb") as f:
        f.seek(block[0])
        data = f.read(block[1])
    texts = jsonl_block(_worker["path"], data, data.count(b"\n"), int, "text", BadRecords())
    return len(_worker["encoder"].ids(texts)[0])


def same_bytes(one: Path, parts: list[Path]) -> bool:
    with open(one, "rb") as f:
        for part in parts:
            with open(part, "rb") as p:
                while chunk := p.read(1 << 24):
                    if f.read(len(chunk)) != chunk:
                        return False
        return f.read(1) == b""


def cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megatron-lm", required=True, help="a checkout of NVIDIA/Megatron-LM (see above)")
    parser.add_argument("--megatron-python", default=sys.executable)
    parser.add_argument("--size-mb", type=int, nargs="+", default=[279])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dir", default="/tmp/u3bench-vs-megatron")
    args = parser.parse_args()
    tool = Path(args.megatron_lm, "tools", "preprocess_data_fast.py")
    if not tool.is_file():
        raise SystemExit(f"--megatron-lm: {tool} does not exist; fetch Megatron-LM first: git clone "
                         f"https://github.com/NVIDIA/Megatron-LM DIR && git -C DIR checkout {PINNED}")
    work = Path(args.dir)
    (work / "shim").mkdir(parents=True, exist_ok=True)
    (work / "shim" / "sitecustomize.py").write_text(SHIM)
    commit = subprocess.run(["git", "-C", args.megatron_lm, "rev-parse", "HEAD"], capture_output=True, text=True)
    print(f"machine: {os.cpu_count()} CPUs; Megatron-LM {commit.stdout.strip() or '(not a git checkout)'} run by "
          f"{args.megatron_python}; ours by {sys.executable}", flush=True)
    rows = []
    for size in args.size_mb:
        data = corpus(work, size)
        tokenizer = bench.trained_tokenizer(work, [data], args.vocab, 16)
        Path(tokenizer, "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
        runs: dict = {"megatron": [], "ours": []}
        for i in range(args.runs):
            for name in ("megatron", "ours"):
                r = megatron(args, work, data, tokenizer) if name == "megatron" else ours(work, data, tokenizer)
                runs[name].append(r)
                extra = (f", its own Elapsed {r['inner']:.2f} s" if name == "megatron" else
                         f"; steady state {r['steady']:.2f} M tokens/s; {r['time_line']}")
                print(f"  {size} MB run {i + 1} {name}: {r['wall']:.2f} s, peak RSS {r['rss'] / 2**20:.0f} MiB{extra}",
                      flush=True)
            runs["ours"][-1]["raw"] = raw = raw_gigatoken(data, tokenizer, work)  # right after our run: same drift
            print(f"  {size} MB run {i + 1} gigatoken alone: "
                  f"{', '.join(f'{k} {v:.2f}' for k, v in raw.items())} M tokens/s", flush=True)
        ours_runs = runs["ours"]
        print(f"  {size} MB: our steady state (tokens of all shards over the shard phase, 2 workers) "
              f"{cell([r['steady'] for r in ours_runs], '.2f')} M tokens/s; gigatoken alone on these cores "
              + ", ".join(f"{k} {cell([r['raw'][k] for r in ours_runs], '.2f')}" for k in raw) + " M tokens/s; "
              "ours over gigatoken's, run by run: "
              + ", ".join(f"{cell([100 * r['steady'] / r['raw'][k] for r in ours_runs], '.0f')}% of {k}" for k in raw),
              flush=True)
        m, u = runs["megatron"][-1], runs["ours"][-1]
        identical = same_bytes(m["bin"], u["shards"])
        print(f"  {size} MB: {u['tokens']:,} tokens; Megatron's .bin and ours concatenated are "
              f"{'the same bytes' if identical else 'DIFFERENT'}", flush=True)
        walls = {k: [r["wall"] for r in v] for k, v in runs.items()}
        rows.append((size, u["tokens"], identical, walls, [r["inner"] for r in runs["megatron"]],
                     {k: [r["rss"] / 2**20 for r in v] for k, v in runs.items()}))
    print(f"\nmedian (min-max) of {args.runs} alternating runs each; whole process, start to exit\n")
    print(f"{'corpus':>8} {'tokens':>12} {'same bytes':>10} {'Megatron-LM fast path s':>24} "
          f"{'(its Elapsed s)':>18} {'ultra3 s':>18} {'speed-up':>9} {'Megatron RSS MiB':>17} {'ultra3 RSS MiB':>15}")
    for size, tokens, identical, walls, inner, rss in rows:
        ratio = statistics.median(walls["megatron"]) / statistics.median(walls["ours"])
        print(f"{size:>5} MB {tokens:>12,} {'yes' if identical else 'NO':>10} {cell(walls['megatron'], '.2f'):>24} "
              f"{cell(inner, '.2f'):>18} {cell(walls['ours'], '.2f'):>18} {ratio:>8.2f}x "
              f"{statistics.median(rss['megatron']):>17.0f} {statistics.median(rss['ours']):>15.0f}")


if __name__ == "__main__":
    main()
