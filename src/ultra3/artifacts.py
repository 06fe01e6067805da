"""Stage inputs from the artifact store: where a profile's store is, what it holds, and how each input
of a stage (stage.Input) gets its value, with where that value came from.

An input keeps a value the configs or the command line give it: a path, `job:ID` (that job's output of
the right kind) or `NAME:latest` / `NAME:vN` (a version in the store). Left unset, a required input
takes the newest artifact of its kind made for the same profile (preferring one of the same config
name; sampled data-prep runs are never picked by themselves). A pipe wires inputs to the outputs of
its earlier stages. The format of the store is recipes/contract.py's."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from .contract import (SMALL_FILE_MAX, artifact_name, newest_first, parse_manifest, read_store, resolve_ref, sample_dir,
                       small_text)
from .dotted import get, put
from .errors import ClusterError
from .findings import Report, skipped
from .paths import config_names
from .ssh import run
from .stage import Input, Stage

Producers = Callable[[str], list[Stage]]  # the stages that make an artifact kind (ultra3.stages.producers)

JOB_REF = "job:"


@dataclass
class Source:
    """An input's value and where it came from."""

    path: str
    how: str  # shown after the value: "from <job> completed <date>", "from pipe stage pretrain", "set in ..."
    producer: str | None = None  # the job that made it
    artifact: str | None = None  # NAME:vN in the store
    digest: str | None = None  # the producer's config digest: what a consumer's own digest builds on
    pending: bool = False  # the output of a pipe stage not yet run: nothing to check on disk yet
    step: str | None = None  # the pipe step that makes it (or made it)


class Store:
    """The manifests under one store root: a directory here, or on the cluster for SSH profiles."""

    def __init__(self, root: str, ssh: dict | None = None):
        self.root, self.ssh = root, ssh
        self._manifests: list[dict] | None = None

    def manifests(self) -> list[dict]:
        """Every version, newest first (one read of the store per command); a damaged one is named on stderr."""
        if self._manifests is None:
            self._manifests = read_store(self.root, _damaged) if not self.ssh else self._remote()
        return self._manifests

    def _remote(self) -> list[dict]:
        done = run(["test", "-d", self.root], self.ssh, timeout=60)
        if done.returncode not in (0, 1):  # 1: no store yet; else ssh itself failed
            raise ClusterError(f"cannot read the artifact store {self.root} on {self.ssh['host']}: "
                               f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'ssh failed'}")
        found = []
        files = read_files(self.root, ["-mindepth", "3", "-maxdepth", "3", "-path", "*/v*/manifest.json"], self.ssh) \
            if done.returncode == 0 else []
        for path, data in files:
            try:
                manifest = parse_manifest(small_text(data))
            except ValueError as e:
                _damaged(path, str(e))
                continue
            if manifest:
                found.append(manifest)
        return newest_first(found)

    def newest(self, kinds: tuple[str, ...], profile: str | None, prefer: str | None,
               only: tuple[str, ...] = ()) -> dict | None:
        """The newest artifact of the first kind that has any, made by one of the `only` configs (any when
        empty), preferring config `prefer`'s."""
        for kind in kinds:  # the first kind with any artifact wins (sft before pretrain checkpoints)
            mine = [m for m in self.manifests() if m.get("type") == kind and m.get("profile") == profile
                    and not m.get("sample") and not m.get("variant") and (not only or m.get("config") in only)]
            if mine:
                return next((m for m in mine if m.get("config") == prefer), mine[0])
        return None

    def by_job(self, job_ref: str, kinds: tuple[str, ...]) -> list[dict]:
        """The artifacts of the right kind of the job with this id, or of the jobs the id's prefix names."""
        mine = [m for m in self.manifests() if m.get("type") in kinds]
        exact = [m for m in mine if m.get("producer") == job_ref]
        return exact or [m for m in mine if str(m.get("producer", "")).startswith(job_ref)
                         or str(m.get("producer", "")).split("_", 1)[-1].startswith(job_ref)]

    def by_ref(self, ref: str) -> dict | None:
        if not self.ssh:
            return resolve_ref(self.root, ref, _damaged)
        name, _, version = ref.rpartition(":")
        mine = [m for m in self.manifests() if m.get("name") == name]
        if version == "latest":
            return mine[0] if mine else None
        return next((m for m in mine if str(m.get("version")) == version.removeprefix("v")), None)

    def completed_with(self, digest: str, profile: str | None) -> list[dict]:
        """The artifacts of the newest completed job with this config digest for this profile."""
        found = [m for m in self.manifests() if m.get("config_digest") == digest and m.get("profile") == profile]
        return [m for m in found if m.get("producer") == found[0].get("producer")] if found else []


def _damaged(path: str, why: str) -> None:
    skipped(path, "artifact store file", why)


def read_files(root: str, tests: list[str], ssh: dict | None, limit: int = SMALL_FILE_MAX) -> list[tuple[str, bytes]]:
    """(path, its first `limit` + 1 bytes) of each regular file `find -L ROOT TESTS` lists, on this machine or
    over SSH: FIFOs, devices and links to them are never opened, nor a file read past the limit."""
    argv = ["find", "-L", root, *tests, "-type", "f", "-exec", "head", "-v", "-c", str(limit + 1), "{}", "+"]
    out = run(argv, ssh, timeout=300, text=False).stdout
    parts = re.split(rb"(?:^|\n)==> (.*) <==\n", out)  # head's header before each file, a newline between two
    return [(name.decode(errors="replace"), data) for name, data in zip(parts[1::2], parts[2::2])]


def from_manifest(manifest: dict) -> Source:
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(manifest.get("created_ts") or 0))
    return Source(manifest["path"], f"from {manifest.get('producer')} completed {created}", manifest.get("producer"),
                  f"{manifest.get('name')}:v{manifest.get('version')}", manifest.get("config_digest"))


def settle(stage: Stage, config: dict[str, Any], origin: dict[str, str], profile: str | None, store: Store,
           wired: dict[str, Source], report: Report, producers: Producers) -> list[Source | None]:
    """Give every input of `stage` its value in `config` (and `origin`), one Source per input (None where
    the input is not needed); errors for a required input with nothing to take."""
    sources: list[Source | None] = []
    for inp in stage.inputs:
        value = get(config, inp.key)
        source, given = None, False
        if not consumed(inp, config):
            pass  # mock data, a checkpoint the job makes itself, a resumed run, a phase the run does not have
        elif inp.key in wired and origin.get(inp.key) == wired[inp.key].how:  # the pipe wired it, nothing overrode it
            source = wired[inp.key]
        elif isinstance(value, str) and _malformed_ref(value):
            report.error(inp.key, f"{value!r} is not an artifact reference (set in {origin.get(inp.key)}); write "
                                  f"NAME:latest, NAME:vN or job:ID, or ./{value} for a path")
        elif isinstance(value, str) and value.startswith(JOB_REF):
            found = store.by_job(value[len(JOB_REF):], inp.kinds)
            jobs = sorted({m.get("producer") for m in found})
            if len(jobs) != 1:
                what = f"matches {len(jobs)} jobs ({', '.join(jobs[:3])}); give more of the id" if jobs else \
                    f"no {' or '.join(inp.kinds)} artifact of that job in {store.root}; see `nemotron jobs list`"
                report.error(inp.key, f"{value}: {what} (set in {origin.get(inp.key)})")
            source = _theirs(from_manifest(found[0]), found[0], profile) if len(jobs) == 1 else None
        elif isinstance(value, str) and _is_ref(value):
            manifest = store.by_ref(value)
            if manifest is None:
                report.error(inp.key, f"{value}: no {' or '.join(inp.kinds)} artifact of that name and version in "
                                      f"{store.root} (set in {origin.get(inp.key)})")
            elif manifest.get("type") not in inp.kinds:
                report.error(inp.key, f"{value} is a {manifest.get('type')}, but this input takes "
                                      f"{' or '.join(inp.kinds)} (set in {origin.get(inp.key)})")
            source = _theirs(from_manifest(manifest), manifest, profile) \
                if manifest and manifest.get("type") in inp.kinds else None
        elif value not in (None, ""):
            source, given = Source(str(value), f"set in {origin.get(inp.key)}"), True
        elif needed(inp, config) or inp.configs or optional(inp, config):
            mine = maker_config(inp, config)
            manifest = store.newest(inp.kinds, profile, mine, inp.only(lambda key: get(config, key)))
            if manifest is None:
                if needed(inp, config):
                    report.error(inp.key, _nothing_found(stage, inp, profile, store, config, producers))
                elif optional(inp, config):
                    report.warn(inp.key, f"no {' or '.join(inp.kinds)} artifact for {_whose(profile)}: {stage.name} "
                                         f"starts without its {inp.name} input ({inp.optional_when} is set); run "
                                         f"`{hint(inp, producers, profile, config)}` first to start from one")
            else:
                source = from_manifest(manifest)
                if mine and manifest.get("config") != mine:
                    report.note(inp.key, f"no {manifest['type']} of config '{mine}'; taking "
                                         f"config '{manifest.get('config')}'s ({source.artifact})")
        if source and not given:  # resolved: the value and its origin change
            put(config, inp.key, source.path)
            origin[inp.key] = source.how
        sources.append(source or None)
    return sources


def _theirs(source: Source, manifest: dict, profile: str | None) -> Source:
    """A source named by reference (NAME:latest, job:ID, which any profile's artifact answers) says whose it is
    where that is not the job's profile."""
    if manifest.get("profile") != profile:
        source.how += f", made for {_whose(manifest.get('profile'))}"
    return source


def variant(stage: Stage, config: str, flat: dict[str, Any], origin: dict[str, str], below: dict[str, Any],
            explicit: set[str], report: Report) -> str | None:
    """A short digest of the values the command line or a pipe (`explicit`) puts over what the stage config set
    (`below`: its layers and the profile's) for a key that changes what the stage makes (any key but its
    same_output); None when there is none, or the stage makes no variants. A key the config leaves empty (the
    long-context data prep's datasets) is filled in, not replaced."""
    if stage.same_output is None:
        return None
    given = {k: below[k] for k in below if below[k] not in (None, "", [], {})}
    keys = sorted(k for k, v in flat.items() if origin.get(k) in explicit and k.split(".")[0] not in stage.same_output
                  and any(k == b or k.startswith(b + ".") or b.startswith(k + ".") for b in given)
                  and (k not in given or given[k] != v))
    if not keys:
        return None
    found = hashlib.sha256(json.dumps({k: flat[k] for k in keys}, sort_keys=True, default=str).encode()).hexdigest()[:6]
    names = ", ".join(artifact_name(o.kind, config, flat.get("sample"), found) for o in stage.outputs)
    report.note(keys[0], f"{', '.join(keys)} set in {origin[keys[0]]} over what config {config} sets: this run "
                         f"publishes {names}, never {config}'s own latest; a later stage takes it only when named "
                         f"({names.split(', ')[0]}:latest, or job:ID)")
    return found


def refuse_unread(stage: Stage, flat: dict[str, Any], origin: dict[str, str], order: list[str],
                  report: Report) -> None:
    """An input given in a layer above the one that switched it off (its `unless` key: mock data, a checkpoint
    the job makes, a resumed run) is an error: the job would never read it. A layer that sets both means it
    (quantize -c tiny makes its checkpoint at bf16_checkpoint); the pipe's wiring is not in any layer."""
    rank = {source: i for i, source in enumerate(order)}
    for inp in stage.inputs:
        off = flat.get(inp.unless) if inp.unless else None
        if not off or flat.get(inp.key) in (None, "") or \
                rank.get(origin.get(inp.key), -1) <= rank.get(origin.get(inp.unless), len(order)):
            continue
        report.error(inp.key, f"{flat[inp.key]} given (set in {origin[inp.key]}), but {inp.unless} is "
                              f"{str(off).lower()} (set in {origin[inp.unless]}), so {stage.name} would never read its "
                              f"{inp.name} input; set {inp.unless}={'false' if isinstance(off, bool) else 'null'} "
                              f"to use it, or leave {inp.key} unset")


def maker_config(inp: Input, config: dict[str, Any]) -> str | None:
    """The producer config an input prefers (or, with a config_key, takes only): the consumer's own name (tiny for
    tiny) or the one its config_key names."""
    if inp.config_key:
        return next(iter(inp.only(lambda key: get(config, key))), None)
    return get(config, "job.config") if inp.same_config else None


def consumed(inp: Input, config: dict[str, Any]) -> bool:
    """Whether the job reads the input at all: not when its `unless` key is true or its `when` key unset."""
    return not (inp.unless and get(config, inp.unless)) and not (inp.when and get(config, inp.when) in (None, ""))


def needed(inp: Input, config: dict[str, Any]) -> bool:
    return inp.required and consumed(inp, config) and not optional(inp, config)


def optional(inp: Input, config: dict[str, Any]) -> bool:
    return bool(inp.optional_when and get(config, inp.optional_when)) and consumed(inp, config)


def _whose(profile: str | None) -> str:
    return f"profile '{profile}'" if profile else "this machine"


REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*:(latest|v?[0-9]+)")  # an artifact's NAME:latest, NAME:vN (or NAME:N)


def _is_ref(value: str) -> bool:
    return REF.fullmatch(value) is not None


def _malformed_ref(value: str) -> bool:
    """A value with a ':' and no '/' (which a path or a hub id has) is meant as a reference: `NAME:LATEST`,
    `NAME:v-1`, `:latest` or an empty `job:` must not become a relative path."""
    if ":" not in value or "/" in value:
        return False
    return not (_is_ref(value) or (value.startswith(JOB_REF) and value[len(JOB_REF):].strip()))


def _nothing_found(stage: Stage, inp: Input, profile: str | None, store: Store, config: dict[str, Any],
                   producers: Producers) -> str:
    command = hint(inp, producers, profile, config)
    whose = _whose(profile)
    first = f"run `{command}` first, or " if command else ""
    skip = " (not needed when " + " or ".join([*([f"{inp.unless} is set"] if inp.unless else []),
                                                *([f"{inp.when}=null"] if inp.when else [])]) + ")" \
        if inp.unless or inp.when else ""
    return (f"no {' or '.join(inp.kinds)} artifact for {whose} in {store.root}: {stage.name} needs its {inp.name} "
            f"input; {first}set {inp.key}=PATH (or job:ID, NAME:latest){skip}")


def hint(inp: Input, producers: Producers, profile: str | None, config: dict[str, Any]) -> str:
    """The command that makes this input: of the config it takes from (its config_key's, its role's), else of the
    consumer's config name where the maker has one (tiny for tiny), whether or not the input prefers that name
    (RL's data and policy take any config's, but `rl mopd -c tiny` wants `rl rlvr -c tiny`, not the full run)."""
    makers = [s for kind in inp.kinds for s in producers(kind)]
    if not makers:
        return ""
    named, mine = inp.only(lambda key: get(config, key)), get(config, "job.config")
    name = named[0] if named else None if inp.config_key or mine not in config_names(makers[0].config_dir) else mine
    return f"ultra3 {makers[0].name}{f' -c {name}' if name not in (None, 'default') else ''}" \
           f"{f' --batch {profile}' if profile else ''}"


def job_inputs(stage: Stage, config: dict[str, Any], sources: list[Source | None], profile: str | None,
               producers: Producers) -> list[dict]:
    """`job.inputs` of the job config: what the in-job preflight checks and the job's manifests record."""
    return [{"name": inp.name, "key": inp.key, "kinds": list(inp.kinds), "required": needed(inp, config),
             "path": src.path if src else None, "producer": src.producer if src else None,
             "artifact": src.artifact if src else None, "how": src.how if src else None,
             "hint": hint(inp, producers, profile, config),
             "pending": bool(src and src.pending)}
            for inp, src in zip(stage.inputs, sources)]


def produces(stage: Stage, config: dict[str, Any]) -> list[dict]:
    """`job.produces`: each output's artifact name, kind and path (an interpolation over the job's config,
    resolved when the job dir is known); data prep's `sample` runs write to, and publish, their own."""
    sample = get(config, "sample")
    out = []
    for o in stage.outputs:
        base = get(config, o.key)
        if base in (None, ""):
            continue
        folder = sample_dir(f"${{{o.key}}}", sample)
        out.append({"name": artifact_name(o.kind, str(get(config, "job.config")), sample, get(config, "job.variant")),
                    "kind": o.kind,
                    "path": f"{folder}/{o.file}" if o.file else folder})
    return out


def interpolate(template: str, config: dict[str, Any]) -> str:
    """An output path template (`${output_dir}/blend.json`) with the config's values."""
    return re.sub(r"\$\{([\w.]+)\}", lambda m: str(get(config, m.group(1))), template)


def digest(config: dict[str, Any], stage: Stage, sources: list[Source | None]) -> str:
    """What makes two jobs' outputs the same: the config without where and how it runs (run, cluster,
    job) and without its input paths, plus what each input is: its producer's digest, or its value."""
    keys = {inp.key for inp in stage.inputs}
    body = {k: v for k, v in config.items() if k not in ("run", "cluster", "job")}
    body = _without(body, keys)
    body["__inputs__"] = {inp.name: (src.digest or src.path) if src else None
                          for inp, src in zip(stage.inputs, sources)}
    body["__stage__"] = stage.name
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without(tree: dict[str, Any], keys: set[str], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        dotted = f"{prefix}{k}"
        if dotted in keys:
            continue
        out[k] = _without(v, keys, dotted + ".") if isinstance(v, dict) else v
    return out


def source_line(key: str, src: Source) -> str:
    return f"{key} = {src.path}  ({src.how}{f', {src.artifact}' if src.artifact else ''})"
