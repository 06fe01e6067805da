"""Throughput of `data prep pretrain` on a generated corpus, beside the raw rate of its tokenizer.

    python benchmarks/data_prep_pretrain.py [--size-mb 200 [...]] [--workers 1 2] [--dir /tmp/u3bench]
                                            [--format jsonl.zst|jsonl|parquet] [--tokenizer PATH | --vocab N]
                                            [--encoder auto|gigatoken|tokenizers] [--gigatoken auto|yes|no]
                                            [--backend processes|ray]

1. Generates a corpus of --size-mb MB of text (JSONL bytes; the English-like stories of
   recipes.samples.make_tiny, seeded) as 8 files in --format, once (kept in --dir for later runs). With
   several sizes, step 2 runs on each (so the peak RSS of each size is printed: memory should be flat in
   the corpus size) and steps 3 and 4 on the last.
2. Runs the real pipeline (recipes.data_prep_pretrain in a subprocess, 16 shards, `backend: --backend`: the
   process pool of a run on one machine, or an embedded Ray,
   `force: true`, `encoder: --encoder`) once per --workers value; reports wall time, tokens/s, MB/s (corpus
   bytes / wall) and the peak RSS of the whole run (driver + Ray, summed over its processes, sampled every
   0.2 s) and of its largest single process; the shard phase: from the line saying Ray is up to the last
   shard done (the workers' start-up included, their start and stop not); the steady state, from the run's
   own `steady state:` line: all shard tokens over the time from the first shard task starting in a worker
   to the last one done (the workers' start-up excluded; gaps between tasks, per-task overheads
   and an uneven end included); and where the wall time went, from the run's `time:` line.
3. Runs the same shard tasks without Ray (`shards.write_shard` in 1 process, or a pool of N): the rate of
   the hot loop (read, encode, write) with no scheduler at all.
4. Measures the raw encoder on the first 64 MB (--encoder-mb) of the same texts, outside Ray: HF `tokenizers`
   `encode_batch_fast` on 1 thread and on all threads, and `gigatoken` (`pip install gigatoken==0.10.0`; with
   --gigatoken auto it is installed into --dir with pip when missing) on 1 and all threads, both as Python
   lists (`encode_batch_list`) and as arrays (`encode_batch`, what the pipeline uses), each used only if it
   reproduces the `tokenizers` ids exactly.

Tokenizer: the tiny sample's 4k byte-level BPE (recipes/samples/tiny) by default, any `--tokenizer`, or with
`--vocab N` a byte-level BPE of N tokens trained here with `tokenizers` (make_tiny.train_tokenizer) on the
first --train-mb MB (default 16) of the corpus's text plus 5 MB of made-up words (the corpus's own word
list fills only about 23k tokens), cached in --dir: `--vocab 32000` and `--vocab 131072` are the
vocabularies of the issue's measurements (training takes 10-30 s here, once).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the runtime package `recipes`

from recipes import data_prep_pretrain as pipeline  # noqa: E402
from recipes.dataprep import encoders, inputs, shards  # noqa: E402
from recipes.dataprep import tokenizer as tokenization  # noqa: E402
from recipes.samples import make_tiny  # noqa: E402

FILES = 8


def generate(directory: Path, size_mb: int, fmt: str) -> list[Path]:
    marker = directory / f"corpus-{size_mb}mb-{fmt}.done"
    paths = [directory / f"part-{i:02d}.{fmt}" for i in range(FILES)]
    if marker.exists():
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    per_file = size_mb * 1_000_000 // FILES
    started = time.time()
    for i, path in enumerate(paths):
        gen = make_tiny.stories(seed=100 + i)
        docs, size = [], 0
        while size < per_file:
            d = next(gen)
            docs.append(d)
            size += len(json.dumps(d, ensure_ascii=False).encode()) + 1
        if fmt == "parquet":
            make_tiny.write_parquet(str(path), docs, row_group_size=2000)
        elif fmt == "jsonl.zst":
            import zstandard

            with open(path, "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as f:
                for d in docs:
                    f.write((json.dumps(d, ensure_ascii=False) + "\n").encode())
        else:
            with open(path, "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps(d, ensure_ascii=False) + "\n")
        print(f"  generated {path.name}: {len(docs):,} docs", flush=True)
    marker.write_text("")
    print(f"corpus: {size_mb} MB of JSONL text in {FILES} {fmt} files, generated in {time.time() - started:.0f} s")
    return paths


def session_rss(sid: int) -> tuple[int, int]:
    """(sum, max) RSS in bytes of the live processes of session `sid`."""
    total = biggest = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # field 6 of stat: the session id
                continue
            rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, IndexError, ValueError):
            continue
        total += rss
        biggest = max(biggest, rss)
    return total, biggest


def bench_config(paths: list[Path], tokenizer: str, out: Path, workers: int, encoder: str,
                 backend: str = "processes") -> dict:
    pattern = str(paths[0].parent / f"part-*.{paths[0].name.split('.', 1)[1]}")
    return {"backend": backend, "datasets": [{"name": "bench", "path": pattern}],
            "tokenizer": tokenizer, "output_dir": str(out), "num_shards": 16, "workers": workers, "force": True,
            "progress_interval": 10, "encoder": encoder}


def run_pipeline(paths: list[Path], tokenizer: str, out: Path, workers: int, work: Path, encoder: str,
                 backend: str) -> dict:
    config = work / f"bench-w{workers}.yaml"
    config.write_text(json.dumps(bench_config(paths, tokenizer, out, workers, encoder, backend)))  # JSON is YAML
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "recipes.data_prep_pretrain", "--config", str(config)], env=env,
                            cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list = []  # (time, line)
    reader = threading.Thread(target=lambda: lines.extend((time.time(), x) for x in proc.stdout), daemon=True)
    reader.start()
    peak_sum = peak_one = 0
    while proc.poll() is None:
        total, biggest = session_rss(proc.pid)
        peak_sum, peak_one = max(peak_sum, total), max(peak_one, biggest)
        time.sleep(0.2)
    wall = time.time() - started
    reader.join()
    log = "".join(x for _, x in lines)
    if proc.returncode != 0:
        raise SystemExit(f"the pipeline failed (rc {proc.returncode}):\n{log[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    ray_up = next(t for t, x in lines if "shard(s) to write" in x)  # the workers are up
    last_shard = [t for t, x in lines if x.startswith("progress:")][-1]  # printed as the last shard ends
    phases = next(x[len("time: "):].strip() for _, x in lines if x.startswith("time: "))
    steady = next(re.search(r"\(([\d,]+) tokens of \d+ shard\(s\) in ([\d.]+) s", x) for _, x in lines
                  if x.startswith("steady state: "))
    encoder = next((x.split("encoder ", 1)[1].split(";")[0] for _, x in lines if "; encoder " in x), "?")
    if any(x.startswith("encoder: tokenizers") for _, x in lines):
        encoder = "tokenizers (fell back)"
    return {"wall": wall, "tokens": manifest["totals"]["tokens"], "docs": manifest["totals"]["docs"],
            "peak_rss_sum": peak_sum, "peak_rss_one": peak_one, "log": log, "shard_phase": last_shard - ray_up,
            "startup": ray_up - started, "encoder": encoder, "phases": phases,
            "steady": (int(steady[1].replace(",", "")), float(steady[2])),
            "before_run": next(t for t, x in lines if x.startswith("ultra3 data prep pretrain:")) - started}


def _shard_task(args):
    return shards.write_shard(*args)["tokens"]


def run_without_ray(paths: list[Path], tokenizer: str, out: Path, workers: int, encoder: str) -> dict:
    """The pipeline's shard tasks in `workers` processes (no Ray): the rate of the hot loop."""
    import multiprocessing


    settings = pipeline.parse_settings(bench_config(paths, tokenizer, out, workers, encoder))
    tok, tok_json = tokenization.load(settings.tokenizer)
    chosen, _ = encoders.choose(settings.encoder, tok_json, tok.sha256)
    files = pipeline.resolve_files(settings)
    with pipeline.Cluster() as cluster:  # started only for inputs too big to count here
        plan = pipeline.make_plan(settings, pipeline.scan_sources(settings, files, {}, cluster), tok)
    tasks = sorted((t for ts in plan.values() for t in ts), key=lambda t: -t.est_bytes)
    args = [(t, tok_json, tok.sha256, tok.eod_id, tok.dtype, False, 1, chosen) for t in tasks]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_shard_task, args[:workers])  # start-up and imports, not counted
        started = time.time()
        tokens = sum(pool.imap_unordered(_shard_task, args))
        wall = time.time() - started
    return {"wall": wall, "tokens": tokens, "encoder": chosen}


def sample_texts(paths: list[Path], limit_bytes: int) -> list[str]:
    texts, size = [], 0
    bad = inputs.BadRecords()
    for path in paths:
        fmt = inputs.detect_format(str(path))
        for nbytes, block in inputs.read_texts(str(path), fmt, "text", 0, 1 << 62, bad):
            texts += block.to_pylist()
            size += nbytes
            if size >= limit_bytes:
                return texts
    return texts


def encoder_rates(tokenizer_json: str, texts: list[str], mode: str, work: Path) -> list[tuple]:
    """Rows of raw encoder rates. Each batch's ids are timed as the encoder returns them (Python lists, or
    arrays), then compared with the reference outside the timer and dropped (keeping millions of Python
    ints alive would slow everything after them down)."""
    import itertools

    import numpy as np
    from tokenizers import Tokenizer

    nbytes = sum(len(t.encode()) for t in texts)
    batches = [texts[i:i + 1024] for i in range(0, len(texts), 1024)]
    flat = lambda ids: np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32)  # noqa: E731
    reference: list = []

    def measure(label: str, encode, as_array) -> tuple:
        wall, n, same = 0.0, 0, True
        for i, batch in enumerate(batches):
            started = time.perf_counter()
            got = encode(batch)
            wall += time.perf_counter() - started
            got = as_array(got)
            n += got.size
            if len(reference) <= i:
                reference.append(got)
            else:
                same = same and np.array_equal(got, reference[i])
            del got
        if not same:
            return (label + ": ids differ, rate not used", None, None, None, None)
        return (label + (" (ids identical)" if not label.startswith("tokenizers") else ""), wall, n, n / wall,
                nbytes / wall / 1e6)

    rows = []
    tok = Tokenizer.from_str(tokenizer_json)
    for threads in ("1", "all"):
        os.environ["TOKENIZERS_PARALLELISM"] = "false" if threads == "1" else "true"
        rows.append(measure(f"tokenizers encode_batch_fast, {threads} thread(s)",
                            lambda b: [e.ids for e in tok.encode_batch_fast(b, add_special_tokens=False)], flat))
    gt = load_gigatoken(mode, work)
    if gt is None:
        rows.append(("gigatoken: skipped (--gigatoken no, or it does not install)", None, None, None, None))
        return rows
    import awkward  # noqa: F401  (imported by encode_batch on first use: not timed)

    version = getattr(gt, "__version__", None) or _dist_version("gigatoken")
    for how in ("encode_batch_list", "encode_batch"):
        for parallel in (False, True):
            g = gt.Tokenizer.from_json(tokenizer_json).backend  # a fresh one: no cache from the run before
            label = f"gigatoken {version} {how}, {'all threads' if parallel else '1 thread'}"
            if how == "encode_batch_list":
                rows.append(measure(label, lambda b: g.encode_batch_list(b, parallel=parallel), flat))
            else:  # arrays: the flat ids of each batch, read from the awkward layout as the pipeline does
                def arrays(b):
                    layout = g.encode_batch(b, parallel=parallel).layout
                    return np.asarray(layout.content.data)[layout.offsets[0]:layout.offsets[-1]]

                rows.append(measure(label, arrays, lambda a: a))
    return rows


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return ""


def load_gigatoken(mode: str, work: Path):
    if mode == "no":
        return None
    try:
        import gigatoken

        return gigatoken
    except ImportError:
        pass
    target = work / "gigatoken-pkg"  # auto or yes: install it
    if not target.exists():
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                              "gigatoken==0.10.0"], capture_output=True, text=True)
        if pip.returncode != 0:
            print(f"pip install gigatoken failed: {pip.stderr.strip().splitlines()[-1:]}", flush=True)
            return None
    sys.path.append(str(target))  # after the venv's own packages, so its numpy etc. win
    try:
        import gigatoken

        return gigatoken
    except ImportError as e:
        print(f"gigatoken does not import: {e}", flush=True)
        return None


def trained_tokenizer(work: Path, paths: list[Path], vocab: int, train_mb: int) -> str:
    """A byte-level BPE of `vocab` tokens trained on the first `train_mb` MB of the corpus's text and 5 MB of
    made-up words (1-4 syllables of make_tiny, seeded): the corpus alone has too few words to fill a large
    vocabulary. Deterministic (the same text in the same order); kept in `work` for later runs. Its directory."""
    directory = work / f"tokenizer-bpe{vocab}-{train_mb}mb-{paths[0].parent.name}"
    path = directory / "tokenizer.json"
    if not path.exists():
        started = time.time()
        rng = random.Random(vocab)
        words = [" ".join("".join(rng.choice(make_tiny.SYLLABLES) for _ in range(rng.randint(1, 4)))
                          for _ in range(1000)) for _ in range(600)]
        tok = make_tiny.train_tokenizer(sample_texts(paths, train_mb * 1_000_000) + words, vocab)
        directory.mkdir(parents=True, exist_ok=True)
        tok.save(str(directory / "tokenizer.json.tmp"))
        os.replace(directory / "tokenizer.json.tmp", path)
        print(f"trained a byte-level BPE of {tok.get_vocab_size():,} tokens on {train_mb} MB of the corpus and "
              f"made-up words in {time.time() - started:.1f} s: {directory}", flush=True)
    return str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, nargs="+", default=[200])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dir", default="/tmp/u3bench-data-prep")
    parser.add_argument("--format", default="jsonl.zst", choices=("jsonl.zst", "jsonl", "parquet"))
    parser.add_argument("--tokenizer", default=str(REPO / "recipes" / "samples" / "tiny"))
    parser.add_argument("--vocab", type=int, help="train a byte-level BPE of this many tokens on the corpus and use it")
    parser.add_argument("--train-mb", type=int, default=16, help="text the --vocab tokenizer is trained on")
    parser.add_argument("--encoder", default="auto", choices=("auto", "gigatoken", "tokenizers"),
                        help="the pipeline's encoder key")
    parser.add_argument("--gigatoken", default="auto", choices=("auto", "yes", "no"),
                        help="the raw gigatoken rates: measure them (installing it into --dir if missing)")
    parser.add_argument("--backend", default="processes", choices=("processes", "ray"), help="the pipeline's backend")
    parser.add_argument("--no-ray-runs", action="store_true", help="skip the shard tasks run without a scheduler")
    parser.add_argument("--encoder-mb", type=int, default=64, help="text measured for the raw encoder rates")
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    corpora = {size: generate(work / f"corpus-{size}mb-{args.format.replace('.', '-')}", size, args.format)
               for size in args.size_mb}
    paths = corpora[args.size_mb[-1]]
    tokenizer = trained_tokenizer(work, paths, args.vocab, args.train_mb) if args.vocab else args.tokenizer
    info, tokenizer_json = tokenization.load(tokenizer)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; tokenizer {tokenizer} "
          f"(vocab {info.vocab_size:,}, {info.dtype})", flush=True)
    rows = []
    for size, size_paths in corpora.items():
        for workers in args.workers:
            r = run_pipeline(size_paths, tokenizer, work / f"out-w{workers}", workers, work, args.encoder, args.backend)
            what = f"{size} MB, pipeline, {workers} worker(s)"
            rows.append((f"{what}, encoder {r['encoder']}: end to end", r["wall"], r["tokens"],
                         r["tokens"] / r["wall"], size * 1e6 / r["wall"] / 1e6, r["peak_rss_sum"], r["peak_rss_one"]))
            rows.append((f"{what}: shard phase (workers up to last shard)", r["shard_phase"], r["tokens"],
                         r["tokens"] / r["shard_phase"], size * 1e6 / r["shard_phase"] / 1e6, None, None))
            tokens, seconds = r["steady"]
            rows.append((f"{what}: steady state (first shard started to last done)", seconds, tokens,
                         tokens / seconds, None, None, None))
            print(f"  {rows[-3][0]}: {r['wall']:.1f} s ({r['startup']:.1f} s to workers up, {r['shard_phase']:.1f} s "
                  f"of shards), {r['docs']:,} docs; load average {os.getloadavg()[0]:.2f}\n    where the time "
                  f"went: {r['phases']} (process start to the plan line {r['before_run']:.1f} s)", flush=True)
    if not args.no_ray_runs:
        for workers in args.workers:
            r = run_without_ray(paths, tokenizer, work / f"out-noray-w{workers}", workers, args.encoder)
            rows.append((f"shard tasks without Ray, {workers} process(es), encoder {r['encoder']}", r["wall"],
                         r["tokens"], r["tokens"] / r["wall"], args.size_mb[-1] / r["wall"], None, None))
            print(f"  {rows[-1][0]}: {r['wall']:.1f} s", flush=True)
    texts = sample_texts(paths, args.encoder_mb * 1_000_000)
    for row in encoder_rates(tokenizer_json, texts, args.gigatoken, work):
        rows.append((*row, None, None))
    print(f"\ncorpus {', '.join(map(str, args.size_mb))} MB ({args.format}); tokenizer vocab {info.vocab_size:,}; raw "
          f"encoder on the first {args.encoder_mb} MB of the {args.size_mb[-1]} MB corpus's text; load average "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    print(f"{'what':<76} {'wall s':>8} {'tokens':>13} {'tokens/s':>11} {'MB/s':>7} {'peak RSS':>9} {'max proc':>9}")
    for what, wall, tokens, rate, mbs, rss, one in rows:
        cells = [f"{wall:8.1f}" if wall is not None else f"{'':>8}",
                 f"{tokens:13,}" if tokens is not None else f"{'':>13}",
                 f"{rate / 1e6:9.2f} M" if rate is not None else f"{'':>11}",
                 f"{mbs:7.1f}" if mbs is not None else f"{'':>7}",
                 f"{rss / 2**20:7.0f} M" if rss else f"{'':>9}",
                 f"{one / 2**20:7.0f} M" if one else f"{'':>9}"]
        print(f"{what:<76} " + " ".join(cells))


if __name__ == "__main__":
    main()
