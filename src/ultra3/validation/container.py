"""Rules for `ultra3 container build`: an image kind named, its Containerfile beside the config and taking
exactly the build args the config pins, a cache dir every node can reach by the same absolute path."""

from __future__ import annotations

from ultra3.findings import Report
from ultra3.images import KINDS, declared_args

# the build args the launcher passes itself
GIVEN = ("BASE", "IMAGE_KIND", "IMAGE_DIGEST")


def validate_container(cfg: dict, report: Report) -> None:
    if cfg.get("kind") is None:
        report.error("kind", f"name the image kind to build: {' | '.join(KINDS)} (e.g. `data` after `build`, "
                             "or -c data)")
        return
    for key in ("base", "containerfile"):
        if not cfg.get(key):
            report.error(key, f"{key} is not set; the kind's config names it")
    build = cfg.get("build")
    if not build:
        return
    if not build["containerfile"]:
        report.error("containerfile", f"{build['containerfile_path']} is not a file; put the Containerfile beside "
                                      "the config")
        return
    report.blocks["build script"] = build["script"]
    declared = declared_args(build["containerfile"])
    for name in sorted(set(build["args"]) - declared):
        report.error(f"args.{name}", f"{build['containerfile_path']} declares no ARG {name}; declare it there or "
                                     "remove it")
    for name in sorted(declared - set(build["args"]) - set(GIVEN)):
        if f"ARG {name}=" not in build["containerfile"]:
            report.warn(f"args.{name}", f"{build['containerfile_path']} declares ARG {name} without a default and "
                                        "the config gives none: it builds with it empty")
    if not str(cfg.get("cache_dir") or "").startswith("/"):
        report.error("cache_dir", f"{cfg.get('cache_dir')!r} is relative; give an absolute path on storage every "
                                  "node sees (profile: build_cache_dir)")
