"""Hugging Face Hub inputs: `hf://org/name` datasets (their Parquet/JSONL data files for one config and
split) and tokenizers named by repo id, fetched with `huggingface_hub` by the driver before any shard is
planned, into its cache or into `hf_cache_dir` (on a multi-node Ray cluster, put that on storage every
node sees: the shard tasks read the downloaded files where the driver put them).

Which files make a dataset's config and split is read, in this order, from:
1. a glob after the repo name (`hf://org/name/data/*.parquet`), which selects files directly;
2. the `configs:` section of the dataset card (README.md YAML front matter), the way `datasets` does:
   `config_name` = the dataset's `subset` (or the config marked `default: true`, or the only one), its
   `data_files` for the dataset's `split` (a pattern or list of patterns, or `{split, path}` entries);
3. the repo's layout: data files under a directory named like the subset, with the split's name in their
   path (`train-00000-of-00004.parquet`, `data/train/…`); a repo whose file names name no split at all is
   all `train`.

`fetch_files` downloads the files a caller picks itself (the RL blends, by name) the same way.

The revision (`revision` of the dataset, default `main`) is pinned to a commit SHA first, so the files
listed and downloaded are of one commit, and the manifest records it. `HF_TOKEN` in the environment is
used for gated or private repos.
"""

from __future__ import annotations

import fnmatch
import re
from concurrent.futures import ThreadPoolExecutor

from .errors import DataPrepError, HubUnreachable

DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
NETWORK = ("ConnectionError", "TransportError", "Timeout", "TimeoutError")  # the builtins', requests' and httpx's
# families of a request that got no answer (huggingface_hub raises its HTTP client's own)
SPLIT_ALIASES = {"valid": ("validation", "valid", "val", "dev"), "validation": ("validation", "valid", "val", "dev"),
                 "test": ("test",), "train": ("train",)}


def parse_hf_path(path: str) -> tuple[str, str | None]:
    """`hf://org/name[/glob]` -> (repo id, glob or None)."""
    rest = path[len("hf://"):].strip("/")
    if rest.startswith("datasets/"):
        rest = rest[len("datasets/"):]
    parts = rest.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise DataPrepError(f"{path} is not a Hugging Face dataset path (hf://org/name[/glob])")
    return "/".join(parts[:2]), ("/".join(parts[2:]) or None)


def card_configs(readme: str) -> list[dict]:
    """The `configs:` list of a dataset card's YAML front matter ([] when it has none)."""
    m = re.match(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", readme, re.S)
    if not m:
        return []
    import yaml

    try:
        meta = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError:
        return []
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _split_patterns(data_files, split: str) -> list[str] | None:
    """The patterns of `split` in a config's `data_files` (None: the config has no such split)."""
    if isinstance(data_files, str):
        return [data_files] if split == "train" else None
    if isinstance(data_files, list) and all(isinstance(p, str) for p in data_files):
        return list(data_files) if split == "train" else None
    if isinstance(data_files, dict):  # {split: pattern(s)}
        data_files = [{"split": k, "path": v} for k, v in data_files.items()]
    names = SPLIT_ALIASES.get(split, (split,))
    for entry in data_files or []:
        if isinstance(entry, dict) and entry.get("split") in names:
            path = entry.get("path")
            return [path] if isinstance(path, str) else list(path or [])
    return None


def _match(files: list[str], patterns: list[str]) -> list[str]:
    return sorted(f for f in files if any(fnmatch.fnmatchcase(f, p) or fnmatch.fnmatchcase(f, p.lstrip("./"))
                                          for p in patterns))


def select_data_files(repo: str, files: list[str], configs: list[dict], subset: str | None, split: str,
                      pattern: str | None = None) -> list[str]:
    """The repo files that hold `subset`/`split` (see the module doc); a DataPrepError when none do."""
    data = sorted(f for f in files if f.lower().endswith(DATA_SUFFIXES) and not f.split("/")[-1].startswith("."))
    if pattern:
        chosen = _match(data, [pattern])
        if not chosen:
            raise DataPrepError(f"hf://{repo}/{pattern} matches no data file of the repo")
        return chosen
    if configs:
        names = [c.get("config_name", "default") for c in configs]
        if subset is not None:
            config = next((c for c in configs if c.get("config_name", "default") == subset), None)
            if config is None:
                raise DataPrepError(f"hf://{repo} has no subset {subset!r}; its subsets: {', '.join(map(str, names))}")
        else:
            defaults = [c for c in configs if c.get("default")] or \
                [c for c in configs if c.get("config_name", "default") == "default"]
            if len(defaults) == 1 or len(configs) == 1:
                config = (defaults or configs)[0]
            else:
                raise DataPrepError(f"hf://{repo} has several subsets ({', '.join(map(str, names))}): set `subset`")
        patterns = _split_patterns(config.get("data_files"), split)
        if patterns is None:
            raise DataPrepError(f"hf://{repo} subset {config.get('config_name', 'default')!r} has no split {split!r}")
        chosen = _match(data, patterns)
        if not chosen:
            raise DataPrepError(f"hf://{repo}: the data files of split {split!r} ({', '.join(patterns)}) match no file")
        return chosen
    if subset is not None:
        data = [f for f in data if subset in f.split("/")[:-1] or f.split("/")[-1].startswith(subset + ".")]
        if not data:
            raise DataPrepError(f"hf://{repo} has no directory or file for subset {subset!r}")
    names = SPLIT_ALIASES.get(split, (split,))
    token = r"(^|[/_.-])({})([/_.-]|$)"
    chosen = [f for f in data if re.search(token.format("|".join(map(re.escape, names))), f)]
    if not chosen and split == "train":
        any_split = token.format("|".join(re.escape(n) for ns in SPLIT_ALIASES.values() for n in ns))
        if not any(re.search(any_split, f) for f in data):
            chosen = data  # no file names a split: it is all train
    if not chosen:
        raise DataPrepError(f"hf://{repo} has no data file for split {split!r}")
    return chosen


def resolve_dataset(path: str, split: str, subset: str | None, revision: str | None,
                    cache_dir: str | None) -> tuple[list[str], dict]:
    """Download the data files of an `hf://` dataset; (local paths in repo order, provenance)."""
    repo, pattern = parse_hf_path(path)

    def choose(files: list[str], fetch) -> list[str]:
        configs = []
        if pattern is None and "README.md" in files:
            with open(fetch("README.md"), encoding="utf-8", errors="replace") as f:
                configs = card_configs(f.read())
        return select_data_files(repo, files, configs, subset, split, pattern)

    return fetch_files(path, revision, cache_dir, choose)


def fetch_files(path: str, revision: str | None, cache_dir: str | None, choose) -> tuple[list[str], dict]:
    """Download the files `choose(files, fetch)` picks among the dataset repo's files at one commit (the
    revision pinned first; `fetch(name)` downloads one file, for a card); (local paths, provenance)."""
    from huggingface_hub import HfApi, hf_hub_download

    repo, _ = parse_hf_path(path)
    api = HfApi()

    def fetch(name: str) -> str:
        return hf_hub_download(repo, name, repo_type="dataset", revision=sha, cache_dir=cache_dir)

    try:
        sha = api.dataset_info(repo, revision=revision or "main", files_metadata=False).sha
        files = api.list_repo_files(repo, repo_type="dataset", revision=sha)
        chosen = choose(files, fetch)
        # one download per file on 8 threads, as snapshot_download does, without matching every file
        # against every other as its allow_patterns would (quadratic for repos of thousands of files)
        with ThreadPoolExecutor(max_workers=8) as pool:
            local = list(pool.map(fetch, chosen))
    except DataPrepError:
        raise
    except Exception as e:  # network, auth, missing repo: one line with what failed
        raise failed(path, e, "cannot fetch from the Hugging Face Hub") from None
    return local, {"repo": repo, "revision": sha, "files": len(chosen)}


def download_tokenizer(name: str, cache_dir: str | None) -> tuple[str, str | None, str | None]:
    """(tokenizer.json path, tokenizer_config.json path or None, commit) of a hub model `org/name[@rev]`."""
    from huggingface_hub import hf_hub_download

    repo, _, revision = name.partition("@")
    try:
        path = hf_hub_download(repo, "tokenizer.json", revision=revision or None, cache_dir=cache_dir)
    except Exception as e:
        raise failed(f"tokenizer {name}", e, "no local path of that name, and it cannot be fetched from the Hugging "
                     "Face Hub") from None
    m = re.search(r"[/\\]snapshots[/\\]([0-9a-f]{40})[/\\]", path)
    commit = m.group(1) if m else None
    try:
        config = hf_hub_download(repo, "tokenizer_config.json", revision=commit or revision or None,
                                 cache_dir=cache_dir)
    except Exception:
        config = None
    return path, config, commit


def failed(what: str, e: Exception, why: str) -> Exception:
    """The error a failed hub call raises: the Hub unreachable is the machine's (HubUnreachable, exit 1); anything
    else (no such repo, revision or file, a gated repo without access) is the input's (DataPrepError, exit 2)."""
    detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if unreachable(e):
        return HubUnreachable(f"{what}: the Hugging Face Hub cannot be reached from this machine ({detail}); check "
                              "its network (and HF_ENDPOINT, HF_HUB_OFFLINE) and run again, or give a local path")
    return DataPrepError(f"{what}: {why} ({detail})")


def unreachable(e: Exception) -> bool:
    """Whether a hub call failed for want of an answer: no connection, offline mode, a timeout, a file not cached
    that could not be fetched, or the Hub's own 5xx or 429."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if isinstance(e, LocalEntryNotFoundError):  # the request failed and nothing is cached
        return True
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, HfHubHTTPError) and isinstance(status, int):
        return status >= 500 or status == 429
    return any(c.__name__ in NETWORK for c in type(e).__mro__)
