"""Runtime of `ultra3 data prep rl`: the RL training blends of NeMo RL's Nemotron 3 Ultra recipe (NeMo Gym
JSONL, one file per step) checked row by row, their placeholder rows restored from DAPO-Math-17k and
Skywork-OR1 where those are given (dropped and counted where not), and split into train and validation.

    python -m recipes.data_prep_rl --config config.yaml

Started by recipes.launch inside the job (after the preflight) with the resolved config; it runs just as
well by hand. Needs the `data` extra (ray, pyarrow, zstandard, huggingface_hub) and PyYAML; never the launcher.

Config keys, each required (a missing one is an input error): the launcher's compiled config has them all, with
the defaults shown here from configs/_shared/data_prep.yaml and configs/data_prep/rl/default.yaml, and their
ranges checked; others, such as `run` and `job`, are ignored:

    source: hf://nvidia/Nemotron-RL-Ultra-Training-Blends   # required: hf://org/name, or a local directory
                             #   holding a <blend>.jsonl (.gz/.zst too) per blend, at any depth
    revision: null           # hf:// only: branch, tag or commit
    blends: [rlvr1, rlvr2, ifbench, rlhf, reasoning, swe, mopd]   # required: the files to prepare, by name
    val_rows: 100            # the last records of each blend held out as validation
    placeholders:            # the datasets placeholder rows come from; a source not given: its rows dropped
      dapo: {path: null, split: train, revision: null}     # hf://BytedTsinghua-SIA/DAPO-Math-17k or local
      skywork: {path: null, split: math, revision: null}   # hf://Skywork/Skywork-OR1-RL-Data or local
    output_dir: /out         # required
    sample: null             # N: the first N records of each blend, into output_dir/sample-N
    force: false             # redo even if output_dir already holds this very output
    strict: false            # a bad row stops the run (exit 2) instead of being counted and skipped
    max_bad_fraction: 0.01   # more bad records than this share of a blend fails the run
    max_record_bytes: 16777216   # a longer record is a bad record (too_long)
    workers: null            # tasks (one per blend) at a time (null: the CPUs)
    backend: auto            # auto | processes | ray: where the tasks run (auto: Ray with $RAY_ADDRESS)
    hf_cache_dir: null       # where hf:// datasets are downloaded
    progress_interval: 30    # seconds between progress lines
    object_store_mb: 256     # the embedded Ray's object store (backend: ray)

A local source (`split` is then the file itself) is a JSONL (plain/.gz/.zst) or Parquet file, a directory or
a glob. The rows and the placeholder format: recipes/dataprep/rl_records.py; the split and the writing:
recipes/dataprep/rl_blend.py.

Output (output_dir, or output_dir/sample-N):

    <blend>/train.jsonl      the blend's rows but its last val_rows records, one JSON object a line
    <blend>/val.jsonl        its last val_rows records (less the rows dropped)
    metadata.json            per blend: the source file and revision, rows in and out, placeholders found,
                             restored and dropped per source, bad rows, and the rows, bytes and SHA-256 of
                             both files; the placeholder sources and their revisions; the totals

Exit codes: 0 done (or already up to date); 2 a config or input problem (one line on stderr; nothing is
written: a missing blend or source, a blend no longer than val_rows, an output_dir holding something else),
or a bad row under strict (`FILE:LINE: what is wrong; the fix`), or a full disk (one line); 1 the workers could
not be started or reached (one line), no blend finished in an allocation that the time-limit signal ended (one
line), or anything else (with its traceback); 75 stopped by the time-limit signal (SIGUSR1; one line; the
blends finished are kept for the next allocation: recipes/dataprep/stop.py); 143 on SIGTERM (the blends finished
so far are kept, in output_dir/.staging-rl, for the next run to resume from).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time

from .dataprep import bad_records, hub, inputs, lock, stop
from .dataprep.cluster import Cluster
from .dataprep.errors import DataPrepError
from .dataprep.files import fsync_dir, write_json
from .dataprep.progress import table
from .dataprep.rl_blend import FORMAT, SPLITS, BlendTask, finished, prepare_blend
from .dataprep.rl_settings import PROG, SOURCES, Settings, parse_settings
from .dataprep.settings import cli, load_config
from .dataprep.sft_outdir import prepare_output

STAGING = ".staging-rl"  # where a run prepares its blends before they are moved in; a later run resumes it
JSONL_SUFFIXES = tuple(e for e in inputs.EXTENSIONS if e != ".parquet")


# ---- inputs --------------------------------------------------------------------------------------------

def _pick(blend: str, files: list, where: str) -> str:
    """The one file among `files` named like the blend (`<blend>.jsonl` and the like, in any directory)."""
    def stem(f: str) -> str:
        base = os.path.basename(f)
        return next((base[:-len(e)] for e in JSONL_SUFFIXES if base.lower().endswith(e)), base)

    chosen = [f for f in files if stem(f) == blend]
    if len(chosen) != 1:
        present = sorted({stem(f) for f in files if f.lower().endswith(JSONL_SUFFIXES)})
        what = "several files" if chosen else "no file"
        raise DataPrepError(f"{where} has {what} for blend {blend!r} ({', '.join(chosen) or blend + '.jsonl'}); "
                            f"its JSONL files: {', '.join(present) or 'none'}")
    return chosen[0]


def _blend_files(settings: Settings) -> tuple[dict, dict]:
    """{blend: local path} and where they come from ({path, revision, files: {blend: name in the source}})."""
    src = settings.source
    if src.startswith("hf://"):
        _, pattern = hub.parse_hf_path(src)
        if pattern:
            raise DataPrepError(f"source {src}: name the dataset repo alone (hf://org/name); blends are found by name")
        names: dict = {}

        def choose(files: list, fetch) -> list:
            names.update({b: _pick(b, files, src) for b in settings.blends})
            return [names[b] for b in settings.blends]

        paths, prov = hub.fetch_files(src, settings.revision, settings.hf_cache_dir, choose)
        return dict(zip(settings.blends, paths)), {"path": src, "revision": prov["revision"], "files": names}
    root = os.path.abspath(os.path.expanduser(src))
    if not os.path.isdir(root):
        raise DataPrepError(f"source {src} is not a directory (nor hf://org/name); give the directory holding "
                            f"{settings.blends[0]}.jsonl and the other blends")
    found = [os.path.relpath(p, root) for p in inputs.expand(root)]
    names = {b: _pick(b, found, src) for b in settings.blends}
    return {b: os.path.join(root, n) for b, n in names.items()}, {"path": root, "revision": None, "files": names}


def _source_files(settings: Settings, name: str) -> tuple[list, dict]:
    """The files of a placeholder source ([{path, format, fingerprint}]) and where they come from."""
    s = settings.placeholders[name]
    revision = None
    if s.path.startswith("hf://"):
        paths, got = hub.resolve_dataset(s.path, s.split, None, s.revision, settings.hf_cache_dir)
        revision = got["revision"]
    else:
        paths = inputs.expand(s.path)
        if not paths:
            raise DataPrepError(f"placeholders.{name}: {s.path} matches no file")
    files = [_describe(p) for p in paths]
    return files, {"path": s.path, "split": s.split, "revision": revision,
                   "files": [{"path": inputs.shown(f["path"]), "format": f["format"], **f["fingerprint"]}
                             for f in files]}


def _describe(path: str) -> dict:
    try:
        return {"path": path, "format": inputs.detect_format(path), "fingerprint": inputs.fingerprint(path)}
    except OSError as e:
        raise DataPrepError(f"{path} is not readable ({e.strerror})") from None


def resolve(settings: Settings) -> tuple[list, dict]:
    """The blend tasks and the provenance of every input."""
    prov: dict = {"placeholders": dict.fromkeys(SOURCES)}
    paths = {None: settings.source, **{n: s.path for n, s in settings.placeholders.items()}}  # None: the blends
    sources: dict = {}
    for name in sorted(paths, key=lambda n: paths[n].startswith("hf://")):  # local ones checked before downloads
        if name is None:
            blends, prov["source"] = _blend_files(settings)
        else:
            sources[name], prov["placeholders"][name] = _source_files(settings, name)
    staging = os.path.join(settings.out, STAGING)
    tasks = []
    for b in settings.blends:
        entry = _describe(blends[b])
        tasks.append(BlendTask(b, entry["path"], entry["format"], entry["fingerprint"], staging, settings.sample,
                               settings.val_rows, settings.strict, dict(sorted(sources.items())),
                               settings.max_record_bytes))
    return tasks, prov


def fingerprint(tasks: list) -> str:
    return hashlib.sha256(json.dumps([t.key for t in tasks]).encode()).hexdigest()


# ---- output --------------------------------------------------------------------------------------------

def publish(out: str, staging: str, blends: list, metadata: dict) -> None:
    """Move the blends from staging into place (and remove those an earlier output had that this one has
    not); metadata.json, the completion mark, goes last."""
    meta = os.path.join(out, "metadata.json")
    stale: set = set()
    if os.path.exists(meta):
        with open(meta, encoding="utf-8") as f:
            stale = set(json.load(f).get("blends") or ()) - set(blends)
        os.unlink(meta)
        fsync_dir(out)
    for name in sorted({*blends, *stale}):
        target = os.path.join(out, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        if name in blends:
            os.replace(os.path.join(staging, name), target)
    fsync_dir(out)
    write_json(meta, metadata)
    shutil.rmtree(staging)


def build_metadata(settings: Settings, fp: str, tasks: list, prov: dict, receipts: dict) -> dict:
    blends, totals = {}, dict.fromkeys(("rows_in", "rows_out", "train", "val", "placeholders", "restored",
                                        "dropped", "bad_rows"), 0)
    for t in tasks:
        r = receipts[t.name]
        ph = r["placeholders"]
        bad = r["bad"] if isinstance(r["bad"], dict) else {}
        bad_records.check_yield(f"blend {t.name}", r["rows_in"], sum(r[s]["rows"] for s in SPLITS),
                                bad_records.BadRecords(counts=dict(bad.get("counts") or {}),
                                                       examples=dict(bad.get("examples") or {})),
                                settings.max_bad_fraction)
        blends[t.name] = {
            "source": {"file": prov["source"]["files"][t.name], "revision": prov["source"]["revision"],
                       "format": t.fmt, **t.fingerprint},
            "rows_in": r["rows_in"], "rows_out": sum(r[s]["rows"] for s in SPLITS),
            **{s: r[s] for s in SPLITS}, "placeholders": ph, "bad_rows": r["bad_rows"], "bad": r["bad"],
        }
        for key, value in (("rows_in", r["rows_in"]), ("rows_out", blends[t.name]["rows_out"]),
                           ("train", r["train"]["rows"]), ("val", r["val"]["rows"]),
                           ("placeholders", sum(ph["found"].values())), ("restored", sum(ph["restored"].values())),
                           ("dropped", sum(ph["dropped"].values())), ("bad_rows", r["bad_rows"])):
            totals[key] += value
    return {
        "format": FORMAT,
        "fingerprint": fp,
        "nemo_rl": {"dataset": "NemoGymDataset", "processor": "nemo_gym_data_processor",
                    "train": "<blend>/train.jsonl (data.train.data_path)",
                    "validation": "<blend>/val.jsonl (data.validation.data_path)"},
        "source": {k: v for k, v in prov["source"].items() if k != "files"},
        "placeholder_sources": prov["placeholders"],
        "sample": settings.sample,
        "val_rows": settings.val_rows,
        "strict": settings.strict,
        "totals": totals,
        "blends": blends,
    }


def summary(metadata: dict, out: str, seconds: float) -> str:
    rows = [[name, b["rows_in"], b["train"]["rows"], b["val"]["rows"], sum(b["placeholders"]["restored"].values()),
             sum(b["placeholders"]["dropped"].values()), b["bad_rows"]] for name, b in metadata["blends"].items()]
    t = metadata["totals"]
    rows.append(["total", t["rows_in"], t["train"], t["val"], t["restored"], t["dropped"], t["bad_rows"]])
    lines = [table(rows, ["blend", "rows in", "train", "val", "restored", "dropped", "bad"])]
    if t["placeholders"]:
        dropped = {}
        for b in metadata["blends"].values():
            for source, n in b["placeholders"]["dropped"].items():
                dropped[source] = dropped.get(source, 0) + n
        line = f"placeholders: {t['placeholders']:,} found, {t['restored']:,} restored, {t['dropped']:,} dropped"
        if dropped:
            line += " (" + "; ".join(f"{s} {n:,}: set placeholders.{s}.path to restore them"
                                     for s, n in sorted(dropped.items())) + ")"
        lines.append(line)
    if t["bad_rows"]:
        first = next(e[0] for b in metadata["blends"].values() for e in b["bad"]["examples"].values() if e)
        lines.append(f"bad rows: {t['bad_rows']:,} skipped (the first: {first}); strict=true stops at the first")
    lines.append(f"{PROG}: {t['rows_out']:,} rows of {len(metadata['blends'])} blend(s) in {out} ({seconds:.1f} s)")
    return "\n".join(lines)


# ---- the run -------------------------------------------------------------------------------------------

def run(config_path: str) -> int:
    started = time.time()
    settings = parse_settings(load_config(config_path))
    tasks, prov = resolve(settings)
    fp = fingerprint(tasks)
    out = settings.out
    staging = os.path.join(out, STAGING)
    # a forced run stopped short (the time-limit signal) goes on in the next allocation, not forced again
    if not prepare_output(settings, fp, FORMAT, () if os.path.isdir(staging) else tuple(settings.blends), PROG) \
            and not os.path.isdir(staging):
        print(f"{PROG}: {out} is up to date (same inputs and settings); force=true redoes it", flush=True)
        return 0
    if settings.force:
        shutil.rmtree(staging, ignore_errors=True)
    receipts = {t.name: finished(t) for t in tasks}
    todo = [t for t in tasks if receipts[t.name] is None]
    given = ", ".join(f"{n} from {s.path}" for n, s in settings.placeholders.items()) or "none given"
    print(f"{PROG}: {len(tasks)} blend(s) from {prov['source']['path']}"
          f"{' @ ' + prov['source']['revision'] if prov['source']['revision'] else ''}: {len(todo)} to prepare, "
          f"{len(tasks) - len(todo)} kept from an interrupted run; placeholder sources: {given}; output {out}",
          flush=True)
    stop.working(stop.Work("blends", len(tasks), len(tasks) - len(todo),
                           lambda: sum(finished(t) is not None for t in tasks),
                           "give each allocation more time (run.time): a blend is one task"))
    with lock.holding(out, settings.job):  # one writer; the directories made for it go again if left empty
        prepare(settings, todo, receipts, staging)
        metadata = build_metadata(settings, fp, tasks, prov, receipts)
        publish(out, staging, settings.blends, metadata)
    print(summary(metadata, out, time.time() - started), flush=True)
    return 0


def prepare(settings: Settings, todo: list, receipts: dict, staging: str) -> None:
    """The blends left to do, into staging; an input problem leaves no staging behind."""
    os.makedirs(staging, exist_ok=True)
    try:
        if todo:
            with Cluster(settings.backend, settings.object_store_mb) as cluster:
                cluster.start(prepare_blend.__module__)
                workers = min(settings.workers or cluster.cpus, len(todo))
                print(f"{PROG}: {cluster.where()}, {cluster.cpus} CPUs, {workers} blend task(s) at a time",
                      flush=True)
                try:
                    done = cluster.run_ordered(prepare_blend, [(t,) for t in todo], workers,
                                               settings.progress_interval, "blends",
                                               lambda rs: f"{sum(r['rows_in'] for r in rs if r):,} rows")
                except stop.TimeLimit:
                    if not stop.all_done():
                        raise
                    done = [finished(t) for t in todo]
                receipts.update({t.name: r for t, r in zip(todo, done)})
    except DataPrepError:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    return cli(PROG, __doc__.split("\n\n")[0], run, argv, stops=True)


if __name__ == "__main__":
    sys.exit(main())
