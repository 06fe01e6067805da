"""`ultra3 container build <kind>` in its job, on a build node, outside any container: run the build script the
launcher rendered (config `build.script`: podman build, a push if a registry is set, the squash into a .sqsh),
then publish the image under its digest's name, `<cache_dir>/ultra3-<kind>-<digest 12>.sqsh`, with its manifest
beside it. An image already there is not built again (`force: true` rebuilds it); one build of an image at a
time (a lock in the cache dir names the job holding it); the .sqsh appears whole or not at all."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from .contract import INPUT_ERROR_EXIT
from .dataprep.errors import DataPrepError
from .dataprep.files import sha256_file, write_json
from .dataprep.lock import holding
from .dataprep.settings import load_config

PROG = "ultra3 container build"


def build(cfg: dict) -> int:
    started = time.time()
    spec = cfg["build"]
    sqsh, manifest = spec["path"], spec["manifest"]
    if os.path.exists(sqsh) and os.path.exists(manifest) and not cfg.get("force"):
        print(f"{spec['name']} is built already: {sqsh} (force=true rebuilds it)", flush=True)
        return 0
    cache = os.path.dirname(sqsh)
    with holding(os.path.join(cache, f".{spec['name']}.build"), (cfg.get("job") or {}).get("id"),
                 instead="then build again (nothing is rebuilt once it is there)"):
        context = os.path.abspath("build-context")
        os.makedirs(context, exist_ok=True)
        with open(os.path.join(context, "Containerfile"), "w", encoding="utf-8") as f:
            f.write(spec["containerfile"])
        with open("build.sh", "w", encoding="utf-8") as f:
            f.write(spec["script"])
        tmp = f"{sqsh}.tmp-{os.getpid()}"
        print(f"building {spec['name']} ({spec['kind']}, {spec['platform']}, from {spec['base']})", flush=True)
        code = subprocess.run(["bash", "build.sh", context, tmp]).returncode
        if code != 0 or not os.path.isfile(tmp):
            if os.path.exists(tmp):
                os.unlink(tmp)
            print(f"{PROG}: the build script failed (exit {code}); its output is above", file=sys.stderr, flush=True)
            return code or 1
        size, digest = os.path.getsize(tmp), sha256_file(tmp)
        record = {"name": spec["name"], "kind": spec["kind"], "digest": spec["digest"], "platform": spec["platform"],
                  "base": spec["base"], "args": spec["args"], "sqsh": os.path.basename(sqsh), "sqsh_bytes": size,
                  "sqsh_sha256": digest, "job": (cfg.get("job") or {}).get("id"),
                  "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "build_s": round(time.time() - started, 1)}
        os.replace(tmp, sqsh)
        write_json(manifest, record)  # last: a manifest means a whole image
    print(f"built {sqsh} ({size / 2**20:,.1f} MiB, sha256 {digest[:16]}) in {time.time() - started:.0f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the resolved stage config (YAML)")
    args = parser.parse_args(argv)
    try:
        return build(load_config(args.config))
    except DataPrepError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return INPUT_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
