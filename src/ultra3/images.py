"""Container images by kind. configs/container/<kind>.yaml and the Containerfile beside it give an image its
content digest (the Containerfile's text and the pins: base image, build args, platform), which names its
build, `<cache_dir>/ultra3-<kind>-<digest 12>.sqsh`. `ultra3 container build <kind>` makes it (the build
script rendered here, run by recipes/container_build.py); a stage whose profile names no image, or names a
kind (`run.container_image: training`), runs in it, resolved at submission."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .config import CLI_SOURCE, find_config, flatten, load_layers, merge, resolve, unflatten
from .contract import SMALL_FILE_MAX, read_small, small_text
from .ssh import run, ssh_of
from .forms import IMAGE
from .gpus import GPU_TYPES
from .paths import CONFIGS_DIR, nemorun_home

KINDS = ("training", "rl", "data")
CONFIG_DIR = "container"  # under configs/
DEFAULT_PLATFORM = "linux/amd64"
SQUASH = ("-noappend", "-all-root", "-no-progress", "-comp", "lzo", "-noI")  # enroot's own defaults


@dataclass(frozen=True)
class Image:
    kind: str
    digest: str  # sha256 of the identity (hex)
    platform: str
    cache_dir: str
    base: str

    @property
    def name(self) -> str:
        return f"ultra3-{self.kind}-{self.digest[:12]}"

    @property
    def path(self) -> str:
        return str(PurePosixPath(self.cache_dir, f"{self.name}.sqsh"))

    @property
    def manifest(self) -> str:
        return str(PurePosixPath(self.cache_dir, f"{self.name}.json"))

    @property
    def tag(self) -> str:
        return f"localhost/ultra3-{self.kind}:{self.digest[:12]}"


def platform_of(value: str | None, gpu: str | None) -> str:
    """`auto` (or unset): the platform of the profile's GPU nodes (Grace on GB200/GB300: linux/arm64)."""
    if value and value != "auto":
        return value
    found = GPU_TYPES.get(gpu or "")
    return found.platform if found else DEFAULT_PLATFORM


def default_cache_dir(run: dict) -> str:
    """Beside the job dirs, which every node sees: <job_dir or NEMORUN_HOME>/containers."""
    return str(PurePosixPath(run.get("job_dir") or str(nemorun_home()), "containers"))


def containerfile_path(config: dict, config_path: Path) -> Path:
    """The config's `containerfile`: beside the config file, else the shipped one of that name."""
    name = str(config.get("containerfile") or "")
    here = config_path.parent / name
    return (here if here.is_file() else CONFIGS_DIR / CONFIG_DIR / name).resolve()


def shown(path: Path) -> str:
    """A shipped file as configs/..., any other by its own path."""
    try:
        return f"configs/{path.relative_to(CONFIGS_DIR.resolve()).as_posix()}"
    except ValueError:
        return str(path)


def image_of(config: dict, containerfile: str, gpu: str | None) -> Image:
    """The image a resolved container config describes (its cache_dir already settled)."""
    platform = platform_of(config.get("platform"), gpu)
    identity = {"kind": config["kind"], "base": config["base"], "platform": platform,
                "args": {k: str(v) for k, v in sorted((config.get("args") or {}).items())},
                "containerfile_sha256": hashlib.sha256(containerfile.encode()).hexdigest()}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return Image(config["kind"], digest, platform, str(config["cache_dir"]), config["base"])


def declared_args(containerfile: str) -> set[str]:
    """The ARG names a Containerfile declares."""
    names = set()
    for line in containerfile.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "ARG":
            names.add(words[1].split("=", 1)[0])
    return names


def run_root(storage_root: str) -> str:
    """podman's run root for a storage root: the same one every time (podman records it with the storage), and
    short (podman refuses one over 50 characters)."""
    return f"/tmp/ultra3-podman-{hashlib.sha256(storage_root.encode()).hexdigest()[:12]}"


def build_script(config: dict, image: Image) -> str:
    """The build job's script: podman builds the image from the context dir ($1, the Containerfile alone),
    pushes it to the registry if one is set, and squashes it into $2 with enroot, or, without enroot, with
    mksquashfs from its exported root file system (and the files enroot reads: /etc/environment, /etc/rc,
    /etc/fstab). Every value is quoted here; the runtime runs it as `bash build.sh CONTEXT SQSH`."""
    q = shlex.quote
    args = {"BASE": image.base, **{k: str(v) for k, v in (config.get("args") or {}).items()},
            "IMAGE_KIND": image.kind, "IMAGE_DIGEST": image.digest}
    storage = []
    if config.get("storage_root"):
        storage += ["--root", q(str(config["storage_root"])), "--runroot", q(run_root(str(config["storage_root"])))]
    if config.get("storage_driver"):
        storage += ["--storage-driver", q(str(config["storage_driver"]))]
    lines = [
        "#!/usr/bin/env bash",
        f"# ultra3 container build {image.kind}: {image.name} (sha256 {image.digest})",
        "set -euo pipefail",
        'context=$1 sqsh=$2',
        f"podman=({' '.join(['podman', *storage])})",
        f"tag={q(image.tag)}",
        "",
        '"${podman[@]}" build --pull=missing --isolation ' + q(str(config.get("isolation") or "chroot"))
        + f" --platform {q(image.platform)} \\",
        *[f"    --build-arg {q(f'{k}={v}')} \\" for k, v in args.items()],
        '    --tag "$tag" --file "$context/Containerfile" "$context"',
    ]
    if config.get("registry"):
        remote = f"docker://{str(config['registry']).rstrip('/')}/ultra3-{image.kind}:{image.digest[:12]}"
        lines += ["", f'"${{podman[@]}}" push "$tag" {q(remote)}']
    lines += [
        "",
        "if command -v enroot >/dev/null; then",
        '    enroot import --output "$sqsh" "podman://$tag"',
        "else  # the root file system, as enroot would lay it out, squashed",
        '    rootfs=$(mktemp -d "$sqsh.rootfs.XXXXXX")',
        '    ctr=$("${podman[@]}" create "$tag" /bin/true)',
        '    trap \'"${podman[@]}" rm -f "$ctr" >/dev/null; rm -rf "$rootfs"\' EXIT',
        '    "${podman[@]}" export "$ctr" | tar -x -C "$rootfs" --numeric-owner',
        '    mkdir -p "$rootfs/etc"',
        '    "${podman[@]}" image inspect --format \'{{range .Config.Env}}{{println .}}{{end}}\' "$tag" '
        '> "$rootfs/etc/environment"',
        "    printf '%s\\n' '#!/bin/sh' 'if [ $# -gt 0 ]; then exec \"$@\"; fi' 'exec /bin/sh' > \"$rootfs/etc/rc\"",
        '    : > "$rootfs/etc/fstab"',
        f'    mksquashfs "$rootfs" "$sqsh" {" ".join(SQUASH)}',
        "fi",
    ]
    return "\n".join(lines) + "\n"


def read_manifest(image: Image, ssh: dict | None) -> dict[str, Any] | None:
    """The build's manifest beside its .sqsh, None when the image is not built (on this machine, or on the
    cluster's login node over SSH)."""
    try:
        if ssh:  # a regular file only, and no more of it than a manifest holds
            shown = run(["find", "-L", image.manifest, "-maxdepth", "0", "-type", "f", "-exec", "head", "-c",
                         str(SMALL_FILE_MAX + 1), "{}", "+"], ssh, text=False)
            text = small_text(shown.stdout) if shown.returncode == 0 else ""
        else:
            text = read_small(image.manifest) if os.path.exists(image.path) else ""
        manifest = json.loads(text) if text else None
        return manifest if isinstance(manifest, dict) else None
    except (OSError, ValueError):  # not the manifest a build writes: the image counts as not built
        return None



def settle(job) -> None:
    """The container build's `build` table: the image its config describes (digest, where it lands), the
    Containerfile's text and the build script; checked by validation/container.py."""
    cfg = job.config
    if cfg.get("kind") not in KINDS:
        return  # the rules say what is missing
    source = job.profile.source if job.profile else ""
    for key, value in pins(cfg["kind"], cfg["run"]).items():  # the profile's, below the command line's
        if not any(k == key or k.startswith(key + ".") for k, src in job.origin.items() if src == CLI_SOURCE):
            _put(job, key, value, f"{source} (images.{cfg['kind']}.{key})")
    if not cfg.get("base") or not cfg.get("containerfile"):
        return
    cache = cfg.get("cache_dir") or default_cache_dir(cfg["run"])
    path = containerfile_path(cfg, job.config_path)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    image = image_of({**cfg, "cache_dir": cache}, text, (cfg.get("cluster") or {}).get("gpu"))
    build = {"name": image.name, "kind": image.kind, "digest": image.digest, "platform": image.platform,
             "base": image.base, "args": {k: str(v) for k, v in (cfg.get("args") or {}).items()},
             "path": image.path, "manifest": image.manifest, "containerfile_path": shown(path), "containerfile": text,
             "script": build_script({**cfg, "cache_dir": cache}, image)}
    if not cfg.get("cache_dir"):
        job.origin["cache_dir"] = "the default: <job_dir or NEMORUN_HOME>/containers"
    job.flat["cache_dir"] = cache
    # derived: the job's, not shown as changed; shell and Containerfile `${...}` kept from OmegaConf's resolution
    job.flat.update({f"build.{k}": v.replace("${", "\\${") if isinstance(v, str) else v for k, v in build.items()})
    cfg["cache_dir"], cfg["build"] = cache, build


def _put(job, key: str, value: Any, origin: str) -> None:
    for old in [k for k in job.flat if k == key or k.startswith(key + ".")]:
        del job.flat[old]
    for flat_key, flat_value in (flatten({key: value}) or {key: value}).items():
        job.flat[flat_key], job.origin[flat_key] = flat_value, origin
    job.config[key] = value


def built_already(job) -> str | None:
    """Why a build need not run: its image is in the cache (and force is not set)."""
    build = job.config.get("build")
    if not build or job.config.get("force"):
        return None
    image = Image(build["kind"], build["digest"], build["platform"], str(PurePosixPath(build["path"]).parent),
                  build["base"])
    found = read_manifest(image, ssh_of(job.config["run"]))
    if not found or found.get("digest") != image.digest:
        return None
    return f"{image.name} is built already: {image.path} (built {found.get('built')}; force=true rebuilds it)"


def pins(kind: str, run: dict) -> dict:
    """What the profile's `images` table overrides of a kind's config."""
    return dict(((run.get("images") or {}).get(kind) or {}))


def kind_image(kind: str, run: dict, cache_dir: str | None, gpu: str | None) -> Image:
    """The image of `kind` under a profile: the shipped config, the profile's overrides of its pins, its cache."""
    path = find_config(CONFIG_DIR, kind)
    flat, origin = merge(load_layers(path, CONFIG_DIR))
    config = {**resolve(unflatten(flat), origin), **pins(kind, run)}
    config["cache_dir"] = cache_dir or config.get("cache_dir") or default_cache_dir(run)
    return image_of(config, containerfile_path(config, path).read_text(encoding="utf-8"), gpu)


def choose(kind: str | None, config: dict, flat: dict, origin: dict, profile, asks_image: bool, dry_run: bool,
           report) -> None:
    """The container image of a stage job. `kind` None: the stage runs on the node itself (image builds), so the
    profile's image and mounts are dropped. Else a `container_image` the profile or command line gives is used as
    given ("" for none), unless it names a kind; with none, or a kind, that kind's built image, found in the
    profile's cache (job.image then names it for the in-job preflight); not built: one line naming the build."""
    run = config["run"]
    if kind is None:
        for key in ("container_image", "mounts"):
            if run.get(key):
                report.note(f"run.{key}", f"{run[key]!r} from {origin.get('run.' + key)} is not used: builds run on "
                                          "the node itself, outside any container")
            run.pop(key, None)
            flat.pop(f"run.{key}", None)
            origin.pop(f"run.{key}", None)
        return
    given = run.get("container_image")
    if not asks_image or ("run.container_image" in origin and given not in KINDS):
        return
    named = given in KINDS
    kind = given if named else kind
    cache = (profile.stage_values.get("build_cache_dir") if profile else None)
    image = kind_image(kind, run, cache, (config.get("cluster") or {}).get("gpu"))
    if not IMAGE(image.path):  # it goes into the batch script's srun line
        where = f"build_cache_dir = {cache!r} in {profile.source}" if cache else "its default cache dir"
        report.error("run.container_image", f"the {kind} image's path {image.path!r}, under {where}, must be "
                                            f"{IMAGE.what}; set build_cache_dir to such a path")
        return
    built = read_manifest(image, ssh_of(run))
    where = profile.name if profile else "PROFILE"
    if not built or built.get("digest") != image.digest:
        build = f"ultra3 container build {kind} --batch {where}"
        if named:
            report.error("run.container_image", f"the {kind} image is not built for profile '{where}' (no "
                                                f"{image.path}); build it: {build}")
            return
        message = (f"no container image is set and the {kind} image is not built for profile '{where}' (no "
                   f"{image.path}), so the job would run `python` from the compute nodes' PATH; build it ({build}), "
                   f"or set container_image = \"IMAGE\" in [{where}] of env.toml (a .sqsh file or registry image), "
                   "or container_image = \"\" to run without a container on purpose")
        (report.warn if dry_run else report.error)("run.container_image", message + ("; submitting refuses this" if
                                                                                     dry_run else ""))
        return
    how = f"run.container_image={kind}, from {origin['run.container_image']}" if named else \
        "the stage's kind: the profile names no image"
    run["container_image"] = flat["run.container_image"] = image.path
    origin["run.container_image"] = f"the {kind} image ({how})"
    identity = {"kind": kind, "name": image.name, "digest": image.digest}
    config["job"]["image"] = flat["job.image"] = identity
    report.tables["container image"] = [
        ("kind", f"{kind} ({how})"), ("image", image.path),
        ("digest", f"{image.digest[:12]}...  (configs/{CONFIG_DIR}/{kind}.yaml, platform {image.platform})"),
        ("built", f"{built.get('built')} by {built.get('job')}")]
