"""The contract between the launcher and the job runtime (recipes/contract.py), through real files and
processes: the artifact store (publish, versions, latest, references; concurrent publishers), a job's
record of its outputs; `python -m recipes.launch` publishing a real data-prep run's declared output,
refusing to publish a missing one, passing signals on to its child; and the preflight's `inputs` check."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import stage_config
from recipes import contract, preflight, publish
from ultra3 import contract as launcher_contract

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_", "PYTHONPATH"))},
       "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def manifest(name: str, **kw) -> dict:
    return {"format": contract.ARTIFACT_FORMAT, "name": name, "type": "pretrain-data", "path": "/data/x", **kw}


def test_the_launcher_reads_the_runtimes_own_definitions():
    for name in ("INPUT_ERROR_EXIT", "PREFLIGHT_EXIT", "PREFLIGHT_MARK", "CONFIG_FILE", "ENTRY_MODULE",
                 "HEAD_NODE_VAR", "NVFP4_CAPABILITIES"):
        assert getattr(launcher_contract, name) == getattr(contract, name)
    assert launcher_contract.pad_seq_to_mult(2, 8, True) == contract.pad_seq_to_mult(2, 8, True) == 16
    assert contract.pad_seq_to_mult(4, 1, True) == 4 and contract.pad_seq_to_mult(4, 2, False) == 4
    assert [contract.trains_nvfp4(c) for c in ((9, 0), (10, 0), (10, 3), (12, 0))] == [False, True, True, False]


def test_publish_versions_latest_and_references_round_trip(tmp_path):
    root = str(tmp_path / "store")
    first = contract.publish(root, manifest("data-tiny", created_ts=1.0))
    second = contract.publish(root, manifest("data-tiny", created_ts=2.0))
    other = contract.publish(root, manifest("ckpt-tiny", created_ts=3.0))
    assert (first["version"], second["version"], other["version"]) == (1, 2, 1)
    assert sorted(contract.versions(os.path.join(root, "data-tiny"))) == [1, 2]
    assert (tmp_path / "store" / "data-tiny" / "latest").read_text().strip() == "2"
    line = (tmp_path / "store" / "data-tiny" / "v1" / "manifest.json").read_text()
    assert line.count("\n") == 1 and json.loads(line) == first  # one JSON object on one line
    assert contract.resolve_ref(root, "data-tiny:latest") == second
    assert contract.resolve_ref(root, "data-tiny:v1") == first == contract.resolve_ref(root, "data-tiny:1")
    assert contract.resolve_ref(root, "data-tiny:v3") is None
    assert contract.resolve_ref(root, "nothing:latest") is None
    assert contract.resolve_ref(root, "../x:latest") is None
    assert [(m["name"], m["version"]) for m in contract.read_store(root)] == \
        [("ckpt-tiny", 1), ("data-tiny", 2), ("data-tiny", 1)]  # newest first
    with pytest.raises(ValueError):
        contract.publish(root, manifest("../escape"))


def _publish_many(root: str, start, count: int, queue) -> None:
    start.wait()
    queue.put([contract.publish(root, manifest("shared", created_ts=time.time()))["version"] for _ in range(count)])


@pytest.mark.heavy
def test_concurrent_publishers_get_distinct_versions_and_latest_ends_at_the_highest(tmp_path):
    root, procs, each = str(tmp_path / "store"), 4, 25
    ctx = multiprocessing.get_context("spawn")  # no fork of pytest's threads
    start, queue = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_publish_many, args=(root, start, each, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    start.set()
    got = [v for _ in workers for v in queue.get(timeout=120)]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert sorted(got) == list(range(1, procs * each + 1))  # every publish its own version
    folder = tmp_path / "store" / "shared"
    assert (folder / "latest").read_text().strip() == str(procs * each)
    assert all(json.loads((folder / f"v{v}" / "manifest.json").read_text())["version"] == v for v in got)
    assert not [p for p in folder.rglob("*") if ".tmp-" in p.name]


def test_record_outputs_publishes_and_writes_the_jobs_outputs_json(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "blend.json").write_text("{}")
    (out / "manifest.json").write_text(json.dumps({"totals": {"tokens": 1234}}))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    cfg = {"sample": 50, "job": {
        "id": "job-1", "stage": "data prep pretrain", "config": "tiny", "profile": "ci", "digest": "abc",
        "dir": str(job_dir), "artifacts_root": str(tmp_path / "store"),
        "produces": [{"name": "pretrain-data-tiny", "kind": "pretrain-data", "path": str(out / "blend.json")}],
        "inputs": [{"name": "corpus", "key": "x", "path": "/in", "producer": None, "artifact": None}]}}
    published = publish.record_outputs(cfg, 12.34)
    assert [(m["name"], m["version"], m["type"], m["producer"]) for m in published] == \
        [("pretrain-data-tiny", 1, "pretrain-data", "job-1")]
    assert published[0]["seconds"] == 12.3 and published[0]["metadata"]["tokens"] == 1234
    assert published[0]["inputs"] == [{"name": "corpus", "key": "x", "path": "/in", "producer": None, "artifact": None}]
    assert json.loads((job_dir / contract.JOB_OUTPUTS).read_text()) == published
    assert contract.resolve_ref(str(tmp_path / "store"), "pretrain-data-tiny:latest") == published[0]


# ---- recipes.launch, run as a job runs it ---------------------------------------------------------------

def code_dir(tmp: Path, job: dict, **cfg) -> Path:
    """A job's code dir: its config.yaml and a copy of recipes/, as the launcher writes them."""
    code = tmp / "job" / "code"
    shutil.copytree(REPO / "recipes", code / "recipes", ignore=shutil.ignore_patterns("__pycache__", "tiny"))
    config = {"run": {"nodes": 1, "gpus_per_node": 0},
              "job": {"id": "job-1", "stage": "data prep pretrain", "config": "tiny", "dir": str(tmp / "job"),
                      "launch": "ray", **job}, **cfg}
    (code / contract.CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
    return code


def launch(code: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", contract.ENTRY_MODULE, "--config", contract.CONFIG_FILE], cwd=code,
                          env=ENV, capture_output=True, text=True, timeout=timeout)


DATA_PREP = {"recipe": "recipes.data_prep_pretrain",
             "checks": ["python_version", "data_prep_packages", "data_prep_inputs"]}


@pytest.fixture(scope="module")
def data_prep_job(tmp_path_factory):
    """The tiny pretraining data prep (a 50-record sample) run through recipes.launch with a declared output."""
    pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("launch")
    out = tmp / "out"
    produces = [{"name": "pretrain-data-tiny-sample-50", "kind": "pretrain-data",
                 "path": str(out / "sample-50" / "blend.json")}]
    settings = {**stage_config("data_prep/pretrain"), "tokenizer": str(TINY), "output_dir": str(out), "num_shards": 2,
                "datasets": [{"name": "stories", "path": str(TINY / "corpus.jsonl.gz")}], "sample": 50,
                "object_store_mb": 100}
    code = code_dir(tmp, {**DATA_PREP, "artifacts_root": str(tmp / "store"), "produces": produces}, **settings)
    return tmp, settings, launch(code)


@pytest.mark.heavy
def test_launch_publishes_the_declared_output_of_a_real_run(data_prep_job):
    tmp, _, p = data_prep_job
    assert p.returncode == 0, p.stdout + p.stderr
    blend = tmp / "out" / "sample-50" / "blend.json"
    assert p.stdout.splitlines()[-1] == f"published pretrain-data-tiny-sample-50:v1 -> {blend}"
    assert "+ " + sys.executable + " -m recipes.data_prep_pretrain --config config.yaml" in p.stdout
    store = str(tmp / "store")
    published = contract.resolve_ref(store, "pretrain-data-tiny-sample-50:latest")
    assert published["path"] == str(blend) and published["producer"] == "job-1" and published["sample"] == 50
    assert published["metadata"]["tokens"] > 0
    assert json.loads((tmp / "job" / contract.JOB_OUTPUTS).read_text()) == [published]


@pytest.mark.heavy
def test_launch_refuses_to_publish_a_missing_output(data_prep_job, tmp_path):
    tmp, settings, _ = data_prep_job  # its shards are done: this run reuses them without starting Ray
    missing = tmp / "out" / "sample-50" / "nothing.json"
    produces = [{"name": "pretrain-data-tiny-sample-50", "kind": "pretrain-data",
                 "path": str(tmp / "out" / "sample-50" / "blend.json")},
                {"name": "other-tiny", "kind": "other", "path": str(missing)}]
    code = code_dir(tmp_path, {**DATA_PREP, "artifacts_root": str(tmp_path / "store"), "produces": produces},
                    **settings)
    p = launch(code)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.splitlines() == [f"data prep pretrain: error: the job ended without its other output at {missing}"]
    assert contract.INPUT_ERROR.match(p.stderr)
    assert "published" not in p.stdout
    assert not (tmp_path / "store").exists() and not (tmp_path / "job" / contract.JOB_OUTPUTS).exists()


@pytest.mark.heavy
def test_launch_without_declared_outputs_publishes_and_writes_nothing(data_prep_job, tmp_path):
    tmp, settings, _ = data_prep_job
    p = launch(code_dir(tmp_path, DATA_PREP, **settings))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "published" not in p.stdout
    # the ledger of its one attempt and the finished marker (recipes/attempts.py): no artifact record
    assert sorted(os.listdir(tmp_path / "job")) == [contract.ATTEMPTS_FILE, "code", contract.FINISHED_FILE]


SLEEPER = '''import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (open("got", "w").write("TERM"), sys.exit(7)))
open("ready", "w").write("ready")
time.sleep(60)
'''


@pytest.mark.heavy
def test_launch_passes_sigterm_on_to_its_child_and_returns_its_exit_code(tmp_path):
    code = code_dir(tmp_path, {"recipe": "fake.sleeper", "checks": ["python_version"]})
    (code / "fake").mkdir()
    (code / "fake" / "__init__.py").write_text("")
    (code / "fake" / "sleeper.py").write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", contract.ENTRY_MODULE, "--config", contract.CONFIG_FILE],
                            cwd=code, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 60
    while not (code / "ready").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # to the launcher only, not its process group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, out + err
    assert (code / "got").read_text() == "TERM"


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


@pytest.mark.heavy
def test_a_ray_node_stopped_as_soon_as_it_starts_leaves_no_process_behind(tmp_path, monkeypatch):
    # what a worker node does when the job's driver ends while its `ray start` is still starting
    from recipes import ray_nodes

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    temp = tempfile.mkdtemp(prefix="ray-t-", dir="/tmp")  # Ray's socket paths must stay short
    try:
        node = ray_nodes._ray_start({"job": {}}, "127.0.0.1", temp, "--head",
                                    f"--port={ray_nodes.free_port('127.0.0.1')}", "--include-dashboard=false",
                                    "--num-cpus=1")
        ray_nodes.stop_ray(node, temp)
        assert node.returncode is not None
        assert os.path.exists(os.path.join(temp, "ray_current_cluster"))  # stopped once fully started
        time.sleep(1)
        assert not processes_mentioning(temp), processes_mentioning(temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


RANK_FILE = '''import os, sys
open(f"rank{os.environ['RANK']}-of-{os.environ['WORLD_SIZE']}", "w").write(" ".join(sys.argv[1:]))
'''


@pytest.mark.heavy
def test_torchrun_runs_the_recipe_module_on_every_rank(tmp_path):
    pytest.importorskip("torch")
    code = code_dir(tmp_path, {"recipe": "fake.ranks", "checks": ["python_version"], "launch": "torchrun"})
    config = yaml.safe_load((code / contract.CONFIG_FILE).read_text())
    config["run"]["gpus_per_node"] = 2  # two ranks (no GPU needed: the module only writes a file)
    (code / contract.CONFIG_FILE).write_text(yaml.safe_dump(config))
    (code / "fake").mkdir()
    (code / "fake" / "__init__.py").write_text("")
    (code / "fake" / "ranks.py").write_text(RANK_FILE)
    p = launch(code, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "-m torch.distributed.run --nproc-per-node=2 --standalone --module fake.ranks --config config.yaml" \
        in p.stdout
    assert [(code / f"rank{r}-of-2").read_text() for r in (0, 1)] == ["--config config.yaml"] * 2


# ---- the preflight's inputs check ---------------------------------------------------------------------

def inputs_cfg(*inputs: dict, checks=("inputs",)) -> dict:
    return {"job": {"checks": list(checks), "inputs": list(inputs)}}


def an_input(**kw) -> dict:
    return {"name": "data", "key": "dataset.blend_path", "kinds": ["pretrain-data"], "required": True, "path": None,
            "producer": None, "artifact": None, "hint": "ultra3 data prep pretrain --batch ci", **kw}


def test_a_required_input_not_set_names_its_key_and_the_command_that_makes_it():
    assert preflight.run(inputs_cfg(an_input())) == [
        "dataset.blend_path is not set: this stage needs its data input (pretrain-data); "
        "run `ultra3 data prep pretrain --batch ci` first or set dataset.blend_path=PATH"]
    assert preflight.run(inputs_cfg(an_input(required=False))) == []


def test_a_blend_with_a_missing_bin_is_flagged(tmp_path):
    for ext in (".bin", ".idx"):
        (tmp_path / f"shard_0{ext}").write_bytes(b"")
    (tmp_path / "shard_1.idx").write_bytes(b"")
    blend = tmp_path / "blend.json"
    blend.write_text(json.dumps({"train": [1.0, str(tmp_path / "shard_0"), 1.0, str(tmp_path / "shard_1")]}))
    assert preflight.run(inputs_cfg(an_input(path=str(blend)))) == \
        [f"1 data file(s) of {blend} unreadable, e.g. {tmp_path / 'shard_1'}"]
    (tmp_path / "shard_1.bin").write_bytes(b"")
    assert preflight.run(inputs_cfg(an_input(path=str(blend)))) == []
    assert preflight.run(inputs_cfg(an_input(path=str(tmp_path / "none.json")))) == \
        [f"dataset.blend_path {tmp_path / 'none.json'} is not readable"]


def test_another_kind_of_input_must_exist(tmp_path):
    ckpt = an_input(name="checkpoint", key="recipe.pretrained_checkpoint", kinds=["pretrain-checkpoint"])
    assert preflight.run(inputs_cfg({**ckpt, "path": str(tmp_path)})) == []
    assert preflight.run(inputs_cfg({**ckpt, "path": str(tmp_path / "gone")})) == \
        [f"recipe.pretrained_checkpoint {tmp_path / 'gone'} is not readable"]
    (tmp_path / "chats-0.jsonl").write_text("")
    assert preflight.run(inputs_cfg({**ckpt, "path": str(tmp_path / "chats-*.jsonl")})) == []  # a glob
    assert preflight.run(inputs_cfg({**ckpt, "path": "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"})) == []  # hub


def test_checks_are_chosen_by_name():
    assert preflight.run(inputs_cfg(an_input(), checks=["python_version"])) == []
    assert preflight.run(inputs_cfg(checks=["python_version", "no_such_check"])) == \
        ["unknown preflight check(s) no_such_check: this runtime does not match the launcher"]
    # without job.checks (an older launcher's config): the checks of its launch kind
    assert preflight.run({"job": {"launch": "ray"}, "datasets": [{"name": "x", "path": "/nonexistent/x.jsonl"}]}) \
        == ["dataset x: /nonexistent/x.jsonl matches no readable file"]
