"""Runtime of `ultra3 data prep sft`: render SFT conversations through a chat template, mask everything but
the assistant turns, pack them best-fit into fixed-size sequences and write Megatron-Bridge packed Parquet.

    python -m recipes.data_prep_sft --config config.yaml

Started by recipes.launch inside the job (after the preflight) with the resolved config; it runs just as
well by hand. Needs the `data` extra (ray, tokenizers, pyarrow, numpy, zstandard, huggingface_hub, jinja2)
and PyYAML; never the launcher.

Config keys, each required (a missing one is an input error): the launcher's compiled config has them all, with
the defaults shown here from configs/_shared/data_prep.yaml and configs/data_prep/sft/default.yaml, and their
ranges checked; others, such as `run` and `job`, are ignored:

    datasets:                # required, a list of
      - name: chat           #   required, unique, [A-Za-z0-9._-]
        path: /data/chat/*.jsonl.gz   # JSONL (plain/.gz/.zst) or Parquet file, directory, glob, or hf://org/name[/glob]
        messages_field: messages      # default "messages": the list of {role, content} (system/user/assistant/tool)
        weight: 1.0          #   default 1.0: times each train conversation is used (fractions sampled by content)
        split: train         #   hf:// only: the split to read
        subset: null         #   hf:// only: the dataset config
        revision: null       #   hf:// only: branch, tag or commit
    tokenizer: org/name      # required: tokenizer.json, a directory holding one, or a hub model id[@revision]
    chat_template: nemotron3 # a shipped template (recipes/dataprep/templates/NAME.jinja) or a .jinja path
    output_dir: /out         # required
    pack_size: 294912        # tokens per pack (the training sequence length)
    pad_seq_to_mult: 16      # pad every sequence's runtime length to a multiple (lcm(2*CP, CP*TP with SP))
    truncate: true           # cut conversations longer than a pack (true) or drop them (false); both counted
    valid_ratio: 0.01        # share of each dataset's conversations held out for validation
    test_ratio: 0.01         # ... and for test
    num_shards: 128          # train shards (at most one per pack); valid/test shards hold as many packs each
    sample: null             # N: the first N records of each dataset, into output_dir/sample-N
    force: false             # redo even if output_dir already holds this very output
    strict: false            # a bad record stops the run (exit 2)
    max_bad_fraction: 0.01   # more bad records than this share of a dataset fails the run
    max_record_bytes: 16777216   # a longer record is a bad record (too_long)
    workers: null            # tasks at a time (null: the CPUs)
    backend: auto            # auto | processes | ray: where the tasks run (auto: Ray with $RAY_ADDRESS)
    seed: 1234               # the shuffle of packs (nothing else is random)
    row_group_size: null     # packs per Parquet row group (null: ~64 MiB of tokens, at most 1000)
    hf_cache_dir: null       # where hf:// datasets and hub tokenizers are downloaded
    progress_interval: 30    # seconds between progress lines
    object_store_mb: 256     # the embedded Ray's object store (backend: ray)

Output (output_dir, or output_dir/sample-N):

    train/shard_000000.parquet ...  one row per pack: input_ids list<int32>, loss_mask list<int8>,
    valid/shard_000000.parquet ...  seq_start_id list<int32> (GPTSFTPackedParquetDataset; see
    test/shard_000000.parquet  ...  recipes/dataprep/packed_parquet.py for the exact contract)
    metadata.json                   counts, packing efficiency and factor, inputs, tokenizer, template, shards
    packing_metadata.json           Megatron-Bridge's packed_metadata_path list ([train, valid])

Exit codes: 0 done (or already up to date); 2 a config or input problem (one line on stderr; nothing is
written: missing inputs, an unreadable tokenizer or template, an empty corpus, an output_dir holding
something else), a bad record under strict, or a full disk (one line); 75 stopped by the time-limit signal
(SIGUSR1; one line: the partitions tokenized and the shards written are kept, in output_dir/.staging-<fingerprint>,
for the next allocation: recipes/dataprep/stop.py); 1 the workers could not be started or reached (one line), no
task finished in an allocation that the time-limit signal ended (one line), or anything else (with its
traceback); 143 on SIGTERM (what is finished is kept in the staging dir too).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from .dataprep import bad_records, chat, conversations, inputs, lock, stop
from .dataprep import packed_parquet as pp
from .dataprep import sft_output as out_
from .dataprep import tokenizer as tokenization
from .dataprep.cluster import Cluster
from .dataprep.errors import DataPrepError
from .dataprep.files import write_json
from .dataprep.sft_metadata import Packed, bridge_metadata, build_metadata
from .dataprep.sft_outdir import FORMAT, STAGING, prepare_output, publish
from .dataprep.sft_report import split_stats, summary
from .dataprep.sft_settings import PROG, Settings, parse_settings
from .dataprep.settings import cli, load_config, resolve_files

PART_RECORDS = (256, 20000)  # records per tokenize task: at least, at most
PART_BYTES = 128 << 20  # input bytes per tokenize task, at most (JSONL files: see JSONL_SPLITS)
JSONL_SPLITS = 8  # a JSONL file is read by at most this many tasks (each decompresses the file up to its start)


# ---- inputs and plan -----------------------------------------------------------------------------------

def scan_sources(settings: Settings, files: dict) -> dict:
    """{dataset name: [{path, format, fingerprint, records}]}, counting only as far as a sample reaches."""
    result: dict = {}
    for d in settings.datasets:
        result[d.name], need = [], settings.sample
        for path, fmt in files[d.name][0]:
            if need == 0:
                break
            entry = inputs.scan(path, fmt, d.field, None, need)
            result[d.name].append(entry)
            need = None if need is None else need - entry["records"]
        if not sum(s["records"] for s in result[d.name]):
            raise DataPrepError(f"empty corpus: dataset {d.name} has no records ({d.path})")
    return result


def plan_partitions(settings: Settings, sources: dict, workers: int) -> list:
    """Contiguous record ranges of each dataset, in input order. The output does not depend on them (only
    on the global order of the records), so their size may follow the worker count."""
    total = sum(s["records"] for srcs in sources.values() for s in srcs)
    size = min(max(-(-total // (4 * workers)), PART_RECORDS[0]), PART_RECORDS[1])
    parts: list = []
    for d in settings.datasets:
        for s in sources[d.name]:
            n = s["records"]
            k = max(1, -(-n // size), -(-s["fingerprint"]["bytes"] // PART_BYTES))
            if s["format"] != inputs.PARQUET:
                k = min(k, JSONL_SPLITS)
            k = min(k, n)
            for i in range(k):
                lo, hi = i * n // k, (i + 1) * n // k
                if hi > lo:
                    part = conversations.Partition(len(parts), d.name, d.field, settings.max_record_bytes,
                                                   records=hi - lo)
                    part.pieces.append(conversations.Piece(s["path"], s["format"], lo, hi))
                    parts.append(part)
    return parts


def fingerprint(settings: Settings, sources: dict, tok: tokenization.TokenizerInfo, template_sha: str) -> str:
    keep = ("datasets", "tokenizer", "chat_template", "output_dir", "force", "strict", "workers", "hf_cache_dir",
            "progress_interval", "job", "max_bad_fraction")  # how the run goes, not what it writes
    return hashlib.sha256(json.dumps({
        "format": FORMAT,
        "datasets": [{**asdict(d), "inputs": [{**s["fingerprint"], "records": s["records"]}
                                              for s in sources[d.name]]} for d in settings.datasets],
        "tokenizer_sha256": tok.sha256, "pad_id": tok.eod_id, "template_sha256": template_sha,
        **{k: v for k, v in asdict(settings).items() if k not in keep},
    }, sort_keys=True).encode()).hexdigest()


# ---- the run -------------------------------------------------------------------------------------------

@dataclass
class Template:
    """The chat template: compiled, its file, its text and the text's SHA-256."""

    compiled: chat.ChatTemplate
    file: str
    text: str
    sha256: str


def load_template(spec: str) -> Template:
    """The chat template `spec` names: a shipped one, or a .jinja file (relative to the working directory)."""
    try:
        path = chat.template_path(spec, os.getcwd())
        compiled = chat.ChatTemplate.load(path)
    except chat.TemplateError as e:
        raise DataPrepError(str(e)) from None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Template(compiled, path, text, hashlib.sha256(text.encode()).hexdigest())


def gather(settings: Settings, parts: list, results: list):
    """The corpus (good conversations in input order), per-dataset counts and the bad records."""
    index = {d.name: i for i, d in enumerate(settings.datasets)}
    cols: dict = {k: [] for k in ("dataset", "part", "offset", "length", "first_loss", "loss_tokens", "key")}
    bad_total = bad_records.BadRecords()
    per_dataset = {d.name: {"records": 0, "conversations": 0, "bad": bad_records.BadRecords()}
                   for d in settings.datasets}
    for part, r in zip(parts, results):
        n = len(r["lengths"])
        cols["dataset"].append(np.full(n, index[part.dataset], dtype=np.int64))
        cols["part"].append(np.full(n, part.index, dtype=np.int64))
        cols["offset"].append(np.concatenate(([0], np.cumsum(r["lengths"])[:-1])).astype(np.int64) if n else
                              np.zeros(0, np.int64))
        cols["length"].append(r["lengths"])
        cols["first_loss"].append(r["first_loss"])
        cols["loss_tokens"].append(r["loss_tokens"])
        cols["key"].append(r["keys"])
        stats = per_dataset[part.dataset]
        stats["records"] += part.records
        stats["conversations"] += n
        stats["bad"].merge(r["bad"]["counts"], r["bad"]["examples"])
        bad_total.merge(r["bad"]["counts"], r["bad"]["examples"])
    corpus = out_.Corpus(**{k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in cols.items()})
    corpus.key = corpus.key.astype(np.uint64)
    return corpus, per_dataset, bad_total


def make_staging(out: str, fp: str, force: bool) -> str:
    """The staging directory of this run's inputs and settings in `out`, with its parts/ folder: kept from an
    earlier run of them stopped short (the time-limit signal) unless `force`; others' staging goes."""
    staging = os.path.join(out, f"{STAGING}{fp[:16]}")
    for name in os.listdir(out):
        if name.startswith(STAGING) and (force or os.path.join(out, name) != staging):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    os.makedirs(os.path.join(staging, "parts"), exist_ok=True)
    return staging


def partitions(settings: Settings, sources: dict, workers: int, staging: str) -> list:
    """The partitions (plan_partitions), the same in every run of this staging dir: its partitions.json."""
    path = os.path.join(staging, "partitions.json")
    try:
        with open(path, encoding="utf-8") as f:
            return [conversations.Partition(**{**p, "pieces": [conversations.Piece(**c) for c in p["pieces"]]})
                    for p in json.load(f)]
    except (OSError, ValueError, KeyError, TypeError):
        parts = plan_partitions(settings, sources, workers)
        write_json(path, [asdict(p) for p in parts])
        return parts


def tokenize(settings: Settings, cluster: Cluster, workers: int, parts: list, staging: str, tok_json: str,
             template: Template) -> list:
    """Render, tokenize and mask each partition into its part files in staging/parts (those an earlier run
    finished kept): their results, in order."""
    folder = os.path.join(staging, "parts")
    results = [conversations.kept(p, folder) for p in parts]
    todo = [p for p, r in zip(parts, results) if r is None]
    stop.working(stop.Work("partitions", len(parts), len(parts) - len(todo),
                           lambda: sum(conversations.kept(p, folder, arrays=False) is not None for p in parts),
                           "give each allocation more time (run.time)", ", then the packed shards"))
    if len(todo) < len(parts):
        print(f"tokenize: {len(parts) - len(todo)} of {len(parts)} partition(s) kept from an earlier run", flush=True)
    tok_ref, tpl_ref = cluster.put(tok_json), cluster.put(template.text)
    done = iter(cluster.run_ordered(
        conversations.tokenize_partition,
        [(p, folder, tok_ref, tpl_ref, template.compiled.name, settings.strict) for p in todo],
        workers, settings.progress_interval, "tokenize",
        lambda rs: f"{sum(len(r['lengths']) for r in rs if r):,} conversations, "
                   f"{sum(int(r['lengths'].sum()) for r in rs if r):,} tokens"))
    return [r if r is not None else next(done) for r in results]


def shard_tasks(plan: out_.SplitPlan, corpus: out_.Corpus, folder: str, receipts: str, part_paths: dict,
                pad_id: int, row_group: int) -> list:
    """The write_shard arguments of each shard of a split's plan, into `folder` (made here; none if no pack), their
    receipts in `receipts`."""
    if not plan.packs:
        return []
    os.makedirs(folder, exist_ok=True)
    tasks = []
    for k in range(plan.shards):
        r0, r1 = plan.shard_rows[k], plan.shard_rows[k + 1]
        s0, s1 = plan.row_offsets[r0], plan.row_offsets[r1]
        seq = plan.seq[s0:s1]
        name = out_.SHARD_NAME.format(k)
        tasks.append((os.path.join(folder, name), corpus.part[seq], corpus.offset[seq],
                      plan.stored[s0:s1], plan.padded[s0:s1], plan.row_offsets[r0:r1 + 1] - s0, part_paths, pad_id,
                      row_group, os.path.join(receipts, f"{plan.name}-{name}.json")))
    return tasks


def write_splits(settings: Settings, cluster: Cluster, workers: int, packed: Packed, part_paths: dict,
                 pad_id: int) -> tuple[dict, float]:
    """Pack each split (valid and test shards as long as train's), then write the shards of all three into
    staging (those an earlier run wrote kept): each split's statistics and the seconds spent packing."""
    plans, rows_per_shard, seconds = [], None, 0.0
    for s, name in enumerate(out_.SPLITS):
        idx = np.flatnonzero(packed.split == s)
        members = np.repeat(idx, packed.copies[idx])
        t0 = time.time()
        plan = out_.plan_split(name, members, packed.lim.stored, settings.pack_size, settings.pad_seq_to_mult,
                               settings.seed, settings.num_shards if s == 0 else None, rows_per_shard if s else None)
        seconds += time.time() - t0
        if s == 0 and plan.packs:
            rows_per_shard = -(-plan.packs // plan.shards)
        plans.append(plan)
    receipts = os.path.join(packed.staging, "written")
    os.makedirs(receipts, exist_ok=True)
    tasks = [shard_tasks(plan, packed.corpus, os.path.join(packed.staging, plan.name), receipts, part_paths, pad_id,
                         packed.row_group) for plan in plans]
    every = [t for split in tasks for t in split]
    rows = [out_.kept_shard(t[0], t[-1]) for t in every]
    todo = [t for t, r in zip(every, rows) if r is None]
    stop.working(stop.Work("shards", len(every), len(every) - len(todo),
                           lambda: sum(out_.kept_shard(t[0], t[-1]) is not None for t in every),
                           "give each allocation more time (run.time), or make the shards smaller (a larger "
                           "num_shards)"))
    if len(todo) < len(every):
        print(f"write: {len(every) - len(todo)} of {len(every)} shard(s) kept from an earlier run", flush=True)
    try:
        done = cluster.run_ordered(out_.write_shard, todo, workers, settings.progress_interval, "write",
                                   lambda rs: f"{sum(r['rows'] for r in rs if r):,} packs") if todo else []
    except stop.TimeLimit:
        if not stop.all_done():
            raise
        done = [out_.kept_shard(t[0], t[-1]) for t in todo]
    done = iter(done)
    rows = [r if r is not None else next(done) for r in rows]
    stats, first = {}, 0
    for plan, split in zip(plans, tasks):
        stats[plan.name] = split_stats(plan, packed.corpus, settings.pack_size, rows[first:first + len(split)])
        first += len(split)
    return stats, seconds


def pack(settings: Settings, cluster: Cluster, sources: dict, tok: tokenization.TokenizerInfo, tok_json: str,
         template: Template, staging: str) -> Packed:
    """Tokenize the inputs, split, weigh and limit the conversations, and pack and write the splits, all into
    the staging directory, which goes again if an input problem stops the run (else the next run goes on from
    what it holds)."""
    cluster.start(conversations.__name__)
    workers = settings.workers or cluster.cpus
    parts = partitions(settings, sources, workers, staging)
    records = sum(p.records for p in parts)
    print(f"{PROG}: {len(settings.datasets)} dataset(s), {records:,} records in {len(parts)} partition(s); "
          f"{cluster.where()}, {cluster.cpus} CPUs, {workers} task(s) at a time; tokenizer {tok.source} "
          f"(vocab {tok.vocab_size:,}, pad {tok.eod_token!r}={tok.eod_id}); template {template.compiled.name}; "
          f"pack {settings.pack_size:,}, pad_seq_to_mult {settings.pad_seq_to_mult}; output {settings.out}",
          flush=True)
    try:
        results = tokenize(settings, cluster, workers, parts, staging, tok_json, template)
        corpus, per_dataset, bad = gather(settings, parts, results)
        if not len(corpus):
            raise DataPrepError(f"empty corpus: none of the {records:,} records is a usable conversation "
                                f"({bad.total:,} bad: {', '.join(f'{k} {v}' for k, v in bad.counts.items())})")
        split = out_.assign_splits(corpus, len(settings.datasets), settings.valid_ratio, settings.test_ratio)
        copies = out_.repeats(corpus, split, [d.weight for d in settings.datasets])
        lim = out_.limit(corpus, settings.pack_size, settings.pad_seq_to_mult, settings.truncate)
        packed = Packed(staging, records, corpus, per_dataset, bad, split, np.where(lim.keep, copies, 0), lim,
                        settings.row_group_size or pp.default_row_group_size(settings.pack_size))
        packed.stats, packed.pack_seconds = write_splits(settings, cluster, workers, packed,
                                                         {r["index"]: r["paths"] for r in results}, tok.eod_id)
    except DataPrepError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return packed


# ---- metadata ------------------------------------------------------------------------------------------

def run(config_path: str) -> int:
    """Settings, tokenizer, template and inputs first (an up-to-date output ends here); then the packing,
    under output_dir's lock; then metadata.json and the publishing of the splits."""
    started = time.time()
    settings = parse_settings(load_config(config_path))
    tok, tok_json = tokenization.load(settings.tokenizer, None, settings.hf_cache_dir)
    template = load_template(settings.chat_template)
    files = resolve_files(settings)
    sources = scan_sources(settings, files)
    fp = fingerprint(settings, sources, tok, template.sha256)
    out = settings.out
    # a forced run stopped short (the time-limit signal) goes on in the next allocation, not forced again
    if not prepare_output(settings, fp) and not os.path.isdir(os.path.join(out, f"{STAGING}{fp[:16]}")):
        print(f"{PROG}: {out} is up to date (same inputs and settings); force=true redoes it", flush=True)
        return 0
    markup = _markup_warning(tok_json)
    if markup:
        print(f"{PROG}: warning: {markup}", flush=True)
    with lock.holding(out, settings.job), Cluster(settings.backend, settings.object_store_mb) as cluster:
        staging = make_staging(out, fp, settings.force)
        packed = pack(settings, cluster, sources, tok, tok_json, template, staging)
        cluster.stop()
    try:  # a dataset with too many bad records stops here: its packs go with the staging dir
        metadata = build_metadata(settings, fp, files, sources, tok, template.file, template.sha256, packed)
        publish(settings, packed.staging, metadata, bridge_metadata(settings, packed.stats))
    finally:
        shutil.rmtree(packed.staging, ignore_errors=True)
    print(summary(metadata, out, time.time() - started, packed.pack_seconds), flush=True)
    return 0


def _markup_warning(tok_json: str) -> str | None:
    """The chat markup should be single special tokens; a base tokenizer without them still works (the
    markup is tokenized as text) but is almost certainly the wrong tokenizer for SFT."""
    try:
        added = {t.get("content") for t in json.loads(tok_json).get("added_tokens") or []}
    except (ValueError, AttributeError):
        return None
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if t not in added]
    if missing:
        return (f"the tokenizer has no special token {' or '.join(missing)}: the chat markup is tokenized as plain "
                "text (fine for a smoke test, wrong for a real SFT run)")
    return None


def main(argv: list[str] | None = None) -> int:
    return cli(PROG, __doc__.split("\n\n")[0], run, argv, stops=True)


if __name__ == "__main__":
    sys.exit(main())
