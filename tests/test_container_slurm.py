"""`ultra3 container build` for real on the local Slurm cluster: podman (Debian's, rootful, vfs storage, chroot
isolation) builds the data image from a base made here from a static busybox (no registry), the job squashes it
with mksquashfs (no enroot here), a second build returns at once, and a stage under the profile runs in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from ultra3 import images

from test_slurm_jobs import SUBMITTED, _submitted, jobs, wait_state

pytestmark = pytest.mark.slurm

BASE = "localhost/ultra3-test-base:1"
APPLETS = ("sh", "mkdir", "printf", "true", "cat", "env")


def tools_or_why() -> str | None:
    missing = [t for t in ("podman", "mksquashfs", "unsquashfs", "busybox") if not shutil.which(t)]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/test.sh installs podman, squashfs-tools, busybox-static)"
    return None


@pytest.fixture
def builder(slurm, home, tmp_path) -> dict:
    """A profile whose data image is built from a local busybox base into a cache under tmp_path, and whose
    stages run in it."""
    why = tools_or_why()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    storage = tmp_path / "podman"
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(shutil.which("busybox"), root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    podman = ["podman", "--root", str(storage), "--runroot", images.run_root(str(storage)), "--storage-driver", "vfs"]
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    made = subprocess.run([*podman, "import", "-", BASE], input=tar, capture_output=True)
    assert made.returncode == 0, made.stderr.decode()
    cache = tmp_path / "cache"
    with open("env.toml", "a") as f:
        f.write(f"""
[builder]
extends = "ci"
container_image = "data"        # the stages under it run in the data image (the build itself on the node)
build_cache_dir = "{cache}"
[builder.images.data]
base = "{BASE}"
args = {{PACKAGES = ""}}
storage_driver = "vfs"
storage_root = "{storage}"
""")
    return {"cache": cache, "podman": podman}


def test_build_a_real_image_then_nothing_to_do_then_a_stage_runs_in_it(builder, cli):
    r = cli("container", "build", "data", "--batch", "builder")
    m = SUBMITTED.search(r.out)
    assert r.rc == 0 and m, r.out + r.err
    _submitted.append(m.group(2))
    st = wait_state(cli, m.group(1), "COMPLETED", "FAILED", timeout=300)
    log = jobs(cli, "logs", m.group(1)).out
    assert st["state"] == "COMPLETED", st["text"] + log[-3000:]
    assert "building ultra3-data-" in log and "STEP 1/" in log and "mksquashfs" not in log.split("building")[0]

    sqsh = sorted(builder["cache"].glob("ultra3-data-*.sqsh"))
    assert len(sqsh) == 1, sorted(p.name for p in builder["cache"].iterdir())
    manifest = json.loads(sqsh[0].with_suffix(".json").read_text())
    assert manifest["kind"] == "data" and sqsh[0].name == f"ultra3-data-{manifest['digest'][:12]}.sqsh"
    assert manifest["sqsh_bytes"] == sqsh[0].stat().st_size and manifest["job"] == m.group(1)
    listing = subprocess.run(["unsquashfs", "-l", str(sqsh[0])], capture_output=True, text=True).stdout
    for path in ("bin/busybox", "etc/rc", "etc/environment", "etc/fstab", "opt/ultra3/image.json"):
        assert f"squashfs-root/{path}" in listing, listing
    identity = subprocess.run(["unsquashfs", "-cat", str(sqsh[0]), "opt/ultra3/image.json"], capture_output=True,
                              text=True).stdout
    assert json.loads(identity) == {"kind": "data", "digest": manifest["digest"]}
    assert not [p for p in builder["cache"].iterdir() if ".tmp" in p.name or ".rootfs." in p.name]

    # nothing changed: no job, the same path, at once
    started = time.time()
    again = cli("container", "build", "data", "--batch", "builder")
    assert again.rc == 0 and not SUBMITTED.search(again.out), again.out + again.err
    assert f"is built already: {sqsh[0]}" in again.out and time.time() - started < 20
    assert sorted(builder["cache"].glob("ultra3-data-*.sqsh")) == sqsh

    # a data prep under the profile runs in it
    dry = cli("data", "prep", "pretrain", "-c", "tiny", "--batch", "builder", "--dry-run", "--full")
    assert dry.rc == 0, dry.err
    assert f"--container-image {sqsh[0]}" in dry.out and f"digest  {manifest['digest'][:12]}" in dry.out, dry.out
