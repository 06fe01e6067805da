#!/usr/bin/env python3
"""Carry a gathered wheel set to a GPU box in chunks, and install it there. Stdlib only; Python 3.11+.

On the machine that gathered it (scripts/gpu/gather.py):

    python3 scripts/gpu/carry.py pack DIR [--chunk-mib 56]

writes DIR/chunks/: the wheels as one stream cut into parts of at most --chunk-mib, and chunks.json (each
part's and each wheel's size and sha256). Copy chunks.json and the parts to the box in as many trips as the
link allows (scp, a USB disk, a size-limited upload). On the box, after each trip:

    python3 scripts/gpu/carry.py receive FOLDER --store STORE

checks each part in FOLDER against chunks.json and moves the good ones into STORE; a part that is there
already is skipped, a damaged one is named and left out, so a trip that broke off is simply repeated. Once
STORE holds every part:

    python3 scripts/gpu/carry.py install --store STORE --target SITE

joins the parts, checks every wheel's sha256 and installs them with pip (no index, no dependencies) into SITE
(then `export PYTHONPATH=SITE PATH=SITE/bin:$PATH`), or into the running Python's environment without
--target. Installing the same set again does nothing.

For `ultra3 rl` (the pins of rl.toml): on the machine with network

    python3 scripts/gpu/carry.py rl-fetch OUT

downloads the NeMo RL source trees (GitHub's archive of each pinned commit) into OUT/sources with sources.json,
and the RL wheels into OUT/wheels with manifest.json (carry those with `pack`, `receive`, `install` as above).
On the box,

    python3 scripts/gpu/carry.py rl-stage OUT/sources --root ROOT

checks each tree's sha256 and unpacks it at its place under ROOT (again with the same trees: nothing to do), and
`carry.py rl-path ROOT` prints the PYTHONPATH an RL job puts ahead of the wheel set's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from pathlib import Path

INDEX = "chunks.json"
STAMP = ".ultra3-wheelset"
RL_PINS = Path(__file__).with_name("rl.toml")
ARCHIVE = "https://github.com/{repo}/archive/{commit}.tar.gz"
SOURCES = "sources.json"


class CarryError(Exception):
    pass


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(folder: Path, chunk_mib: int) -> dict:
    """The wheels of folder/manifest.json, in manifest order, as one stream of parts."""
    info = json.loads((folder / "manifest.json").read_text())
    out = folder / "chunks"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    writer = PartWriter(out, chunk_mib << 20)
    for wheel in info["wheels"]:
        path = folder / "wheels" / wheel["file"]
        if path.stat().st_size != wheel["size"]:
            raise CarryError(f"{path} changed since gather wrote the manifest; gather again")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                writer.write(block)
    parts = writer.close()
    index = {"manifest": info, "parts": [{"file": p.name, "size": p.stat().st_size, "sha256": sha256(p)}
                                          for p in parts]}
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return index


def receive(folder: Path, store: Path) -> tuple[int, int, list[str]]:
    """Move the good parts of folder into store; (parts held, parts in all, problems)."""
    index_file = folder / INDEX if (folder / INDEX).is_file() else store / INDEX
    if not index_file.is_file():
        raise CarryError(f"no {INDEX} in {folder} or {store}: carry it with the first part")
    index = json.loads(index_file.read_text())
    store.mkdir(parents=True, exist_ok=True)
    held = store / INDEX
    if held.is_file() and json.loads(held.read_text()) != index:
        raise CarryError(f"{store} holds the parts of another wheel set; give an empty --store")
    if not held.is_file():
        shutil.copyfile(index_file, held)
    problems = []
    for part in index["parts"]:
        have, arrived = store / part["file"], folder / part["file"]
        if have.is_file() and have.stat().st_size == part["size"]:
            continue  # checked when it was moved in
        if not arrived.is_file():
            continue
        if arrived.stat().st_size != part["size"] or sha256(arrived) != part["sha256"]:
            problems.append(f"{arrived} is damaged (size or sha256 differs from {INDEX}); carry it again")
            continue
        temporary = have.with_name(have.name + ".partial")
        shutil.copyfile(arrived, temporary)
        os.replace(temporary, have)
    count = sum((store / p["file"]).is_file() for p in index["parts"])
    return count, len(index["parts"]), problems


def install(store: Path, target: Path | None) -> str:
    index = json.loads((store / INDEX).read_text())
    wheelset = hashlib.sha256(json.dumps(index["manifest"], sort_keys=True).encode()).hexdigest()[:16]
    stamp = (target or Path(sys.prefix)) / STAMP
    if stamp.is_file() and stamp.read_text().strip() == wheelset:
        return f"wheel set {wheelset} is installed already in {stamp.parent}"
    missing = [p["file"] for p in index["parts"] if not (store / p["file"]).is_file()]
    if missing:
        raise CarryError(f"{len(missing)} of {len(index['parts'])} parts not received yet: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="ultra3-wheels-") as tmp:
        stream = PartReader([store / p["file"] for p in index["parts"]])
        files = []
        for wheel in index["manifest"]["wheels"]:
            path = Path(tmp) / wheel["file"]
            digest = hashlib.sha256()
            with open(path, "wb") as f:
                left = wheel["size"]
                while left:
                    block = stream.read(min(left, 1 << 20))
                    if not block:
                        raise CarryError(f"the parts end inside {wheel['file']}: pack them again")
                    digest.update(block)
                    f.write(block)
                    left -= len(block)
            if digest.hexdigest() != wheel["sha256"]:
                raise CarryError(f"{wheel['file']} joined from the parts has the wrong sha256: pack them again")
            files.append(str(path))
        where = ["--target", str(target)] if target else []
        code = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                               "--no-compile", "--upgrade", "--disable-pip-version-check", *where, *files]).returncode
        if code != 0:
            raise CarryError(f"pip install of the wheel set exited {code}")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(wheelset + "\n")
    return f"installed {len(files)} wheels (set {wheelset}) into {stamp.parent}"


def fetch_sources(out: Path, pins: dict, url: str = ARCHIVE) -> dict:
    """Each pinned source tree's archive into out (kept when there from an earlier fetch), and out/sources.json."""
    out.mkdir(parents=True, exist_ok=True)
    trees = []
    for tree in pins["source"]:
        path = out / f"{tree['name']}-{tree['commit']}.tar.gz"
        if not path.is_file():
            partial = path.with_name(path.name + ".partial")
            with urllib.request.urlopen(url.format(**tree)) as answer, open(partial, "wb") as f:
                shutil.copyfileobj(answer, f)
            os.replace(partial, path)
        trees.append({**tree, "file": path.name, "size": path.stat().st_size, "sha256": sha256(path)})
    index = {"pythonpath": pins["pythonpath"], "sources": trees}
    (out / SOURCES).write_text(json.dumps(index, indent=1) + "\n")
    return index


def fetch_wheels(out: Path, pins: dict) -> dict:
    """The pinned RL wheels for the box's CPython 3.12 on x86-64 Linux, without their dependencies, into
    out/wheels, and out/manifest.json for `pack`."""
    wheels = out / "wheels"
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", p)]
    specs = [f"{w['name']}=={w['version']}" for w in pins["wheel"]]
    code = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--python-version", "3.12", *platforms, "--dest", str(wheels), *specs]).returncode
    if code != 0:
        raise CarryError(f"pip download of the RL wheels exited {code}")
    manifest = {"wheels": [{"file": w.name, "size": w.stat().st_size, "sha256": sha256(w)}
                           for w in sorted(wheels.glob("*.whl"))]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def stage_sources(folder: Path, root: Path) -> str:
    """Unpack the trees of folder/sources.json under root, each at its `into`, parents first."""
    index = json.loads((folder / SOURCES).read_text())
    held = root / SOURCES
    if held.is_file() and json.loads(held.read_text()) == index:
        return f"the source trees are staged already in {root}"
    for tree in index["sources"]:
        archive = folder / tree["file"]
        if not archive.is_file() or archive.stat().st_size != tree["size"] or sha256(archive) != tree["sha256"]:
            raise CarryError(f"{archive} is missing or damaged (size or sha256 differs from {SOURCES}); carry it again")
    for tree in index["sources"]:
        dest = root / tree["into"]
        shutil.rmtree(dest, ignore_errors=True)  # an earlier commit's tree (and the trees nested in it)
        with tarfile.open(folder / tree["file"]) as tar:
            members = []
            for member in tar.getmembers():  # GitHub's archive: one top folder <repo>-<commit>/, dropped here
                inner = member.name.partition("/")[2]
                if inner:
                    member.name = inner
                    members.append(member)
            tar.extractall(dest, members=members, filter="data")
    shutil.copyfile(folder / SOURCES, held)
    return f"staged {len(index['sources'])} source trees in {root}"


def rl_path(root: Path) -> str:
    """The PYTHONPATH of an RL job: the staged trees in sources.json's order."""
    held = root / SOURCES
    if not held.is_file():
        raise CarryError(f"no {SOURCES} in {root}: stage the RL source trees there first (carry.py rl-stage)")
    return os.pathsep.join(str(root / path) for path in json.loads(held.read_text())["pythonpath"])


class PartWriter:
    """One stream written as parts of at most `limit` bytes: part-000, part-001, ..."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit, self.parts, self.current, self.size = folder, limit, [], None, 0

    def write(self, block: bytes) -> None:
        while block:
            if self.current is None or self.size == self.limit:
                self.close()
                self.parts.append(self.folder / f"part-{len(self.parts):03d}")
                self.current, self.size = open(self.parts[-1], "wb"), 0
            room = self.limit - self.size
            self.current.write(block[:room])
            self.size += min(room, len(block))
            block = block[room:]

    def close(self) -> list[Path]:
        if self.current:
            self.current.close()
            self.current = None
        return self.parts


class PartReader:
    """The parts, read as one stream."""

    def __init__(self, paths: list[Path]):
        self.paths, self.current = list(paths), None

    def read(self, n: int) -> bytes:
        while True:
            if self.current is None:
                if not self.paths:
                    return b""
                self.current = open(self.paths.pop(0), "rb")
            block = self.current.read(n)
            if block:
                return block
            self.current.close()
            self.current = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack")
    p.add_argument("folder", type=Path)
    p.add_argument("--chunk-mib", type=int, default=56)
    r = verbs.add_parser("receive")
    r.add_argument("folder", type=Path)
    r.add_argument("--store", type=Path, required=True)
    i = verbs.add_parser("install")
    i.add_argument("--store", type=Path, required=True)
    i.add_argument("--target", type=Path)
    verbs.add_parser("rl-fetch").add_argument("out", type=Path)
    s = verbs.add_parser("rl-stage")
    s.add_argument("folder", type=Path)
    s.add_argument("--root", type=Path, required=True)
    verbs.add_parser("rl-path").add_argument("root", type=Path)
    args = parser.parse_args()
    try:
        if args.verb == "pack":
            index = pack(args.folder, args.chunk_mib)
            total = sum(p["size"] for p in index["parts"])
            print(f"{len(index['parts'])} parts, {total / 2**20:.1f} MiB: {args.folder / 'chunks'}")
        elif args.verb == "receive":
            count, total, problems = receive(args.folder, args.store)
            for problem in problems:
                print(f"carry: {problem}", file=sys.stderr)
            print(f"{count} of {total} parts in {args.store}")
            return 2 if problems else 0
        elif args.verb == "install":
            print(install(args.store, args.target))
        elif args.verb == "rl-fetch":
            pins = tomllib.loads(RL_PINS.read_text())
            trees = fetch_sources(args.out / "sources", pins)["sources"]
            wheels = fetch_wheels(args.out, pins)["wheels"]
            print(f"{len(trees)} source trees in {args.out / 'sources'}, {len(wheels)} wheels in {args.out / 'wheels'}")
        elif args.verb == "rl-stage":
            print(stage_sources(args.folder, args.root))
        else:
            print(rl_path(args.root))
    except CarryError as e:
        print(f"carry: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
