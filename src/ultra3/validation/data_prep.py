"""Rules for the data-prep stages: a blend that can run (dataset names the runtime takes, a tokenizer it can
read), inputs that exist, an output directory it can write, packing that fits; for the RL blends (a config with
`blends`), a source and placeholder sources that exist and a validation split that leaves rows to train on.

Local paths are checked here when they should be visible from this machine: an error for a local run,
a warning for a Slurm submission (compute nodes may mount what the login node does not). A relative
path is relative to the job's working directory, which holds the shipped `recipes/` (and its samples)."""

from __future__ import annotations

import glob
import os
import pathlib
import re

from ultra3.contract import HUB_MODEL, NAME
from ultra3.dotted import get
from ultra3.findings import Report
from ultra3.paths import RECIPES_DIR
from ultra3.schema import DATA_PREP_PRETRAIN, DATA_PREP_RL, DATA_PREP_SFT, where_from

HF = "hf://"
# keys null may leave to the runtime's choice (all CPUs, the tokenizer's EOS, ...), and those checked with messages
# of their own: every other key of a data prep needs a value (_check_set)
NULLABLE = {"sample", "workers", "hf_cache_dir", "eod_token", "row_group_size", "revision"}
CHECKED = {"run", "datasets", "tokenizer", "output_dir", "source", "blends", "placeholders"}
TOKENIZER_FIX = "give a tokenizer.json, a directory holding one, or a hub model id org/name"


def validate_data_prep(cfg: dict, report: Report) -> None:
    if "blends" in cfg:  # the RL blends: files found by name, no tokenizer
        _check_rl(cfg, report)
    else:
        _check_datasets(cfg, report)
    out = get(cfg, "output_dir")
    if not out:
        report.error("output_dir", "no output_dir; set where the shards go (shared storage for a cluster)")
    elif isinstance(out, str) and not out.startswith(("/", "~", "@")):  # @: the job's own dirs, placed later
        report.error("output_dir", f"'{out}' is relative, but the job runs in its own code dir; give an absolute "
                                   f"path, e.g. output_dir={os.path.join(os.getcwd(), out)}")
    elif isinstance(out, str) and not out.startswith("@"):
        check_output_dir(cfg, out, report)
    _check_set(cfg, report)
    shards, held = get(cfg, "num_shards"), (get(cfg, "valid_shards") or 0) + (get(cfg, "test_shards") or 0)
    if isinstance(shards, int) and shards >= 3 and held >= shards:  # fewer than 3 shards: all train
        report.error("valid_shards", f"valid_shards + test_shards = {held} of num_shards {shards} leave no shard to "
                                     f"train on; hold out fewer (e.g. 1 and 1) or raise num_shards",
                     quoting=("test_shards", "num_shards"))
    _check_template(cfg, report)
    share, interval = get(cfg, "max_bad_fraction"), get(cfg, "progress_interval")
    if isinstance(share, (int, float)) and not 0 <= share <= 1:
        report.error("max_bad_fraction", f"{share} is a share of a dataset's records: use a number from 0 to 1")
    if isinstance(interval, (int, float)) and not interval > 0:
        report.error("progress_interval", f"{interval} seconds between progress lines: use a number > 0, e.g. 30")
    _check_packing(cfg, report)


def _check_set(cfg: dict, report: Report) -> None:
    """Every key of the stage's schema but those null may leave to the runtime has a value: the job takes each from
    its config as it stands (the stage's YAML holds the defaults; the runtime has none of its own)."""
    schema = {"pretrain": DATA_PREP_PRETRAIN, "sft": DATA_PREP_SFT, "rl": DATA_PREP_RL}.get(
        str(get(cfg, "job.stage") or "").rsplit(" ", 1)[-1], {})
    unset = sorted(k for k in schema.keys() - NULLABLE - CHECKED if get(cfg, k) is None)
    for key in [k for k in unset if where_from(k, report.origin)]:
        report.error(key, f"null{where_from(key, report.origin)}, but the job needs a value: give one")
    missing = [k for k in unset if not where_from(k, report.origin)]
    if missing:
        also = f" (nor {', '.join(missing[1:])})" if missing[1:] else ""
        report.error(missing[0], f"not set{also}, but the job needs a value of each: set them, or start the config "
                                 "with `defaults: [default]` (the stage's defaults)")


def _check_datasets(cfg: dict, report: Report) -> None:
    datasets = get(cfg, "datasets") or []
    if not datasets:
        report.error("datasets", "the blend is empty; list at least one dataset (name, path, weight)")
    names = [d.get("name") for d in datasets]
    for i, ds in enumerate(datasets):
        key = f"datasets[{i}]"
        if not ds.get("name"):
            report.error(f"{key}.name", "every dataset needs a name (it names its shards and its blend entry)")
        elif not NAME.match(str(ds["name"])):
            fixed = re.sub(r"[^A-Za-z0-9._-]+", "-", str(ds["name"])).strip("._-") or "web"
            report.error(f"{key}.name", f"{ds['name']!r}{where_from(key, report.origin)} names the dataset's output "
                                        "directory: use letters, digits, '.', '_' and '-', starting with a letter "
                                        f"or digit, e.g. name: {fixed}")
        elif names.count(ds["name"]) > 1:
            report.error(f"{key}.name", f"'{ds['name']}' is used by {names.count(ds['name'])} datasets; names "
                                        "must be unique")
        weight = ds.get("weight", 1.0)
        if weight is not None and weight <= 0:
            report.error(f"{key}.weight", f"{weight} is not positive; give a weight > 0 or remove the dataset")
        _check_path(cfg, ds.get("path"), f"{key}.path", report)
    tokenizer = get(cfg, "tokenizer")
    if not tokenizer:
        report.error("tokenizer", "no tokenizer; set a Hugging Face name or a local tokenizer.json or directory")
    elif problem := _tokenizer_problem(tokenizer):
        _missing(cfg, "tokenizer", problem, report, TOKENIZER_FIX)


def _tokenizer_problem(tokenizer: str) -> str | None:
    """What the runtime would refuse: a path here wins (a directory holding tokenizer.json, or the file), else a
    hub model id. A file is checked for the shape of a tokenizer.json (a JSON object with a `model`), not parsed
    whole: the runtime does that."""
    path = _local(tokenizer)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            return f"{tokenizer} is a directory without a tokenizer.json"
    elif not os.path.exists(path):
        hub = HUB_MODEL.match(tokenizer) and not tokenizer.startswith((".", "/", "~"))
        return None if hub else f"{tokenizer} does not exist and is not a hub model id org/name"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return f"{path} is not readable ({e.strerror})"
    if not data.lstrip().startswith(b"{") or b'"model"' not in data:
        return f"{path} is not a tokenizer.json (a JSON object with a `model`)"
    return None


def check_output_dir(cfg: dict, out: str, report: Report) -> None:
    """A directory the job can make, or write in, on this machine (where it writes: sample-N below it)."""
    path = os.path.expanduser(out)
    there = next(p for p in (path, *_parents(path)) if os.path.exists(p))
    if not os.path.isdir(there):
        problem = f"{there} is a file, not a directory"
    elif not os.access(there, os.W_OK | os.X_OK):
        problem = f"{there} is not writable"
    else:
        return
    _missing(cfg, "output_dir", problem, report, "choose a directory the job can write")


def _parents(path: str) -> list[str]:
    parents = []
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        parents.append(path)
    return parents


def _check_template(cfg: dict, report: Report) -> None:
    """chat_template: a shipped template's name, or a .jinja file."""
    template = get(cfg, "chat_template")
    if not isinstance(template, str):
        return
    shipped = RECIPES_DIR / "dataprep" / "templates"
    if "/" not in template and not template.endswith(".jinja"):
        if not (shipped / f"{template}.jinja").is_file():
            names = ", ".join(sorted(p.stem for p in shipped.glob("*.jinja")))
            report.error("chat_template", f"'{template}' is no shipped template ({names}); name one or give a .jinja "
                                          "path")
    elif not _exists(template):
        _missing(cfg, "chat_template", f"{template} does not exist", report)


def _check_rl(cfg: dict, report: Report) -> None:
    source = get(cfg, "source")
    if not source:
        report.error("source", "no source; give hf://nvidia/Nemotron-RL-Ultra-Training-Blends or a local directory "
                               "holding <blend>.jsonl")
    elif not source.startswith(HF) and not _exists(source):
        _missing(cfg, "source", f"{source} does not exist", report)
    blends = get(cfg, "blends") or []
    if not blends:
        report.error("blends", "no blends; list those to prepare (rlvr1, rlvr2, ifbench, rlhf, reasoning, swe, mopd)")
    for name in sorted({b for b in blends if blends.count(b) > 1}):
        report.error("blends", f"'{name}' is listed {blends.count(name)} times; list each blend once")
    for name, entry in (get(cfg, "placeholders") or {}).items():
        if entry and entry.get("path"):
            _check_path(cfg, entry["path"], f"placeholders.{name}.path", report)
            if not entry.get("split"):
                report.error(f"placeholders.{name}.split", f"no split of {entry['path']} to restore rows from; name "
                                                           "one (dapo: train, skywork: math)")
    sample, val_rows = get(cfg, "sample"), get(cfg, "val_rows")
    if sample and val_rows and 0 < sample <= val_rows:
        report.error("sample", f"{sample} rows per blend leave nothing to train on after the last val_rows="
                               f"{val_rows}; sample more than {val_rows} or lower val_rows", quoting=("val_rows",))


def _check_path(cfg: dict, path: object, key: str, report: Report) -> None:
    if not path:
        report.error(key, "no path; give a local file or glob (.jsonl, .jsonl.gz, .jsonl.zst, .parquet) or hf://org/name")
    elif isinstance(path, str) and not path.startswith(HF) and not _exists(path):
        _missing(cfg, key, f"{path} matches no file", report)
    elif isinstance(path, str) and not path.startswith(HF) and (problem := _unreadable(path)):
        _missing(cfg, key, problem, report)


def _local(path: str) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else str(RECIPES_DIR.parent / path)


def _exists(path: str) -> bool:
    return bool(glob.glob(_local(path)))


# what a file of each kind starts (and, for Parquet, ends) with
MAGIC = {".parquet": b"PAR1", ".gz": b"\x1f\x8b", ".zst": b"\x28\xb5\x2f\xfd"}
CHECKED_FILES = 1000  # a corpus of more files: the first ones (the job's reader checks every one)


def _unreadable(path: str) -> str | None:
    """An input file that is empty or not what its name says (a Parquet file without PAR1, a .gz that is not
    gzip): found here, before a job dir is written."""
    found = []
    for match in sorted(glob.glob(_local(path)))[:CHECKED_FILES]:
        if os.path.isdir(match):
            found += sorted(str(f) for f in pathlib.Path(match).rglob("*") if f.suffix in (*MAGIC, ".jsonl"))
        else:
            found.append(match)
    for file in found[:CHECKED_FILES]:
        try:
            size = os.path.getsize(file)
            with open(file, "rb") as f:
                head = f.read(4)
                f.seek(max(0, size - 4))
                tail = f.read(4)
        except OSError as e:
            return f"{file} is not readable ({e.strerror})"
        magic = next((m for ext, m in MAGIC.items() if file.endswith(ext)), None)
        if size == 0 or (not magic and size <= 1 << 16 and not pathlib.Path(file).read_bytes().strip()):
            return f"{file} is empty (no records)"
        if magic and (not head.startswith(magic) or (file.endswith(".parquet") and tail != magic)):
            end = " and end" if file.endswith(".parquet") else ""
            return f"{file} is not a {os.path.splitext(file)[1]} file (it does not start{end} as one does)"
    return None


def _missing(cfg: dict, key: str, what: str, report: Report, fix: str = "fix the path") -> None:
    if any(i.get("key") == key and i.get("pending") for i in get(cfg, "job.inputs") or []):
        return  # the output of an earlier pipe step, not made yet
    where = where_from(key, report.origin)
    if get(cfg, "job.runs_here"):
        report.error(key, f"{what} on this machine{where}; {fix}")
    else:
        report.warn(key, f"{what} on this machine{where}; fine if the cluster mounts it (the job's preflight checks)")


def _check_packing(cfg: dict, report: Report) -> None:
    pack, mult = get(cfg, "pack_size"), get(cfg, "pad_seq_to_mult")
    if pack and mult and pack % mult:
        report.error("pad_seq_to_mult", f"pack_size {pack} is not a multiple of pad_seq_to_mult {mult}; use a pack "
                                        f"size like {pack - pack % mult} or {pack - pack % mult + mult}",
                     quoting=("pack_size",))
    ratios = [get(cfg, k) or 0 for k in ("valid_ratio", "test_ratio")]
    if any(r < 0 for r in ratios) or sum(ratios) >= 1:
        report.error("valid_ratio", f"valid_ratio + test_ratio = {sum(ratios)} leaves nothing to train on; keep the "
                                    "sum below 1", quoting=("test_ratio",))
