"""The compile cache of training and RL jobs: the keyed directory a job takes (recipes/compile_cache.py) and the
variables its processes inherit, what the dry run says of it (ultra3.compile_cache), the profile key, and the
autotune results Triton does not keep, recorded and pinned (recipes/training/tune_cache.py) on real Triton
Autotuner objects where triton is installed, else on a stand-in with the attributes Triton 3.6's Autotuner has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipes import compile_cache
from recipes.training import tune_cache
from test_container import built, profiles  # noqa: F401, F811 (a fixture)
from ultra3 import images

VERSIONS = {"torch": "2.11.0", "triton": "3.6.0", "transformer-engine": "2.18.0", "mamba-ssm": "2.3.2.post1",
            "causal-conv1d": "1.7.0", "megatron-core": "0.19.2"}


def test_key_follows_every_version_and_the_image():
    key = compile_cache.key(None, VERSIONS)
    assert key == compile_cache.key(None, dict(reversed(VERSIONS.items()))) and key.startswith("pkgs-")
    for name in VERSIONS:
        assert compile_cache.key(None, {**VERSIONS, name: "0"}) != key, name
    assert compile_cache.key("ab" * 32, VERSIONS) == "image-" + "ab" * 8


def test_settle_exports_the_keyed_dir_cold_then_warm(tmp_path):
    cfg = {"job": {"compile_cache": {"root": str(tmp_path)}}}
    env = {"TORCHINDUCTOR_CACHE_DIR": "/mine"}  # a variable run.env set keeps its value
    said = compile_cache.settle(cfg, env, arch="sm_90")
    folder = tmp_path / "sm_90" / compile_cache.key(None, compile_cache.versions())
    assert said == f"compile cache: {folder} (cold: this job fills it)" and folder.is_dir()
    assert env == {"ULTRA3_COMPILE_CACHE": str(folder), "TRITON_CACHE_DIR": f"{folder}/triton",
                   "TRITON_CACHE_AUTOTUNING": "1", "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    (folder / "triton").mkdir()
    (folder / "tune.json").write_text("{}")
    assert compile_cache.settle(cfg, {}, arch="sm_90").endswith("(warm, with recorded tunings)")
    assert compile_cache.settle(cfg, {}, arch="sm_100").endswith("(cold: this job fills it)")
    assert compile_cache.settle({"job": {"compile_cache": None}}, env, arch="sm_90") is None


def cache_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("compile cache:"))


def test_dry_run_names_the_root_and_what_is_there(cli_here, home):
    r = cli_here("pretrain", "-c", "tiny", "--run", "workstation", "--dry-run")
    assert r.rc == 0, r.err
    root = home / "nemorun" / "compile-cache"
    assert "run.compile_cache" in r.out and str(root) in r.out
    assert cache_line(r.out) == (f"compile cache: {root}/sm_90/<key of the job's package versions> (warm or cold is "
                                 "known when the job runs; none for sm_90 yet: cold)")
    (root / "sm_90" / "pkgs-0123456789abcdef").mkdir(parents=True)
    r = cli_here("sft", "-c", "tiny", "--run", "workstation", "--dry-run", "--full")
    assert "1 keyed for sm_90 there: pkgs-0123456789abcdef)" in cache_line(r.out)
    assert f"compile_cache:\n    root: {root}\n" in r.out  # what the job reads
    off = cli_here("pretrain", "-c", "tiny", "--run", "workstation", "--dry-run", "run.compile_cache=")
    assert cache_line(off.out).startswith("compile cache: off")
    prep = cli_here("data", "prep", "pretrain", "-c", "tiny", "--dry-run")
    assert prep.rc == 0 and "compile cache" not in prep.out


def test_dry_run_knows_the_key_of_a_built_image_and_if_it_is_warm(cli_here, profiles, home):  # noqa: F811
    image = images.kind_image("training", {}, str(profiles), "b200")
    built(image)
    folder = home / "nemorun" / "compile-cache" / "sm_100" / f"image-{image.digest[:16]}"
    r = cli_here("pretrain", "-c", "tiny", "--batch", "plain", "--dry-run")
    assert cache_line(r.out) == f"compile cache: {folder} (cold: the first job with this image fills it)", r.out
    (folder / "triton").mkdir(parents=True)
    r = cli_here("pretrain", "-c", "tiny", "--batch", "plain", "--dry-run")
    assert cache_line(r.out) == f"compile cache: {folder} (warm)"


@pytest.mark.parametrize("value,message", [
    ('"relative/dir"', "'relative/dir' is relative (set in profile 'workstation' (env.toml)); give an absolute path"),
    ("3", "env.toml [workstation] compile_cache: must be a string, got 3"),
])
def test_a_bad_profile_key_is_one_line(cli_here, value, message):
    Path("env.toml").write_text(Path("env.toml").read_text() + f"compile_cache = {value}\n")
    r = cli_here("pretrain", "-c", "tiny", "--run", "workstation", "--dry-run")
    assert r.rc == 2 and len(r.err_lines) == 1 and message in r.err, r.err
    assert "Traceback" not in r.err


def test_nvidias_persistent_cache_holds_the_compile_cache(cli_here):
    Path("env.toml").write_text(Path("env.toml").read_text() + 'persistent_cache = "/lustre/cache"\n')
    r = cli_here("pretrain", "-c", "tiny", "--run", "workstation", "--dry-run")
    assert r.rc == 0, r.err
    assert "run.compile_cache" in r.out and "= /lustre/cache/compile" in r.out
    assert cache_line(r.out).startswith("compile cache: /lustre/cache/compile/sm_90/")


# -- the autotune results Triton does not keep ------------------------------------------------------------

class StandInConfig:  # the attributes of triton.Config that tune_cache reads
    def __init__(self, kwargs, num_warps=4, num_stages=3, pre_hook=None):
        self.kwargs, self.num_warps, self.num_stages, self.pre_hook = kwargs, num_warps, num_stages, pre_hook

    def all_kwargs(self):
        return {**self.kwargs, "num_warps": self.num_warps, "num_ctas": 1, "num_stages": self.num_stages}


class StandInAutotuner:  # triton.runtime.autotuner.Autotuner's configs, cache, base_fn, cache_results
    def __init__(self, fn, configs, cache_results=True):
        self.base_fn, self.configs, self.cache, self.cache_results = fn, configs, {}, cache_results


def _zero(nargs):  # a config pre_hook, as mamba-ssm's SSD backward kernels have (they zero an output)
    pass


def standin_kernels() -> dict:
    def _bwd_kernel():
        pass

    def _fwd_kernel():
        pass

    hooked = [StandInConfig({"BLOCK": b}, pre_hook=_zero) for b in (32, 64)]
    plain = [StandInConfig({"BLOCK": b}) for b in (32, 64)]
    tuners = [StandInAutotuner(_bwd_kernel, hooked), StandInAutotuner(_fwd_kernel, plain)]
    return {tune_cache.name(t): t for t in tuners}


def triton_kernels() -> dict:
    pytest.importorskip("triton")
    sys.path.insert(0, str(Path(__file__).parent / "data"))
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"  # as the job sets it: read as each autotuned kernel is defined
    try:
        import triton_kernels as module  # real @triton.autotune'd kernels; jit needs them in a file
    finally:
        sys.path.pop(0)
        del os.environ["TRITON_CACHE_AUTOTUNING"]
    found = tune_cache.autotuners({"triton_kernels": module})
    for tuner in found.values():
        tuner.cache.clear()
    return found


@pytest.mark.parametrize("kernels", [standin_kernels, triton_kernels], ids=["stand-in", "triton"])
def test_record_then_pin_only_where_everything_matches(tmp_path, kernels):
    first = kernels()
    bwd, fwd = (next(t for n, t in first.items() if n.endswith(k)) for k in ("_bwd_kernel", "_fwd_kernel"))
    key = (128, 24, True, "torch.bfloat16")
    bwd.cache[key] = bwd.configs[1]  # what benchmarking picked in the first job
    fwd.cache[key] = fwd.configs[1]  # Triton keeps this one itself (no pre_hook, TRITON_CACHE_AUTOTUNING=1)
    path = str(tmp_path / "tune.json")
    assert tune_cache.record(path, "sm_90", first) == 1
    assert tune_cache.record(path, "sm_90", first) == 0  # nothing new: the file is not written again
    saved = json.loads(Path(path).read_text())
    assert saved["arch"] == "sm_90" and list(saved["kernels"]) == [tune_cache.name(bwd)]
    assert saved["kernels"][tune_cache.name(bwd)] == [{"key": list(key), "config": bwd.configs[1].all_kwargs()}]

    later = kernels()  # a later job: the same kernels, nothing tuned yet
    lbwd = next(t for n, t in later.items() if n.endswith("_bwd_kernel"))
    assert tune_cache.pin(path, "sm_100", later) == 0 and lbwd.cache == {}  # another GPU: ignored
    assert tune_cache.pin(path, "sm_90", later) == 1
    assert lbwd.cache == {key: lbwd.configs[1]} and lbwd.cache[key] is lbwd.configs[1]  # its own config, its hook
    assert (128, 48, True, "torch.bfloat16") not in lbwd.cache  # other shapes are left to Triton

    changed = json.loads(Path(path).read_text())  # a record whose config the kernel no longer has
    changed["kernels"][tune_cache.name(bwd)][0]["config"]["BLOCK"] = 4096
    Path(path).write_text(json.dumps(changed))
    assert tune_cache.pin(path, "sm_90", kernels()) == 0
    Path(path).write_text("{not json")
    assert tune_cache.pin(path, "sm_90", kernels()) == 0


def test_recorder_records_after_the_first_step_and_pins_in_the_next_job(tmp_path, monkeypatch):
    tuners = standin_kernels()
    monkeypatch.setattr(tune_cache, "autotuners", lambda: tuners)
    job1 = tune_cache.Recorder(str(tmp_path), "sm_90", say=True)
    job1.start()
    bwd = next(t for n, t in tuners.items() if n.endswith("_bwd_kernel"))
    bwd.cache[(1, "torch.float32")] = bwd.configs[0]  # tuned during step 1
    job1.step_end()
    assert os.path.isfile(tmp_path / "tune.json")
    bwd.cache.clear()
    job2 = tune_cache.Recorder(str(tmp_path), "sm_90", say=False)
    job2.start()
    assert bwd.cache == {(1, "torch.float32"): bwd.configs[0]}


def test_smoke_figures_put_the_second_run_beside_the_first(tmp_path):
    """benchmarks/gpu_smoke.py on the recorded H200 pretrain log and a second run made from it as the cached job
    would log it: no Triton autotuning, the pins, a short first iteration, one loss off by 0.0002."""
    recorded = (Path(__file__).parents[1] / "benchmarks" / "gpu_smoke" / "pretrain.log").read_text()
    (tmp_path / "pretrain.log").write_text(recorded)
    again = [line for line in recorded.splitlines() if "autotun" not in line.lower() and
             not line.startswith(("with key as", "finished after", "best config"))]
    again = [line.replace("elapsed time per iteration (ms): 87356.3", "elapsed time per iteration (ms): 6100.0")
             .replace("lm loss: 8.334375E+00", "lm loss: 8.334575E+00") for line in again]
    again[:0] = ["compile cache: /tmp/c/sm_90/pkgs-0123456789abcdef (warm, with recorded tunings)",
                 "ultra3: pinned 8 recorded autotune result(s) for sm_90 from /tmp/c/tune.json"]
    (tmp_path / "pretrain.again.log").write_text("\n".join(again))
    out = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "gpu_smoke.py"),
                          str(tmp_path)], capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("pretrain ") and "warm" in line)
    assert row.split() == ["pretrain", "warm", "6.1", "87.4", "0.0", "78.3", "8", "0.00020"]
    saved = json.loads((tmp_path / "results.json").read_text())["again"]["summary"]["pretrain"]
    assert saved["pinned"] == 8 and saved["first_run_autotune_s"] == 78.27


def test_smoke_script_has_the_eval_and_again_steps(tmp_path):
    script = Path(__file__).parents[1] / "scripts" / "gpu" / "smoke.sh"
    r = subprocess.run(["bash", str(script), str(tmp_path), "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown step bogus" in r.stderr
    steps = r.stderr.split("(", 1)[1]
    assert "eval" in steps and "again" in steps
