"""The GPU box without network (scripts/gpu): the wheel pins against uv.lock, the nvcc that keeps one architecture,
carrying a wheel set in parts (damaged and missing parts, a resumed trip, a real pip install read back), the RL
source trees (pins, staged nested, first on PYTHONPATH), the preflight's kernel check, and the smoke-test figures
read from a real run's logs and from the RL runtime's step lines."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from recipes import preflight

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "scripts" / "gpu"
SMOKE_RUN = REPO / "benchmarks" / "gpu_smoke"


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


carry = load(GPU / "carry.py")
nvcc_archs = load(GPU / "nvcc_archs.py")
gpu_smoke = load(REPO / "benchmarks" / "gpu_smoke.py")


def version_of(file: str) -> str:
    return file.removesuffix(".tar.gz").rsplit("-", 1)[1] if file.endswith(".tar.gz") else file.split("-")[1]


def test_pins_are_whole_and_agree_with_uv_lock():
    pins = tomllib.loads((GPU / "wheels.toml").read_text())
    lock = {}
    for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]:
        lock.setdefault(package["name"], set()).add(package.get("version"))
    entries = pins["wheel"] + pins["sdist"]
    assert len({e["name"] for e in entries}) == len(entries)
    for entry in entries:
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), entry
        stem = entry["name"].replace("-", "_").lower()
        assert entry["file"].replace("-", "_").lower().startswith(stem + "_"), entry
        version = version_of(entry["file"])
        if entry["name"] in lock:
            assert version in lock[entry["name"]], (entry["name"], version, lock[entry["name"]])
    cores = {w.get("cuda") for w in pins["wheel"] if w["name"].startswith("transformer-engine-cu")}
    assert cores == {"12", "13"}
    te = {version_of(e["file"]) for e in entries if e["name"].startswith("transformer-engine")}
    assert te == {"2.18.0"}  # the Python side, the core library and the torch extension of one release


def test_nvcc_keeps_only_the_wanted_architectures(monkeypatch):
    monkeypatch.setattr(nvcc_archs, "KEEP", {"90"})
    argv = ["-O3", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
            "-gencode=arch=compute_100,code=sm_100", "--generate-code=arch=compute_90,code=[compute_90,sm_90]",
            "-c", "a.cu", "-o", "a.o"]
    assert nvcc_archs.filtered(argv) == ["-O3", "-gencode", "arch=compute_90,code=sm_90",
                                         "--generate-code=arch=compute_90,code=[compute_90,sm_90]", "-c", "a.cu",
                                         "-o", "a.o"]


def make_wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A real, installable wheel of one module `name` whose PAYLOAD holds `payload` (to make parts cut it)."""
    dist = f"{name}-1.0"
    files = {f"{name}.py": f"PAYLOAD = {payload!r}\n".encode(),
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        b"Tag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name_, data in {**files, f"{dist}.dist-info/RECORD": record.encode()}.items():
            z.writestr(name_, data)
    return path


@pytest.fixture
def gathered(tmp_path):
    """What gather.py leaves: wheels/ and manifest.json."""
    out = tmp_path / "gathered"
    (out / "wheels").mkdir(parents=True)
    wheels = [make_wheel(out / "wheels", "u3carry_a", bytes(range(256)) * 4000),
              make_wheel(out / "wheels", "u3carry_b", b"b" * 3000)]
    (out / "manifest.json").write_text(json.dumps({"torch": "2.11.0", "wheels": [
        {"file": w.name, "size": w.stat().st_size, "sha256": carry.sha256(w)} for w in wheels]}))
    return out


def test_carry_in_parts_over_trips_then_install(gathered, tmp_path):
    index = carry.pack(gathered, chunk_mib=1)
    parts = index["parts"]
    assert len(parts) >= 2 and all(p["size"] <= 1 << 20 for p in parts)
    assert sum(p["size"] for p in parts) == sum(w["size"] for w in index["manifest"]["wheels"])
    chunks, store = gathered / "chunks", tmp_path / "store"

    trip = tmp_path / "trip1"  # the first trip: the index and part 0, part 1 damaged on the way
    trip.mkdir()
    (trip / "chunks.json").write_bytes((chunks / "chunks.json").read_bytes())
    (trip / parts[0]["file"]).write_bytes((chunks / parts[0]["file"]).read_bytes())
    damaged = bytearray((chunks / parts[1]["file"]).read_bytes())
    damaged[100] ^= 1
    (trip / parts[1]["file"]).write_bytes(bytes(damaged))
    held, total, problems = carry.receive(trip, store)
    assert (held, total) == (1, len(parts))
    assert len(problems) == 1 and "is damaged" in problems[0] and parts[1]["file"] in problems[0]
    with pytest.raises(carry.CarryError, match=rf"{len(parts) - 1} of {len(parts)} parts not received yet"):
        carry.install(store, tmp_path / "site")

    held, total, problems = carry.receive(chunks, store)  # the rest, the index kept from the first trip
    assert (held, total, problems) == (len(parts), len(parts), [])
    site = tmp_path / "site"
    assert carry.install(store, site).startswith("installed 2 wheels")
    read = subprocess.run([sys.executable, "-c", "import u3carry_a, u3carry_b; "
                           "print(len(u3carry_a.PAYLOAD), u3carry_b.PAYLOAD[:3])"],
                          env={"PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert read.stdout.split() == ["1024000", "b'bbb'"]
    assert "installed already" in carry.install(store, site)


def test_carry_refuses_another_sets_store_and_a_changed_wheel(gathered, tmp_path):
    carry.pack(gathered, chunk_mib=1)
    store = tmp_path / "store"
    carry.receive(gathered / "chunks", store)
    other = json.loads((gathered / "chunks" / "chunks.json").read_text())
    other["parts"][0]["sha256"] = "0" * 64
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "chunks.json").write_text(json.dumps(other))
    with pytest.raises(carry.CarryError, match="holds the parts of another wheel set"):
        carry.receive(tmp_path / "other", store)
    wheel = next((gathered / "wheels").glob("u3carry_b*"))
    wheel.write_bytes(wheel.read_bytes() + b"x")
    with pytest.raises(carry.CarryError, match="changed since gather wrote the manifest"):
        carry.pack(gathered, chunk_mib=1)


def test_carry_cli_says_what_is_missing_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(GPU / "carry.py"), "receive", str(tmp_path), "--store",
                          str(tmp_path / "s")], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"carry: error: no chunks.json in {tmp_path} or {tmp_path / 's'}: "
                                                "carry it with the first part"]


def kernel_cfg(stage="pretrain", **model):
    return {"job": {"stage": stage}, "model": model, "dataset": {"mock": False}}


def test_kernels_names_each_setting_whose_kernel_is_missing(monkeypatch):
    installed = {"megatron.bridge"}  # the training stack without the kernels
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    problems = preflight.kernels(kernel_cfg())  # the Ultra recipe's values
    py = sys.executable
    assert problems == "; ".join([
        f"model.moe_token_dispatcher_type=flex needs DeepEP/HybridEP (module deep_ep), not installed in {py}; "
        "set model.moe_token_dispatcher_type=alltoall, or install it",
        "model.gradient_accumulation_fusion=true needs APEX's CUDA extensions (module "
        f"fused_weight_gradient_mlp_cuda), not installed in {py}; set model.gradient_accumulation_fusion=false, or "
        "install it",
        f"model.use_mamba_mem_eff_path=true needs causal-conv1d's CUDA extension (module causal_conv1d_cuda), not "
        f"installed in {py}; set model.use_mamba_mem_eff_path=false (pretraining only), or install it"])
    tiny = {"moe_token_dispatcher_type": "alltoall", "gradient_accumulation_fusion": False}
    assert preflight.kernels(kernel_cfg(**tiny, use_mamba_mem_eff_path=False)) is None
    assert preflight.kernels(kernel_cfg("sft", **tiny, use_mamba_mem_eff_path=False)).startswith(
        "model.use_mamba_mem_eff_path=false cannot train packed sequences")


def test_kernels_finds_an_installed_extension(tmp_path, monkeypatch):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "megatron.bridge" else
                        find(name, *a))
    tiny = {"moe_token_dispatcher_type": "alltoall", "gradient_accumulation_fusion": False}
    assert preflight.kernels(kernel_cfg("sft", **tiny)).startswith("model.use_mamba_mem_eff_path=true needs causal")
    (tmp_path / "causal_conv1d_cuda.py").write_text("")  # a real module file the import system finds
    monkeypatch.syspath_prepend(str(tmp_path))
    assert preflight.kernels(kernel_cfg("sft", **tiny)) is None
    assert "kernels" in preflight.BY_LAUNCH["torchrun"]


def test_kernels_leaves_a_missing_training_stack_to_training_packages(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert preflight.kernels(kernel_cfg()) is None


def test_smoke_figures_from_the_recorded_h200_run():
    """benchmarks/gpu_smoke holds the logs of a real run; the parser reads its losses, checkpoints and memory."""
    pretrain = gpu_smoke.parse((SMOKE_RUN / "pretrain.log").read_text())
    assert [it["iteration"] for it in pretrain["iterations"]] == list(range(1, 41))
    losses = [it["lm loss"] for it in pretrain["iterations"]]
    assert losses[0] > 8 > 6.5 > losses[-1]
    assert [s["iteration"] for s in pretrain["saved"]] == [20, 40]
    assert pretrain["memory_gb"]["mem-max-allocated-gigabytes"] > 0
    resume = gpu_smoke.parse((SMOKE_RUN / "resume.log").read_text())
    assert [(s["iteration"], s["dir"]) for s in resume["loaded"]] == [(40, pretrain["saved"][-1]["dir"])]
    assert resume["iterations"][0]["iteration"] == 41 and [s["iteration"] for s in resume["saved"]] == [60]
    summary = gpu_smoke.summary(pretrain, 512)
    assert summary["iterations"] == "1-40" and summary["first_loss"] == losses[0]
    assert summary["tokens_per_s"] == pytest.approx(4 * 512 / (summary["step_ms"] / 1000))
    assert gpu_smoke.peak_mib(SMOKE_RUN / "pretrain.memory.csv") > 1000
    assert pretrain["autotuned_kernels"] == 22 and 0 < pretrain["autotune_s"] < summary["first_iteration_s"]
    sft = gpu_smoke.parse((SMOKE_RUN / "sft.log").read_text())
    assert [s["dir"] for s in sft["loaded"]] == [pretrain["saved"][-1]["dir"]]
    assert [it["iteration"] for it in sft["iterations"]] == list(range(1, 41)) and sft["saved"][-1]["iteration"] == 40
    quantized = gpu_smoke.parse((SMOKE_RUN / "quantize.log").read_text())["quantized"]
    report = json.loads((SMOKE_RUN / "quantization_report.json").read_text())
    assert quantized["bits_per_element"] == pytest.approx(report["bits_per_element"], abs=1e-3)
    assert quantized["relative_logit_error"] == pytest.approx(report["accuracy"]["relative_logit_error"], abs=1e-4)
    assert report["megatron_checkpoint"] == sft["saved"][-1]["dir"] and report["device"] == "cuda"


def test_smoke_table_in_the_readme_is_what_the_script_prints(tmp_path):
    for f in SMOKE_RUN.iterdir():
        if f.suffix in (".log", ".csv", ".json"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_smoke.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = ("step ", "pretrain ", "resume ", "sft ", "quantize ")
    table = [line for line in out.splitlines() if line.startswith(rows)]
    readme = (SMOKE_RUN / "README.md").read_text()
    assert len(table) == 5 and all(line in readme for line in table), table


def test_rl_pins_are_whole_commits_and_exact_versions():
    pins = tomllib.loads((GPU / "rl.toml").read_text())
    record = json.loads((REPO / "src" / "ultra3" / "nemo_rl_api" / "record.json").read_text())
    trees = {t["name"]: t for t in pins["source"]}
    assert set(trees) == {"nemo-rl", "megatron-bridge", "megatron-lm", "nemo-gym"}
    assert all(re.fullmatch(r"[0-9a-f]{40}", t["commit"]) for t in trees.values())
    assert trees["nemo-rl"]["commit"] == record["commit"]
    intos = [t["into"] for t in pins["source"]]
    assert all(any(into.startswith(parent + "/") for parent in intos[:i]) for i, into in enumerate(intos) if i)
    assert pins["pythonpath"][0] == trees["megatron-lm"]["into"]  # ahead of the wheel set's megatron-core 0.19.2
    assert all(any(p == i or p.startswith(i + "/") for i in intos) for p in pins["pythonpath"])
    assert all(re.fullmatch(r"\d+(\.\d+)+", w["version"]) for w in pins["wheel"])
    assert len({w["name"] for w in pins["wheel"]}) == len(pins["wheel"])


def github_archive(folder: Path, repo: str, commit: str, files: dict[str, str]) -> None:
    """A tarball laid out as GitHub's archive of a commit: one top folder <name>-<commit>/."""
    top = folder / f"{repo.split('/')[1]}-{commit}"
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    subprocess.run(["tar", "-czf", str(folder / f"{commit}.tar.gz"), "-C", str(folder), top.name], check=True)


def test_rl_sources_fetched_staged_nested_and_first_on_the_path(tmp_path):
    pins = tomllib.loads((GPU / "rl.toml").read_text())
    served = tmp_path / "github"
    served.mkdir()
    modules = {"megatron-lm": "megatron/core/__init__.py", "megatron-bridge": "src/megatron/bridge/__init__.py",
               "nemo-rl": "nemo_rl/__init__.py", "nemo-gym": "nemo_gym/__init__.py"}  # `megatron`: a namespace
    for tree in pins["source"]:
        module = modules[tree["name"]]
        github_archive(served, tree["repo"], tree["commit"], {module: f"WHERE = {tree['name']!r}\n"})
    index = carry.fetch_sources(tmp_path / "out", pins, url=f"file://{served}/{{commit}}.tar.gz")
    assert [t["sha256"] for t in index["sources"]] == [carry.sha256(served / f"{t['commit']}.tar.gz")
                                                     for t in pins["source"]]
    root = tmp_path / "rl"
    assert carry.stage_sources(tmp_path / "out", root) == f"staged 4 source trees in {root}"
    assert (root / "RL/3rdparty/Gym-workspace/Gym/nemo_gym/__init__.py").is_file()
    assert "staged already" in carry.stage_sources(tmp_path / "out", root)
    site = tmp_path / "site" / "megatron" / "core"  # the wheel set's older megatron-core
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("WHERE = 'wheel set'\n")
    path = subprocess.run([sys.executable, str(GPU / "carry.py"), "rl-path", str(root)], capture_output=True,
                          text=True, check=True).stdout.strip()
    read = subprocess.run([sys.executable, "-c", "import megatron.core, megatron.bridge, nemo_rl, nemo_gym; "
                           "print(megatron.core.WHERE, megatron.bridge.WHERE, nemo_rl.WHERE, nemo_gym.WHERE)"],
                          env={"PYTHONPATH": f"{path}:{tmp_path / 'site'}"}, capture_output=True, text=True,
                          check=True)
    assert read.stdout.split() == ["megatron-lm", "megatron-bridge", "nemo-rl", "nemo-gym"]


def test_rl_stage_refuses_a_damaged_tree_and_rl_path_an_unstaged_root(tmp_path):
    served = tmp_path / "github"
    served.mkdir()
    github_archive(served, "NVIDIA-NeMo/RL", "a" * 40, {"nemo_rl.py": ""})
    pins = {"pythonpath": ["RL"], "source": [{"name": "nemo-rl", "repo": "NVIDIA-NeMo/RL", "commit": "a" * 40,
                                              "into": "RL"}]}
    carry.fetch_sources(tmp_path / "out", pins, url=f"file://{served}/{{commit}}.tar.gz")
    archive = tmp_path / "out" / f"nemo-rl-{'a' * 40}.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"x")
    with pytest.raises(carry.CarryError, match="is missing or damaged"):
        carry.stage_sources(tmp_path / "out", tmp_path / "rl")
    assert not (tmp_path / "rl").exists()
    out = subprocess.run([sys.executable, str(GPU / "carry.py"), "rl-path", str(tmp_path / "rl")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"carry: error: no sources.json in {tmp_path / 'rl'}: stage the RL source trees there first "
        "(carry.py rl-stage)"]


def test_smoke_rl_rows_from_the_rl_runtimes_log(tmp_path):
    """rl.log as the rl step keeps it: NeMo RL's printout (a recorded step log) passed through the RL runtime,
    which adds its `rl: step` line after each step's block."""
    nemo_rl_output = REPO / "tests" / "data" / "nemo_rl" / "grpo_steps.log"
    with open(tmp_path / "rl.log", "w") as log:
        subprocess.run([sys.executable, "-c", "import sys; from recipes import rl; "
                        "sys.exit(rl.run_nemo_rl(['cat', sys.argv[1]], '.', {}))", str(nemo_rl_output)],
                       cwd=REPO, stdout=log, check=True)
    (tmp_path / "rl.memory.csv").write_text("1200\n30500\n28000\n")
    (tmp_path / "versions.json").write_text(json.dumps({"gpu": "NVIDIA H200", "packages": {"ray": "2.56.1"}}))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_smoke.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "GPU: NVIDIA H200; ray 2.56.1"
    table = lines[lines.index("rl step  reward        kl     loss  step s generation s training s"):]
    assert table[1:5] == ["  1/3    0.2500  0.000400   0.0123    41.2        12.31       9.87",
                          "  2/3    0.0000  0.000300  -0.0104    18.4         7.50       4.12",
                          "  3/3    0.5000  0.000200   0.0051    25.0         7.01       4.40",
                          "rl: 3 GRPO step(s), GPU peak 30,500 MiB"]
    rl = json.loads((tmp_path / "results.json").read_text())["rl"]
    assert [s["kl"] for s in rl["steps"]] == [0.0004, 0.0003, 0.0002] and rl["gpu_peak_mib"] == 30500
