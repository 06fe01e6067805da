#!/usr/bin/env python3
"""Gather the wheel set a GPU box without network needs for the training smoke tests, on a machine with network.

    python3 scripts/gpu/gather.py --out DIR --torch-python PY [--cuda 13] [--archs 90]

1. Downloads every file pinned in scripts/gpu/wheels.toml from PyPI and checks its sha256 (a file already in
   DIR/downloads with the right hash is kept).
2. Builds the sdists into wheels with PY, a Python 3.12 holding the box's exact torch (a CUDA build: its nvidia-*
   packages give the cuDNN, NCCL and CUDA library headers) plus ninja, pybind11, setuptools, wheel and
   nvidia-cudnn-frontend: the CUDA extensions are compiled with this machine's CUDA toolkit (CUDA_HOME, the
   torch's CUDA major) for the GPU architectures --archs only (90: H100/H200; 100: B200/GB200), so the box
   loads them as they are, with no compiler.
3. Builds the launcher's own wheel from this checkout (again on every run).
4. Writes DIR/wheels/ and DIR/manifest.json (each wheel's size and sha256), which carry.py packs.

Every step is skipped when its output is there already, so an interrupted gather resumes; the built wheels are
built again when the torch or --archs differ from the last gather's, and the manifest lists only this gather's
wheels (those of another --cuda left in DIR/wheels are not carried).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

from carry import sha256  # the script's own folder is on the path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PINS = HERE / "wheels.toml"
INDEX = "https://pypi.org/simple"


class GatherError(Exception):
    pass


def pins(cuda: str) -> tuple[list[dict], list[dict]]:
    with open(PINS, "rb") as f:
        table = tomllib.load(f)
    wheels = [w for w in table["wheel"] if w.get("cuda", cuda) == cuda]
    return wheels, table["sdist"]


def url_of(pin: dict) -> str:
    """The file's address in PyPI's JSON simple index (PEP 691)."""
    request = urllib.request.Request(f"{INDEX}/{pin['name']}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == pin["file"]:
            return entry["url"]
    raise GatherError(f"{pin['file']} is not in {INDEX}/{pin['name']}/; fix its pin in {PINS}")


def download(pin: dict, folder: Path) -> Path:
    path = folder / pin["file"]
    if path.is_file() and sha256(path) == pin["sha256"]:
        return path
    partial = path.with_name(path.name + ".partial")
    with urllib.request.urlopen(url_of(pin), timeout=600) as response, open(partial, "wb") as f:
        while block := response.read(1 << 20):
            f.write(block)
    got = sha256(partial)
    if got != pin["sha256"]:
        partial.unlink()
        raise GatherError(f"{pin['file']}: sha256 {got} from PyPI, {pin['sha256']} pinned in {PINS}")
    partial.rename(path)
    print(f"downloaded {pin['file']} ({path.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return path


def build_env(build: Path, archs: list[str], python: str) -> dict[str, str]:
    """A CUDA home like the real one whose nvcc keeps only the wanted architectures (the extensions' setup.py
    files name a dozen), so each extension compiles once instead of ten times; the headers of torch's nvidia-*
    packages after the toolkit's (cuDNN, NCCL, and the CUDA libraries a minimal toolkit lacks)."""
    real = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda").resolve()
    if not (real / "bin" / "nvcc").is_file():
        raise GatherError(f"no nvcc in {real}/bin: set CUDA_HOME to the CUDA toolkit matching the box's torch")
    home = build / "cuda-home"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir():
        if entry.name != "bin" and not (home / entry.name).exists():
            (home / entry.name).symlink_to(entry)
    for tool in (real / "bin").iterdir():
        if tool.name != "nvcc" and not (home / "bin" / tool.name).exists():
            (home / "bin" / tool.name).symlink_to(tool)
    nvcc = home / "bin" / "nvcc"
    if not nvcc.exists():
        nvcc.symlink_to(HERE / "nvcc_archs.py")
    nvidia = subprocess.run([python, "-c", "import nvidia; print(list(nvidia.__path__)[0])"], capture_output=True,
                            text=True).stdout.strip()
    headers = sorted(str(p) for p in Path(nvidia).glob("*/include")) if nvidia else []
    return {"CUDA_HOME": str(home), "ULTRA3_REAL_NVCC": str(real / "bin" / "nvcc"),
            "ULTRA3_CUDA_ARCHS": ",".join(archs), "CPATH": os.pathsep.join(headers),
            "TORCH_CUDA_ARCH_LIST": ";".join(f"{a[:-1]}.{a[-1]}" for a in archs),
            "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def built(folder: Path, name: str) -> Path | None:
    stem = name.replace("-", "_").lower()
    return next((w for w in folder.glob("*.whl") if w.name.lower().startswith(stem + "-")), None)


def target_of(python: str, archs: list[str]) -> dict:
    """What the built wheels are for: the box's torch and Python, and the GPU architectures."""
    probe = "import sys, torch; print(torch.__version__, '%d.%d' % sys.version_info[:2])"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise GatherError(f"--torch-python {python} cannot import torch: {last}")
    torch, version = out.stdout.split()
    return {"torch": torch, "python": version, "archs": archs}


def build_sdists(sdists: list[dict], downloads: Path, wheels: Path, build: Path, python: str, archs: list[str],
                 target: dict) -> list[Path]:
    stamp = build / "built-for.json"
    if stamp.is_file() and json.loads(stamp.read_text()) != target:  # another torch or --archs: build again
        for pin in sdists:
            if old := built(wheels, pin["name"]):
                old.unlink()
    stamp.write_text(json.dumps(target) + "\n")
    env = {**os.environ, **build_env(build, archs, python), "MAX_JOBS": str(os.cpu_count() or 2)}
    te_core = build / "te-core"  # transformer-engine-torch links the core library: on its path while it builds
    if not te_core.is_dir():
        cores = [str(w) for w in wheels.glob("transformer_engine*.whl") if "torch" not in w.name]
        run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(te_core), *cores], env)
    env["PYTHONPATH"] = str(te_core)
    for pin in sdists:
        if built(wheels, pin["name"]):
            continue
        source = download(pin, downloads)
        print(f"building {pin['name']} for sm_{', sm_'.join(archs)} ...", flush=True)
        log = build / f"{pin['name']}.log"
        with open(log, "w") as out:
            code = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                                   "-w", str(wheels), str(source)], env={**env, **pin.get("env", {})},
                                  stdout=out, stderr=subprocess.STDOUT).returncode
        if code != 0 or not built(wheels, pin["name"]):
            raise GatherError(f"building {pin['name']} failed (exit {code}); its log: {log}")
    return [built(wheels, pin["name"]) for pin in sdists]


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    code = subprocess.run(argv, env=env).returncode
    if code != 0:
        raise GatherError(f"{' '.join(argv[:4])} ... exited {code}")


def manifest(files: list[Path], target: dict, cuda: str) -> dict:
    listed = [{"file": w.name, "size": w.stat().st_size, "sha256": sha256(w)} for w in sorted(files)]
    return {**target, "cuda": cuda, "wheels": listed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--torch-python", required=True, help="a Python 3.12 with the box's torch, ninja, pybind11")
    parser.add_argument("--cuda", choices=("12", "13"), default="13", help="the box torch's CUDA major version")
    parser.add_argument("--archs", default="90", help="GPU architectures, comma-separated: 90 (Hopper), 100 (B200)")
    args = parser.parse_args()
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    downloads, wheels, build = args.out / "downloads", args.out / "wheels", args.out / "build"
    for folder in (downloads, wheels, build):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        target = target_of(args.torch_python, archs)
        wanted, sdists = pins(args.cuda)
        files = [wheels / pin["file"] for pin in wanted]
        for pin, path in zip(wanted, files):
            if not (path.is_file() and sha256(path) == pin["sha256"]):
                os.replace(download(pin, downloads), path)
        files += build_sdists(sdists, downloads, wheels, build, args.torch_python, archs, target)
        for old in wheels.glob("ultra3_launcher-*.whl"):  # always this checkout's
            old.unlink()
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(REPO)])
        info = manifest([*files, built(wheels, "ultra3-launcher")], target, args.cuda)
    except GatherError as e:
        print(f"gather: error: {e}", file=sys.stderr)
        return 2
    (args.out / "manifest.json").write_text(json.dumps(info, indent=1) + "\n")
    total = sum(w["size"] for w in info["wheels"])
    print(f"{len(info['wheels'])} wheels, {total / 2**20:.1f} MiB, for torch {info['torch']} on "
          f"sm_{', sm_'.join(archs)}: {args.out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
