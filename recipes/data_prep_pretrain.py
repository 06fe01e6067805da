"""Runtime of `ultra3 data prep pretrain`: tokenize pretraining corpora into Megatron bin/idx shards.

    python -m recipes.data_prep_pretrain --config config.yaml

Started by recipes.launch inside the job (after the preflight) with the resolved config; it runs just as
well by hand. Needs the `data` extra (ray, tokenizers, gigatoken, pyarrow, numpy, zstandard,
huggingface_hub) and PyYAML; never the launcher.

Config keys, each required (a missing one is an input error): the launcher's compiled config has them all, with
the defaults shown here from configs/_shared/data_prep.yaml and configs/data_prep/pretrain/default.yaml, and their
ranges checked; others, such as `run` and `job`, are ignored:

    datasets:            # required, a list of
      - name: web        #   required, unique, [A-Za-z0-9._-]: the output subdirectory
        path: /data/web/*.jsonl.zst   # a JSONL (plain/.gz/.zst) or Parquet file, a directory, a glob,
                                      # or hf://org/name[/glob] (Hugging Face dataset)
        text_field: text #   default: the top-level text_field
        weight: 1.0      #   default 1.0; its share of the blend
        split: train     #   hf:// only: the split to read (default train)
        subset: null     #   hf:// only: the dataset config (subset)
        revision: null   #   hf:// only: branch, tag or commit (default main)
    tokenizer: org/name  # required: a tokenizer.json, a directory holding one, or a hub model id[@revision]
    text_field: text     # the datasets' text_field where one names none
    eod_token: null      # null: the tokenizer's eos_token
    output_dir: /out     # required
    num_shards: 128      # per dataset (fewer when a dataset has fewer records)
    valid_shards: 1      # per dataset with >= 3 shards; else all train
    test_shards: 1
    sample: null         # N: the first N records of each dataset, into output_dir/sample-N
    force: false         # redo every shard
    strict: false        # a bad record stops the run (exit 2)
    max_bad_fraction: 0.01     # more bad records than this share of a dataset fails the run
    max_record_bytes: 16777216 # a longer record is a bad record (too_long)
    workers: null        # most shard tasks at once (null: the CPUs / cpus_per_task)
    backend: auto        # auto | processes | ray: where the tasks run (auto: Ray with $RAY_ADDRESS, else processes)
    cpus_per_task: 1     # CPUs (tokenizer threads) per shard task
    encoder: auto        # auto | gigatoken | tokenizers: what computes the token ids (the bytes are the same):
                         # auto uses gigatoken where it reproduces the ids of `tokenizers` exactly on a
                         # calibration sample (checked in every shard), else `tokenizers`, with one line saying
                         # why; gigatoken makes that check an error (exit 2)
    hf_cache_dir: null   # where hf:// datasets and hub tokenizers are downloaded (shared storage on clusters)
    verify: size         # how finished shards are checked before being reused: size | checksum
    progress_interval: 30  # seconds between progress lines
    object_store_mb: 256   # the embedded Ray's object store (backend: ray)

Output (under output_dir, or output_dir/sample-N):

    blend.json                      Megatron-Bridge per_split_data_args_path: {"train": [w, prefix, ...], ...}
    manifest.json                   inputs (fingerprints), tokenizer, config hash, per-shard counts, bad records
    plan.json                       the shard plan and the inputs' record counts (reused by later runs)
    <dataset>/shard_000000.bin/.idx Megatron MMIDIDX indexed dataset
    <dataset>/shard_000000.json     the shard's receipt

Exit codes: 0 done; 2 a config or input problem (one line on stderr, and nothing written when it is found
before any shard: missing inputs, an unreadable tokenizer, an empty corpus), a bad record under strict, or a
full disk (one line; the shards finished are kept, the files under temporary names removed); 75 stopped by
the time-limit signal (SIGUSR1; one line: the shards finished are kept for the next allocation, no blend.json;
recipes/dataprep/stop.py); 1 no workers (one line: Ray unreachable, a worker killed), no shard finished in an
allocation that the time-limit signal ended (one line), or anything else (with its traceback); 143 on SIGTERM.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass

from .dataprep import bad_records, blend, encoders, inputs, lock, progress, shards, stop
from .dataprep import tokenizer as tokenization
from .dataprep.cluster import Cluster, local_cpus
from .dataprep.errors import DataPrepError
from .dataprep.files import write_json
from .dataprep.settings import (Common, Dataset, cli, dataset_entries, fields, load_config, resolve_files, run_given,
                                take)

PROG = "ultra3 data prep pretrain"
MANIFEST_FORMAT = "ultra3-pretrain-data/1"
SCAN_LOCAL_BYTES = 256 << 20  # on a Ray cluster, inputs bigger than this are counted on it


@dataclass
class Settings(Common):
    eod_token: str | None
    valid_shards: int
    test_shards: int
    cpus_per_task: int
    encoder: str
    verify: str


def parse_settings(cfg: dict) -> Settings:
    if not isinstance(cfg, dict):
        raise DataPrepError("the config is not a mapping")
    datasets = [Dataset(*d) for d in dataset_entries(cfg, "text_field", take(cfg, "text_field", str),
                                                         "the corpora to tokenize ({name, path, weight, text_field})")]
    return Settings(**fields(cfg, Settings, datasets=datasets, **run_given(cfg)))


# ---- inputs and plan -----------------------------------------------------------------------------------

def read_plan_cache(out: str) -> dict:
    try:
        with open(os.path.join(out, "plan.json"), encoding="utf-8") as f:
            plan = json.load(f)
        return {(s["path"], s["text_field"]): s for s in plan.get("sources", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def scan_sources(settings: Settings, files: dict, cache: dict, cluster: Cluster) -> dict:
    """{dataset name: [source entries]}: fingerprints and record counts of the inputs (see inputs.scan)."""
    result: dict = {}
    if settings.sample:  # only as far into the inputs as the sample reaches
        for d in settings.datasets:
            result[d.name], need = [], settings.sample
            for path, fmt in files[d.name][0]:
                if need == 0:
                    break
                entry = inputs.scan(path, fmt, d.field, cache.get((inputs.shown(path), d.field)), need)
                result[d.name].append(entry)
                need -= entry["records"]
        return result
    jobs = [(d.name, path, fmt, d.field) for d in settings.datasets for path, fmt in files[d.name][0]]
    size = sum(os.path.getsize(path) for _, path, _, _ in jobs)
    args = [(path, fmt, field, cache.get((inputs.shown(path), field))) for _, path, fmt, field in jobs]
    if not cluster.address or size <= SCAN_LOCAL_BYTES or len(jobs) == 1:  # one machine: no more CPUs
        entries = []
        for a in args:
            if stop.requested():  # the time-limit signal: counting a large corpus may take a while
                raise stop.TimeLimit
            entries.append(inputs.scan(*a))
    else:
        cluster.start()
        entries = cluster.run_ordered(inputs.scan, args, cluster.cpus, settings.progress_interval, "count inputs",
                                      lambda rs: f"{sum(r['records'] for r in rs if r):,} records")
    for (name, *_), entry in zip(jobs, entries):
        result.setdefault(name, []).append(entry)
    return result


def make_plan(settings: Settings, sources: dict, tok: tokenization.TokenizerInfo) -> dict:
    """{dataset name: [ShardTask]}; a DataPrepError for a dataset without a single record."""
    tasks = {}
    for d in settings.datasets:
        srcs = sources.get(d.name) or []
        if sum(s["records"] for s in srcs) == 0:
            files = ", ".join(s["path"] for s in srcs[:3]) or d.path
            raise DataPrepError(f"empty corpus: dataset {d.name} has no records ({files})")
        tasks[d.name] = shards.plan_dataset(d.name, os.path.join(settings.out, d.name), d.field, srcs,
                                            settings.num_shards, tok.sha256, tok.eod_id, tok.dtype,
                                            settings.max_record_bytes)
        n, held_out = len(tasks[d.name]), settings.valid_shards + settings.test_shards
        if n >= 3 and held_out >= n:
            raise DataPrepError(f"dataset {d.name} has {n} shards: valid_shards + test_shards ({held_out}) must "
                                "leave at least one for train (raise num_shards or lower them)")
    return tasks


def config_hash(settings: Settings, tok: tokenization.TokenizerInfo) -> str:
    return hashlib.sha256(json.dumps({
        "format": shards.FORMAT,
        "datasets": [vars(d) for d in settings.datasets],
        "tokenizer_sha256": tok.sha256, "eod_id": tok.eod_id, "dtype": tok.dtype,
        "num_shards": settings.num_shards, "valid_shards": settings.valid_shards,
        "test_shards": settings.test_shards, "sample": settings.sample,
    }, sort_keys=True).encode()).hexdigest()


# ---- running the shards --------------------------------------------------------------------------------

def shard_workers(settings: Settings, cpus: int) -> int:
    """Shard tasks at once: `workers`, or as many as the CPUs hold at `cpus_per_task` each."""
    return settings.workers or max(1, cpus // settings.cpus_per_task)


def run_shards(settings: Settings, todo: list, tok: tokenization.TokenizerInfo, tok_json: str,
               cluster: Cluster, total_records: int, encoder: str) -> dict:
    cluster.start()
    workers = shard_workers(settings, cluster.cpus)
    print(f"{cluster.where()}: {cluster.cpus} CPUs; {len(todo)} shard(s) to write, {workers} at a time", flush=True)
    queue = sorted(todo, key=lambda t: -t.est_bytes)  # largest first (stable: plan order among equals)
    tok_ref = cluster.put(tok_json)
    current = {"encoder": encoder}  # after a fallback, the shards still queued use tokenizers too
    publish_here = cluster.backend != "processes"  # else this driver publishes the shards: no worker waits on the disk
    args = ((task, tok_ref, tok.sha256, tok.eod_id, tok.dtype, settings.strict, settings.cpus_per_task,
             current["encoder"], settings.encoder == "gigatoken", publish_here) for task in queue)
    receipts: dict = {}
    counts: dict = {}  # shard key -> (records, docs, tokens, input bytes) so far
    clock = progress.Clock(settings.progress_interval)
    # a generator per shard (shards.shard_steps): its progress, then its receipt
    with shards.Publisher() as publisher:
        for event in cluster.stream(shards.shard_steps, args, workers, settings.cpus_per_task, name="write_shard"):
            if event is not None:
                i, step, last = event
                task = queue[i]
                if isinstance(step, DataPrepError):
                    raise step
                if not last:
                    counts[task.key] = step
                    continue
                receipts[task.key] = step
                counts[task.key] = (task.records, step["docs"], step["tokens"], step["_input_bytes"])
                publisher.put(task, step)
                why = step.get("_encoder_fallback")
                if why and current["encoder"] != "tokenizers":
                    current["encoder"] = "tokenizers"
                    print(f"encoder: tokenizers from here on (gigatoken dropped at {task.key}: {why})", flush=True)
            if clock.due() or len(receipts) == len(todo):  # and once at the end
                records, docs, tokens, nbytes = (sum(c[i] for c in counts.values()) for i in range(4))
                print(progress.line(records, total_records, docs, tokens, nbytes, len(receipts), len(todo),
                                    clock.elapsed), flush=True)
    steady = progress.Steady()
    for key, receipt in receipts.items():
        steady.done(receipt["tokens"], receipt["_started"], publisher.published[key])
    print(steady.line(), flush=True)
    return receipts


# ---- outputs -------------------------------------------------------------------------------------------

def write_outputs(settings: Settings, tok: tokenization.TokenizerInfo, files: dict, sources: dict, plan: dict,
                  receipts: dict) -> dict:
    out = settings.out
    datasets, totals_bad = [], bad_records.BadRecords()
    for d in settings.datasets:
        tasks = plan[d.name]
        splits = blend.assign_splits(d.name, len(tasks), settings.valid_shards, settings.test_shards)
        bad = bad_records.BadRecords()
        rows = []
        for task, split in zip(tasks, splits):
            r = receipts[task.key]
            bad.merge(r["bad"]["counts"], r["bad"]["examples"])
            rows.append({"index": task.index, "prefix": os.path.relpath(task.prefix, out), "split": split,
                         "records": r["records"], "docs": r["docs"], "tokens": r["tokens"],
                         "bin_bytes": r["bin"]["bytes"], "bin_sha256": r["bin"]["sha256"],
                         "idx_sha256": r["idx"]["sha256"], "bad": r["bad"]["counts"]})
        totals_bad.merge(bad.counts, bad.examples)
        tokens = sum(r["tokens"] for r in rows)
        bad_records.check_yield(f"dataset {d.name}", sum(r["records"] for r in rows),
                                sum(r["docs"] for r in rows) if tokens else 0, bad, settings.max_bad_fraction)
        datasets.append({
            "name": d.name, "path": d.path, "weight": d.weight, "text_field": d.field,
            **({"split": d.split, "subset": d.subset, "hub": files[d.name][1]} if files[d.name][1] else {}),
            "inputs": [{"path": inputs.shown(s["path"]), "format": s["format"], **s["fingerprint"],
                        "records": s["records"]}
                       for s in sources[d.name]],
            "records": sum(r["records"] for r in rows), "docs": sum(r["docs"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows), "bad_records": bad.total, "bad": bad.to_json(),
            "shards": rows,
        })
    blend_obj = blend.build([{"weight": d["weight"], "shards": [{**r, "prefix": os.path.join(out, r["prefix"])}
                                                                for r in d["shards"]]} for d in datasets])
    manifest = {
        "format": MANIFEST_FORMAT,
        "config_hash": config_hash(settings, tok),
        "sample": settings.sample,
        "tokenizer": tok.describe(),
        "num_shards": settings.num_shards, "valid_shards": settings.valid_shards, "test_shards": settings.test_shards,
        "blend": "blend.json",
        "splits": {split: {"shards": len(blend_obj[split]) // 2,
                           "tokens": sum(s["tokens"] for ds in datasets for s in ds["shards"]
                                         if s["split"] == split and s["tokens"] > 0)} for split in blend.SPLITS},
        "totals": {"records": sum(d["records"] for d in datasets), "docs": sum(d["docs"] for d in datasets),
                   "tokens": sum(d["tokens"] for d in datasets), "bad_records": totals_bad.total,
                   "bad": totals_bad.to_json()["counts"]},
        "datasets": datasets,
    }
    write_json(os.path.join(out, "blend.json"), blend_obj)
    write_json(os.path.join(out, "manifest.json"), manifest)
    return manifest


def summary(manifest: dict, written: int, reused: int, seconds: float, tokens_written: int) -> str:
    rows = []
    for d in manifest["datasets"]:
        n = {s: sum(1 for r in d["shards"] if r["split"] == s) for s in blend.SPLITS}
        rows.append([d["name"], len(d["inputs"]), f"{len(d['shards'])} ({n['train']}/{n['valid']}/{n['test']})",
                     d["records"], d["docs"], d["tokens"], d["bad_records"]])
    t = manifest["totals"]
    rows.append(["total", sum(len(d["inputs"]) for d in manifest["datasets"]),
                 str(sum(len(d["shards"]) for d in manifest["datasets"])), t["records"], t["docs"], t["tokens"],
                 t["bad_records"]])
    text = [progress.table(rows, ["dataset", "files", "shards (train/valid/test)", "records", "docs", "tokens",
                                  "bad records"])]
    for d in manifest["datasets"]:
        for kind, places in d["bad"]["examples"].items():
            text.append(f"bad records, {d['name']}, {kind}: {d['bad']['counts'][kind]:,}; first at "
                        + "; ".join(places))
    rate = tokens_written / seconds if seconds > 0 else 0
    text.append(f"wall time {progress.duration(seconds)} ({seconds:.1f} s); shards written {written}, reused {reused}; "
                f"{tokens_written:,} tokens written, {progress.si(rate)} tokens/s")
    return "\n".join(text)


def run(config_path: str) -> int:
    started = time.time()
    phases = progress.Phases()
    settings = parse_settings(load_config(config_path))
    files = resolve_files(settings)
    out = settings.out
    cache = {} if settings.force else read_plan_cache(out)
    with Cluster(settings.backend, settings.object_store_mb) as cluster:
        if not cache and cluster.backend == "processes":  # shards to write: the workers' imports start now
            cluster.start(*shards.PRELOAD, processes=shard_workers(settings, local_cpus()))
        tok, tok_json = tokenization.load(settings.tokenizer, settings.eod_token, settings.hf_cache_dir)
        phases.mark("config, tokenizer")
        warm = (shards.warm, (tok_json, tok.sha256, settings.encoder, settings.cpus_per_task), settings.workers,
                settings.cpus_per_task)
        # `cluster` again: stopped inside the lock, so that no worker outlives it
        with lock.holding(out, settings.job), cluster:
            cache = {} if settings.force else read_plan_cache(out)

            def inputs_and_plan() -> tuple[dict, dict, float]:
                begun = time.time()
                sources = scan_sources(settings, files, cache, cluster)
                return sources, make_plan(settings, sources, tok), time.time() - begun

            if cache:  # an earlier run's plan: often nothing left to do, and then no worker is started at all
                sources, plan, _ = inputs_and_plan()
                phase = "inputs and plan"
            else:  # shards to write: the workers start (and check the encoder) while the inputs are counted
                sources, plan, seconds = cluster.start_while(inputs_and_plan, *warm)
                phase = f"workers' start (inputs and plan alongside: {seconds:.1f} s)"
            tasks = [t for name in plan for t in plan[name]]
            found = {t.key: None if settings.force else shards.read_receipt(t, settings.verify) for t in tasks}
            receipts = {key: r for key, r in found.items() if r is not None}
            todo = [t for t in tasks if found[t.key] is None]
            encoder = why_not = None
            if todo:  # the workers' encoder check, before anything is written
                if not cluster.warming:
                    cluster.start_while(lambda: None, *warm)
                    phase += ", workers' start"
                encoder, why_not = cluster.warmed()
                if not encoder:
                    raise encoders.EncoderError(why_not)
            # nothing has been written up to here; from here on, only under `out`
            write_plan(out, settings, sources, plan, tasks)
            print(f"{PROG}: {len(settings.datasets)} dataset(s), {len(tasks)} shard(s) ({len(todo)} to write, "
                  f"{len(receipts)} done); tokenizer {tok.source} (vocab {tok.vocab_size:,}, EOD {tok.eod_token!r}="
                  f"{tok.eod_id}, {tok.dtype}); encoder {encoder or 'not needed'}; output {out}", flush=True)
            if why_not:
                print(f"encoder: tokenizers ({why_not})", flush=True)
            phases.mark(phase)
            tokens_written = 0
            if todo:
                for name in ("blend.json", "manifest.json"):  # stale until this run ends
                    if os.path.exists(os.path.join(out, name)):
                        os.unlink(os.path.join(out, name))
                for t in todo:
                    shards.invalidate(t)
                stop.working(stop.Work("shards", len(tasks), len(receipts),
                                       lambda: sum(shards.read_receipt(t) is not None for t in tasks),
                                       "give each allocation more time (run.time), or make the shards smaller (a "
                                       "larger num_shards)"))
                try:
                    written = run_shards(settings, todo, tok, tok_json, cluster, sum(t.records for t in todo), encoder)
                except stop.TimeLimit:
                    if not stop.all_done():
                        raise
                    written = {t.key: shards.read_receipt(t) for t in todo}
                tokens_written = sum(r["tokens"] for r in written.values())
                receipts.update(written)
                phases.mark("shards")
            if cluster.started:
                cluster.stop()
                phases.mark("workers' stop")
    manifest = write_outputs(settings, tok, files, sources, plan, receipts)
    phases.mark("outputs")
    print(summary(manifest, len(todo), len(tasks) - len(todo), time.time() - started, tokens_written), flush=True)
    print(phases.line(), flush=True)
    print(f"wrote {os.path.join(out, 'blend.json')} and manifest.json", flush=True)
    return 0


def write_plan(out: str, settings: Settings, sources: dict, plan: dict, tasks: list) -> None:
    """`plan.json` (the inputs' counts, read again by the next run), the datasets' directories, cleaned."""
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "plan.json"), {
        "format": shards.FORMAT,
        "sources": [{**s, "path": inputs.shown(s["path"])} for d in settings.datasets for s in sources[d.name]],
        "shards": [{"dataset": t.dataset, "index": t.index, "records": t.records, "plan_hash": t.plan_hash,
                    "pieces": [{"file": inputs.shown(p.file), "start": p.start, "end": p.end} for p in t.pieces]}
                   for t in tasks],
    })
    for name, ds_tasks in plan.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        shards.clean_dataset_dir(os.path.join(out, name), len(ds_tasks))


def main(argv: list[str] | None = None) -> int:
    return cli(PROG, __doc__.split("\n\n")[0], run, argv, stops=True)


if __name__ == "__main__":
    sys.exit(main())
