"""The pretraining data-prep runtime (recipes.data_prep_pretrain), run as a job runs it: a subprocess on a
YAML config, on real Ray, writing real shards that Megatron-Core's IndexedDataset reads back.

Most runs join one local Ray head started for this module (loopback, 2 CPUs, a small object store, token
auth), which exercises the `$RAY_ADDRESS` path (`backend: auto` is Ray there); the first run and the killed
runs of the resume test use the process pool that a job on one machine uses by default, and their shards are
the same bytes as the Ray runs'.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import free_ports, kill_session, stage_config

pytest.importorskip("ray")
pytest.importorskip("tokenizers")
pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")
yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
RUNTIME = [sys.executable, "-m", "recipes.data_prep_pretrain"]
TINY = REPO / "recipes" / "samples" / "tiny"

from recipes.dataprep import encoders, hub, indexed, record_texts, shards  # noqa: E402
from recipes.dataprep.errors import BadRecordError  # noqa: E402

pytestmark = pytest.mark.heavy  # Ray, torch, NeMo-Run or real jobs: not in the fast tier

BIN = Path(sys.executable).parent
# PYTHONPATH: the runtime runs as a module from any directory (a job runs it from its code dir)
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
       "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
       "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO)}


@dataclass
class Result:
    rc: int
    out: str
    err: str


def write_config(path: Path, cfg: dict) -> Path:
    # the keys of the compiled tiny config under those the test sets; a job's config also carries the launcher's
    # sections: the runtime ignores them
    full = {**stage_config("data_prep/pretrain"), "run": {"nodes": 1, "gpus_per_node": 0},
            "job": {"id": "test", "stage": "data prep pretrain"}, **cfg}
    path.write_text(yaml.safe_dump(full, sort_keys=False))
    return path


def prep(cfg: dict, where: Path, env: dict | None = None, timeout: float = 180) -> Result:
    config = write_config(where / f"config-{secrets.token_hex(3)}.yaml", cfg)
    p = subprocess.run([*RUNTIME, "--config", str(config)], env={**ENV, **(env or {})},
                       capture_output=True, text=True, timeout=timeout, start_new_session=True, cwd=where)
    return Result(p.returncode, p.stdout, p.stderr)


def tiny_config(out: Path, **kw) -> dict:
    return {"datasets": [{"name": "stories", "path": str(TINY / "corpus.jsonl.gz"), "weight": 3.0},
                         {"name": "encyclopedia", "path": str(TINY / "encyclopedia.parquet"), "text_field": "content",
                          "weight": 1.0}],
            "tokenizer": str(TINY), "output_dir": str(out), "num_shards": 4, "progress_interval": 0.5,
            "object_store_mb": 100, **kw}


def file_hashes(root: Path) -> dict:
    """sha256 of every file under `root`; blend.json with `root` written as ROOT (its prefixes are absolute)."""
    hashes = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "blend.json":
                data = data.replace(str(root).encode(), b"ROOT")
            hashes[str(p.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return hashes


def stat_of(paths) -> dict:
    return {str(p): (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths}


def session_processes(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if len(line.split()) > 3 and line.split()[1] == str(sid) and not line.split()[2].startswith("Z")]


def wait_session_gone(sid: int, timeout: float = 20) -> list[str]:
    deadline = time.time() + timeout
    while (left := session_processes(sid)) and time.time() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray head (loopback, 2 CPUs, token auth): the env that points a run at it."""
    tmp = Path(tempfile.mkdtemp(prefix="u3ray"))  # short: Ray's socket paths must fit in 107 bytes
    gcs, client, agent = free_ports(3)
    # no PYTHONPATH: the workers get the recipes package from the driver (a runtime-env py_modules entry)
    env = {**{k: v for k, v in ENV.items() if k != "PYTHONPATH"}, "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    log = open(tmp / "head.log", "w")
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=2", "--num-gpus=0", "--disable-usage-stats",
         "--node-ip-address=127.0.0.1", f"--port={gcs}", f"--ray-client-server-port={client}",
         f"--dashboard-agent-listen-port={agent}", "--include-dashboard=false", f"--temp-dir={tmp}",
         "--object-store-memory=100000000"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while "Ray runtime started" not in (tmp / "head.log").read_text():
            assert head.poll() is None and time.time() < deadline, (tmp / "head.log").read_text()[-3000:]
            time.sleep(0.2)
        yield {"RAY_ADDRESS": f"127.0.0.1:{gcs}", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"]}
    finally:
        head.terminate()  # `ray start --block` stops everything it started
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        left = wait_session_gone(head.pid, timeout=10)
        if left:
            os.killpg(head.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def read_docs(path: Path, field: str) -> list[str]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=[field]).column(0).to_pylist()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def expected_tokens(tokenizer_json: Path, texts: list[str], eod: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    return [e.ids + [eod] for e in tok.encode_batch(texts, add_special_tokens=False)]


def megatron_sequences(prefix: Path):
    megatron = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    ds = megatron.IndexedDataset(str(prefix))
    return ds, [ds[i].tolist() for i in range(len(ds))]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny sample config, run like a job: embedded Ray on both CPUs."""
    where = tmp_path_factory.mktemp("tiny")
    proc = subprocess.Popen([*RUNTIME, "--config",
                             str(write_config(where / "config.yaml", tiny_config(where / "out", workers=2)))],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=where)
    out, err = proc.communicate(timeout=180)
    return where / "out", Result(proc.returncode, out, err), wait_session_gone(proc.pid, timeout=10)


# ---- the sample, end to end ------------------------------------------------------------------------------

def test_tiny_sample_reads_back_with_megatron(tiny_run):
    out, r, leftovers = tiny_run
    assert r.rc == 0, r.err
    assert leftovers == [], "Ray processes outlived the run"
    assert "progress:" in r.out and "tokens/s" in r.out and "ETA" in r.out
    assert "total" in r.out and "wall time" in r.out
    manifest = json.loads((out / "manifest.json").read_text())
    steady = re.search(r"^steady state: \S+ tokens/s \(([\d,]+) tokens of (\d+) shard\(s\) in ([\d.]+) s", r.out, re.M)
    assert steady and int(steady[1].replace(",", "")) == manifest["totals"]["tokens"] and steady[2] == "8"
    assert 0 < float(steady[3]) < 180
    assert manifest["tokenizer"]["dtype"] == "uint16" and manifest["tokenizer"]["vocab_size"] == 4096
    eod = manifest["tokenizer"]["eod_id"]
    assert manifest["tokenizer"]["eod_token"] == "<|endoftext|>"  # from tokenizer_config.json
    sources = {"stories": (TINY / "corpus.jsonl.gz", "text"),
               "encyclopedia": (TINY / "encyclopedia.parquet", "content")}
    for ds in manifest["datasets"]:
        path, field = sources[ds["name"]]
        want = expected_tokens(TINY / "tokenizer.json", read_docs(path, field), eod)
        got = []
        assert [s["index"] for s in ds["shards"]] == [0, 1, 2, 3]
        for shard in ds["shards"]:
            megatron_ds, seqs = megatron_sequences(out / shard["prefix"])
            assert megatron_ds.index.dtype == np.uint16
            assert len(seqs) == shard["docs"] == shard["records"]
            assert sum(map(len, seqs)) == shard["tokens"]
            assert list(megatron_ds.document_indices) == list(range(len(seqs) + 1))
            got += seqs
        assert got == want  # every document, in order, tokenized exactly as `tokenizers` does, + EOD
        assert ds["docs"] == len(want) and ds["tokens"] == sum(map(len, want)) and ds["bad_records"] == 0
        assert sorted(s["split"] for s in ds["shards"]) == ["test", "train", "train", "valid"]
    totals = manifest["totals"]
    assert totals["docs"] == sum(d["docs"] for d in manifest["datasets"]) == 3300
    assert totals["tokens"] == sum(s["tokens"] for d in manifest["datasets"] for s in d["shards"])
    assert sum(v["tokens"] for v in manifest["splits"].values()) == totals["tokens"]


def test_tiny_blend_names_existing_prefixes_with_dataset_weights(tiny_run):
    out, r, _ = tiny_run
    assert r.rc == 0, r.err
    blend = json.loads((out / "blend.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(blend) == {"train", "valid", "test"}
    weights = {d["name"]: d["weight"] for d in manifest["datasets"]}
    for split, flat in blend.items():
        pairs = list(zip(flat[::2], flat[1::2]))
        assert pairs, split
        per_dataset: dict = {}
        for weight, prefix in pairs:
            assert isinstance(weight, float) and weight > 0
            assert os.path.isabs(prefix)
            assert os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")
            name = Path(prefix).parent.name
            per_dataset[name] = per_dataset.get(name, 0) + weight
        assert per_dataset == pytest.approx(weights)  # each dataset keeps its weight in every split
    in_blend = {p for flat in blend.values() for p in flat[1::2]}
    assert in_blend == {str(out / s["prefix"]) for d in manifest["datasets"] for s in d["shards"]}


def test_same_bytes_with_one_worker(tiny_run, ray_cluster, tmp_path):
    out, r, _ = tiny_run
    assert r.rc == 0, r.err
    r1 = prep(tiny_config(tmp_path / "out", workers=1), tmp_path, env=ray_cluster)
    assert r1.rc == 0, r1.err
    assert "Ray cluster at 127.0.0.1" in r1.out
    assert file_hashes(tmp_path / "out") == file_hashes(out)


def test_sample_goes_to_its_own_dir_and_leaves_the_full_output_alone(tiny_run, ray_cluster, tmp_path):
    full, r, _ = tiny_run
    assert r.rc == 0, r.err
    out = tmp_path / "out"
    shutil.copytree(full, out, copy_function=shutil.copy2)
    hashes, stats = file_hashes(out), stat_of(p for p in out.rglob("*") if p.is_file())
    r = prep(tiny_config(out, sample=100), tmp_path, env=ray_cluster)
    assert r.rc == 0, r.err
    assert {k: v for k, v in file_hashes(out).items() if not k.startswith("sample-100/")} == hashes
    assert stat_of(stats) == stats  # not even rewritten
    manifest = json.loads((out / "sample-100" / "manifest.json").read_text())
    assert manifest["sample"] == 100
    for ds in manifest["datasets"]:
        assert ds["docs"] == 100 and [s["docs"] for s in ds["shards"]] == [25, 25, 25, 25]
    blend = json.loads((out / "sample-100" / "blend.json").read_text())
    assert all(p.startswith(str(out / "sample-100") + "/") for flat in blend.values() for p in flat[1::2])
    # the sample holds the first 100 documents of each dataset
    _, seqs = megatron_sequences(out / "sample-100" / "stories" / "shard_000000")
    want = expected_tokens(TINY / "tokenizer.json", read_docs(TINY / "corpus.jsonl.gz", "text")[:25], 0)
    assert seqs == want


# ---- encoders: gigatoken where it gives the same ids, tokenizers elsewhere ---------------------------------

def shard_hashes(root: Path) -> dict:
    return {k: v for k, v in file_hashes(root).items() if k.endswith((".bin", ".idx"))}


def test_auto_picks_gigatoken_and_writes_the_bytes_tokenizers_writes(tiny_run, ray_cluster, tmp_path):
    pytest.importorskip("gigatoken")
    out, r, _ = tiny_run  # encoder: auto (the default)
    assert r.rc == 0, r.err
    assert "; encoder gigatoken;" in r.out and "encoder: tokenizers" not in r.out, r.out
    ref = prep(tiny_config(tmp_path / "out", workers=2, encoder="tokenizers"), tmp_path, env=ray_cluster)
    assert ref.rc == 0, ref.err
    assert "; encoder tokenizers;" in ref.out
    want = shard_hashes(tmp_path / "out")
    assert len(want) == 16  # 2 datasets x 4 shards x (.bin, .idx)
    assert shard_hashes(out) == want
    assert file_hashes(out) == file_hashes(tmp_path / "out")  # receipts and manifest too


def dropout_tokenizer(directory: Path) -> Path:
    """The tiny tokenizer with BPE dropout 1.0: `tokenizers` drops every merge (deterministically: all bytes),
    gigatoken loads it but ignores dropout, so it cannot reproduce the ids."""
    directory.mkdir()
    config = json.loads((TINY / "tokenizer.json").read_text())
    config["model"]["dropout"] = 1.0
    (directory / "tokenizer.json").write_text(json.dumps(config))
    return directory


def test_a_tokenizer_gigatoken_cannot_reproduce_falls_back_with_one_line(ray_cluster, tmp_path):
    pytest.importorskip("gigatoken")
    tokenizer = dropout_tokenizer(tmp_path / "tok")
    cfg = {"datasets": [{"name": "stories", "path": str(TINY / "corpus.jsonl.gz")}], "tokenizer": str(tokenizer),
           "output_dir": str(tmp_path / "out"), "num_shards": 2, "sample": 60, "object_store_mb": 100}
    r = prep(cfg, tmp_path, env=ray_cluster)
    assert r.rc == 0, r.err
    why = [line for line in r.out.splitlines() if line.startswith("encoder:")]
    assert len(why) == 1 and why[0].startswith("encoder: tokenizers (gigatoken's ids differ from tokenizers' on "), \
        r.out
    assert "; encoder tokenizers;" in r.out
    manifest = json.loads((tmp_path / "out" / "sample-60" / "manifest.json").read_text())
    got = [seq for s in manifest["datasets"][0]["shards"]
           for seq in megatron_sequences(tmp_path / "out" / "sample-60" / s["prefix"])[1]]
    want = expected_tokens(tokenizer / "tokenizer.json", read_docs(TINY / "corpus.jsonl.gz", "text")[:60], 0)
    assert got == want
    assert max(map(len, want)) > 100  # all bytes: nothing merged

    forced = prep({**cfg, "encoder": "gigatoken", "output_dir": str(tmp_path / "forced")}, tmp_path)
    assert forced.rc == 2, (forced.out, forced.err)
    lines = forced.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ultra3 data prep pretrain: error: encoder: gigatoken cannot be "
                                                   "used: gigatoken's ids differ"), forced.err
    assert not (tmp_path / "forced").exists()


def pool_workers(sid: int) -> list[int]:
    """The pids of the pool's workers in a session: the children of its forkserver."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,sid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in ps.splitlines()]
    servers = {r[0] for r in rows if len(r) == 4 and r[2] == str(sid) and "multiprocessing.forkserver" in r[3]}
    return [int(r[0]) for r in rows if len(r) == 4 and r[1] in servers]


@pytest.mark.parametrize("workers", [None, 1])
def test_a_config_error_once_the_workers_started_leaves_nothing_behind(tmp_path, workers):
    """The pool starts with the runtime, before the tokenizer is read, with as many workers as the run will use:
    a bad tokenizer still ends in one line, exit 2, nothing written, and no worker (nor the pool's server) left.
    The tokenizer is a FIFO, so that its read waits until the workers are up."""
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    config = write_config(tmp_path / "config.yaml",
                          tiny_config(tmp_path / "out", tokenizer=str(fifo), workers=workers))
    p = subprocess.Popen([*RUNTIME, "--config", str(config)], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path)
    try:
        want, deadline = workers or len(os.sched_getaffinity(0)), time.time() + 60
        while len(pool_workers(p.pid)) < want and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # (and no more come)
        assert len(pool_workers(p.pid)) == want, session_processes(p.pid)
        fifo.write_text("not a tokenizer")
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "is not a readable tokenizer.json" in err, (out, err)
    assert wait_session_gone(p.pid) == []
    assert not (tmp_path / "out").exists()


def _small_task(tmp_path: Path, texts: list[str]) -> tuple:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    from recipes.dataprep import inputs

    source = inputs.scan(str(corpus), "jsonl", "text")
    tok_json = (TINY / "tokenizer.json").read_text()
    sha = hashlib.sha256(tok_json.encode()).hexdigest()
    task = shards.plan_dataset("d", str(tmp_path / "out"), "text", [source], 1, sha, 0, "uint16",
                                inputs.MAX_RECORD_BYTES)[0]
    return task, tok_json, sha


def test_a_shard_whose_sample_gigatoken_gets_wrong_falls_back_to_tokenizers(tmp_path, monkeypatch):
    """The check inside a shard task: gigatoken made to get one word wrong; that shard is written with
    tokenizers (the same bytes), or under `encoder: gigatoken` not at all."""
    pytest.importorskip("gigatoken")
    docs = read_docs(TINY / "corpus.jsonl.gz", "text")[:300]
    docs[7] = "zebra " + docs[7]  # (a shard's check reads the heads of its first documents)
    task, tok_json, sha = _small_task(tmp_path, docs)
    reference = shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="tokenizers")
    want = shard_hashes(tmp_path / "out")
    good = shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="gigatoken")
    assert good["_encoder"] == "gigatoken" and good["_encoder_fallback"] is None
    assert shard_hashes(tmp_path / "out") == want and good["bin"] == reference["bin"]

    real = encoders.GigatokenEncoder.ids

    def wrong_on_zebra(self, texts):
        flat, counts = real(self, texts)
        if any("zebra" in t for t in encoders.as_list(texts)):
            flat = flat.copy()
            flat[-1] ^= 1
        return flat, counts

    monkeypatch.setattr(encoders.GigatokenEncoder, "ids", wrong_on_zebra)
    monkeypatch.setattr(encoders, "_CACHE", {})
    fell_back = shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="gigatoken")
    assert fell_back["_encoder"] == "tokenizers"
    assert fell_back["_encoder_fallback"].startswith("on this shard's calibration sample, gigatoken's ids differ")
    assert shard_hashes(tmp_path / "out") == want
    with pytest.raises(encoders.EncoderError, match="gigatoken cannot be used"):
        shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="gigatoken", encoder_required=True)
    assert not (tmp_path / "out" / "shard_000000.json").exists()  # the receipt went first
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp-" in p.name]


def test_a_shard_published_by_the_driver_is_the_shard_its_task_would_publish(tmp_path):
    """`publish_here` False (the pool's workers): the task leaves its files under temporary names and writes no
    receipt, so a crash there leaves the shard to be written again; the driver's Publisher then makes it the
    very shard a task that publishes itself writes, receipt included. Whole shards queued before an error in the
    driver are still published; an error publishing one is raised, and the shards queued after it stay
    unpublished."""
    from recipes.dataprep import inputs

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in read_docs(TINY / "corpus.jsonl.gz", "text")))
    tok_json = (TINY / "tokenizer.json").read_text()
    sha = hashlib.sha256(tok_json.encode()).hexdigest()
    out = tmp_path / "out"
    tasks = shards.plan_dataset("d", str(out), "text", [inputs.scan(str(corpus), "jsonl", "text")], 3, sha, 0,
                                "uint16", inputs.MAX_RECORD_BYTES)

    def write(task, **kw):
        return shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="tokenizers", **kw)

    published = [write(t) for t in tasks]
    want, receipts = file_hashes(out), [shards.read_receipt(t, "checksum") for t in tasks]
    assert all(receipts) and receipts == [{k: v for k, v in r.items() if not k.startswith("_")} for r in published]

    pending = [write(t, publish_here=False) for t in tasks]
    assert [shards.read_receipt(t) for t in tasks] == [None] * 3  # invalidated, and not written again yet
    assert all(os.path.exists(p) and ".tmp-" in p for r in pending for p in r["_tmp"].values())
    with pytest.raises(KeyError):
        with shards.Publisher() as publisher:
            publisher.put(tasks[0], pending[0])
            raise KeyError("the driver's own error")
    assert shards.read_receipt(tasks[0], "checksum") == receipts[0]

    os.unlink(pending[1]["_tmp"]["idx"])  # lost before the driver publishes it
    with pytest.raises(FileNotFoundError):
        with shards.Publisher() as publisher:
            publisher.put(tasks[1], pending[1])
            publisher.put(tasks[2], pending[2])
    assert shards.read_receipt(tasks[1]) is None and shards.read_receipt(tasks[2]) is None
    assert publisher.published == {}
    with shards.Publisher() as publisher:
        publisher.put(tasks[2], pending[2])
    assert sorted(publisher.published) == [tasks[2].key]
    assert shards.read_receipt(tasks[2], "checksum") == receipts[2]
    shards.invalidate(tasks[1])
    write(tasks[1])
    assert shards.clean_dataset_dir(str(out), 3) == [os.path.basename(pending[1]["_tmp"]["bin"])]
    assert file_hashes(out) == want


def test_encoders_agree_on_the_calibration_strings():
    pytest.importorskip("gigatoken")
    tok_json = (TINY / "tokenizer.json").read_text()
    texts = encoders.tricky_texts(tok_json)
    assert any("<|im_start|>" in t for t in texts)  # the added tokens' text
    want = encoders.HFEncoder(tok_json).encode(texts, 0, np.dtype("uint16"))
    got = encoders.GigatokenEncoder(tok_json).encode(texts, 0, np.dtype("uint16"))
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert want[0].dtype == np.uint16 and want[1].sum() == want[0].size and (want[0][np.cumsum(want[1]) - 1] == 0).all()
    assert encoders.choose("auto", tok_json, "sha") == ("gigatoken", None)
    assert encoders.choose("tokenizers", tok_json, "sha") == ("tokenizers", None)


def test_a_worker_checks_the_tricky_strings_once_and_every_shard_its_first_documents(monkeypatch):
    pytest.importorskip("gigatoken")
    tok_json = (TINY / "tokenizer.json").read_text()
    sha = hashlib.sha256(tok_json.encode()).hexdigest()
    docs = read_docs(TINY / "corpus.jsonl.gz", "text")[:100]
    monkeypatch.setattr(encoders, "_CACHE", {})
    checked, real = [], encoders.HFEncoder.ids
    monkeypatch.setattr(encoders.HFEncoder, "ids", lambda self, texts: checked.append(list(texts)) or real(self, texts))
    for shard in (docs[:50], docs[50:]):
        enc = encoders.ShardEncoder("gigatoken", tok_json, sha)
        enc.encode(shard, 0, np.dtype("uint16"))
        assert enc.name == "gigatoken"
    heads = [[d[:encoders.CALIBRATION_HEAD] for d in part[:encoders.CALIBRATION_DOCS]]
             for part in (docs[:50], docs[50:])]
    assert checked == [heads[0] + encoders.tricky_texts(tok_json), heads[1]]


# ---- dtype -----------------------------------------------------------------------------------------------

def big_vocab_tokenizer(path: Path, words: int = 70_000) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eod>": 1, **{f"w{i}": i for i in range(2, words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<eod>"])
    tok.save(str(path))
    return path


def test_big_vocab_gives_int32_then_reuse_then_force(ray_cluster, tmp_path):
    tokenizer = big_vocab_tokenizer(tmp_path / "tokenizer.json")
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}" for i in rng.integers(2, 70_000, size=rng.integers(1, 60))) for _ in range(200)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = {"datasets": [{"name": "words", "path": str(corpus)}], "tokenizer": str(tokenizer), "eod_token": "<eod>",
           "output_dir": str(tmp_path / "out"), "num_shards": 2, "object_store_mb": 100}
    r = prep(cfg, tmp_path, env=ray_cluster)
    assert r.rc == 0, r.err
    if importlib.util.find_spec("gigatoken"):  # a WordLevel model: gigatoken encodes BPE only
        assert "encoder: tokenizers (gigatoken cannot load this tokenizer (" in r.out, r.out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["tokenizer"]["dtype"] == "int32" and manifest["tokenizer"]["eod_id"] == 1
    got = []
    for shard in manifest["datasets"][0]["shards"]:
        ds, seqs = megatron_sequences(tmp_path / "out" / shard["prefix"])
        assert ds.index.dtype == np.int32
        got += seqs
    assert got == expected_tokens(tokenizer, texts, 1)
    assert max(max(s) for s in got) > 65_535
    assert manifest["splits"]["valid"]["shards"] == 0  # 2 shards: all train

    shard_files = sorted((tmp_path / "out" / "words").iterdir())
    before = file_hashes(tmp_path / "out"), stat_of(shard_files)
    again = prep(cfg, tmp_path)  # everything done: reused without starting Ray (no RAY_ADDRESS here)
    assert again.rc == 0, again.err
    assert "shards written 0, reused 2" in again.out and "Ray" not in again.out
    assert (file_hashes(tmp_path / "out"), stat_of(shard_files)) == before

    # a shard corrupted in place (same size, same mtime) passes `verify: size`, not `verify: checksum`
    victim = tmp_path / "out" / "words" / "shard_000001.bin"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    checked = prep({**cfg, "verify": "checksum"}, tmp_path, env=ray_cluster)
    assert checked.rc == 0, checked.err
    assert "shards written 1, reused 1" in checked.out
    assert file_hashes(tmp_path / "out") == before[0]
    shard_files = sorted((tmp_path / "out" / "words").iterdir())
    before = before[0], stat_of(shard_files)

    forced = prep({**cfg, "force": True}, tmp_path, env=ray_cluster)
    assert forced.rc == 0, forced.err
    assert "shards written 2, reused 0" in forced.out
    assert file_hashes(tmp_path / "out") == before[0]
    after = stat_of(shard_files)
    assert all(after[p][0] != before[1][p][0] for p in after)  # new files (renamed into place)


# ---- bad records -----------------------------------------------------------------------------------------

BAD_LINES = [
    b'{"text": "A good first document."}',
    b'{"text": "unterminated',  # 2 invalid_json
    b'{"body": "no text field"}',  # 3 missing_field
    b'{"text": "bad \xff\xfe bytes"}',  # 4 bad_utf8
    b'{"text": ""}',  # 5 empty_text
    b"",  # blank: not a record
    b'{"text": "Another good one."}',  # 7
    b'["a", "list"]',  # 8 invalid_json (not an object)
    b'{"text": 42}',  # 9 not_a_string
    b'{"text": "   \\n  "}',  # 10 empty_text
    b'{"text": "lone \\ud800 surrogate"}',  # 11 bad_utf8
    b'{"text": "The last good document."}',  # 12
]


def test_bad_records_are_counted_with_file_and_line(ray_cluster, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_bytes(b"\n".join(BAD_LINES) + b"\n")
    cfg = {"datasets": [{"name": "bad", "path": str(corpus)}], "tokenizer": str(TINY),
           "output_dir": str(tmp_path / "out"), "num_shards": 2, "object_store_mb": 100}
    refused = prep(cfg, tmp_path, env=ray_cluster)  # 8 of 11 bad: past the default share (1%)
    lines = [line for line in refused.err.splitlines() if line.strip()]
    assert refused.rc == 2 and len(lines) == 1, refused.err
    assert lines[0].startswith("ultra3 data prep pretrain: error: dataset bad: 8 of 11 records are bad and 3 usable "
                               f"(max_bad_fraction 0.01); first: {corpus}:2: ") and "(invalid_json)" in lines[0], lines
    assert not (tmp_path / "out" / "blend.json").exists()  # nothing published
    r = prep({**cfg, "max_bad_fraction": 0.75}, tmp_path, env=ray_cluster)  # accepted: counted (shards reused)
    assert r.rc == 0, r.err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    ds = manifest["datasets"][0]
    assert ds["bad"]["counts"] == {"invalid_json": 2, "missing_field": 1, "not_a_string": 1, "bad_utf8": 2,
                                   "empty_text": 2}
    assert ds["records"] == 11 and ds["docs"] == 3 and ds["bad_records"] == 8
    assert manifest["totals"]["bad_records"] == 8 and manifest["totals"]["bad"] == ds["bad"]["counts"]
    examples = ds["bad"]["examples"]
    for kind, lines in {"invalid_json": [2, 8], "missing_field": [3], "not_a_string": [9], "bad_utf8": [4, 11],
                        "empty_text": [5, 10]}.items():
        assert [e.split(": ")[0] for e in examples[kind]] == [f"{corpus}:{n}" for n in lines]
    assert f"bad records, bad, invalid_json: 2; first at {corpus}:2" in r.out
    assert f"{corpus}:11" in r.out
    assert sum(s["bad"].get("bad_utf8", 0) for s in ds["shards"]) == 2  # per shard too
    got = [seq for s in ds["shards"] for seq in megatron_sequences(tmp_path / "out" / s["prefix"])[1]]
    assert got == expected_tokens(TINY / "tokenizer.json",
                                  ["A good first document.", "Another good one.", "The last good document."], 0)


@pytest.mark.parametrize("content", [b"not json\n{oops\n", b'{"other": "x"}\n{"other": "y"}\n',
                                     b'{"text": 3}\n', b"\xff\xfe\n\xc3\x28\n", b"\x1f\x8b not gzip at all"])
def test_a_dataset_with_nothing_usable_fails_with_one_line(ray_cluster, tmp_path, content):
    corpus = tmp_path / ("bad.jsonl.gz" if content.startswith(b"\x1f\x8b") else "bad.jsonl")
    corpus.write_bytes(content)
    cfg = {"datasets": [{"name": "bad", "path": str(corpus)}], "tokenizer": str(TINY),
           "output_dir": str(tmp_path / "out"), "num_shards": 1, "object_store_mb": 100, "max_bad_fraction": 1.0}
    r = prep(cfg, tmp_path, env=ray_cluster)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert r.rc == 2 and len(lines) == 1 and lines[0].startswith("ultra3 data prep pretrain: error: "), r.err
    assert "Traceback" not in r.err and not (tmp_path / "out" / "blend.json").exists()


def test_strict_stops_at_the_first_bad_record_with_one_line(ray_cluster, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_bytes(b"\n".join(BAD_LINES) + b"\n")
    cfg = {"datasets": [{"name": "bad", "path": str(corpus)}], "tokenizer": str(TINY),
           "output_dir": str(tmp_path / "out"), "num_shards": 1, "strict": True, "object_store_mb": 100}
    r = prep(cfg, tmp_path, env=ray_cluster)
    assert r.rc == 2
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1, r.err
    assert "invalid_json" in lines[0] and f"{corpus}:2" in lines[0] and "strict" in lines[0]
    assert not (tmp_path / "out" / "blend.json").exists()
    assert not list((tmp_path / "out" / "bad").glob("shard_*"))  # nothing half-written left behind


# ---- the block decoder (Arrow's JSON reader) against line-by-line decoding -----------------------------------

MIXED_LINES = [  # each a record unless blank; the comments name what the line-by-line decoder makes of it
    b'{"text": "A good first document.", "meta": {"tags": ["x", 1, null], "score": 0.5}}',
    b'{"text": null}',  # missing_field (null)
    b'{"id": 7}',  # missing_field
    b'{"text": " \\u3000\\u001c\\t "}',  # empty_text: only characters str.strip() strips
    b"   ",  # blank: not a record
    b'{"text": "\\u00e9t\\u00e9 \\ud83d\\ude00 escaped pair", "n": NaN}',
    b'{"text": ""}',  # empty_text
    b'\xef\xbb\xbf{"text": "after a byte-order mark"}',
    b'{"text": "Unicode \xc3\xa9\xe2\x80\xa8 kept as is"}',
    b'{"text": "x", "text": "the last of a repeated key"}',
    b'{"text": "ok", "other": "bad \xff byte elsewhere"}',  # bad_utf8 (in a field not read)
    b'{"text": "two"}{"text": "objects"}',  # invalid_json (extra data)
    b'{"text": "lone \\udc00 in text"}',  # bad_utf8
    b'{"text": "ok", "other": "lone \\ud800 elsewhere"}',  # good: the text is fine
    b'{"text": 3.5}',  # not_a_string
    b'{"text": "ok",}',  # invalid_json
    b'{"text": "The last good document."}',
]


def _line_by_line(path: Path, start: int, end: int, bad) -> list[str]:
    """The reference: every line through the line decoder (what the block decoder falls back to)."""
    texts, n = [], 0
    for lineno, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        if not line.strip():
            continue
        if start <= n < end and (t := record_texts.json_text(line, "text", f"{path}:{lineno}", bad)) is not None:
            texts.append(t)
        n += 1
    return texts


@pytest.mark.parametrize("block_bytes", [1, 200, 1 << 20])  # a line per block, a few, all in one
def test_block_decoder_gives_the_texts_and_bad_records_of_line_by_line_decoding(tmp_path, monkeypatch,
                                                                                 block_bytes):
    from recipes.dataprep import inputs, line_reader

    monkeypatch.setattr(line_reader, "BLOCK_BYTES", block_bytes)
    corpus = tmp_path / "mixed.jsonl"
    corpus.write_bytes(b"\n".join(MIXED_LINES * 3))  # no newline at the end
    records = 3 * sum(1 for line in MIXED_LINES if line.strip())
    for start, end in ((0, records), (5, 23), (17, 18)):
        want_bad, got_bad = inputs.BadRecords(), inputs.BadRecords()
        want = _line_by_line(corpus, start, end, want_bad)
        blocks = list(inputs.read_texts(str(corpus), "jsonl", "text", start, end, got_bad))
        assert [t for _, texts in blocks for t in texts.to_pylist()] == want
        assert (got_bad.counts, got_bad.examples) == (want_bad.counts, want_bad.examples)
    bad = inputs.BadRecords()
    list(inputs.read_texts(str(corpus), "jsonl", "text", 0, records, bad))
    assert bad.counts == {"missing_field": 6, "empty_text": 6, "bad_utf8": 6, "invalid_json": 6, "not_a_string": 3}
    assert [e.split(": ")[0] for e in bad.examples["missing_field"]] == [f"{corpus}:{n}" for n in (2, 3, 19, 20, 36)]
    assert [e.split(": ")[0] for e in bad.examples["empty_text"]] == [f"{corpus}:{n}" for n in (4, 7, 21, 24, 38)]


@pytest.mark.parametrize("block_bytes", [1, 200, 1 << 20])
@pytest.mark.parametrize("mark_bytes", [1, 100])
def test_a_range_read_between_seek_marks_gets_what_reading_the_whole_file_gets(tmp_path, monkeypatch, block_bytes,
                                                                                mark_bytes):
    """count_records leaves seek marks in a plain JSONL file: at line starts about every MARK_BYTES, inside blocks
    too, each with the records and lines before it. A range read from the last mark at or before it to the first
    at or after it gives the same texts and the same bad records, at the same lines, and reads nothing past
    that mark."""
    from recipes.dataprep import inputs, line_reader

    monkeypatch.setattr(line_reader, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(inputs, "MARK_BYTES", mark_bytes)
    corpus = tmp_path / "mixed.jsonl"
    data = b"\n".join(MIXED_LINES * 3) + b"\n"
    corpus.write_bytes(data)
    records, full, marks = inputs.count_records(str(corpus), "jsonl", "text")
    assert full and records == 3 * sum(1 for line in MIXED_LINES if line.strip())
    assert marks[0] == [0, 0, 0] and len(marks) > 3, (len(data), marks)
    for n, lineno, offset in marks:
        before = data[:offset].split(b"\n")[:-1]
        assert data[offset - 1:offset] in (b"", b"\n") and (n, lineno) == (sum(1 for x in before if x.strip()),
                                                                          len(before))
    furthest = []

    class Tracked(io.BufferedReader):  # where reading got to
        def read(self, size=-1):
            data = super().read(size)
            furthest.append(self.tell())
            return data

    for start, end in ((0, records), (5, 23), (17, 18), (records - 2, records)):
        mark, stop = shards._mark(marks, start), shards._stop(marks, end)
        assert mark[0] <= start and (stop is None or end < records)
        want_bad, got_bad = inputs.BadRecords(), inputs.BadRecords()
        want = list(inputs.read_texts(str(corpus), "jsonl", "text", start, end, want_bad))
        furthest.clear()
        with monkeypatch.context() as m:
            m.setattr(inputs, "open_binary", lambda path, fmt: Tracked(io.FileIO(path)))
            got = list(inputs.read_texts(str(corpus), "jsonl", "text", start, end, got_bad, mark=mark, stop=stop))
        assert [t for _, b in got for t in b.to_pylist()] == [t for _, b in want for t in b.to_pylist()]
        assert (got_bad.counts, got_bad.examples) == (want_bad.counts, want_bad.examples)
        assert max(furthest) <= (len(data) if stop is None else stop)
    with open(corpus, "rb") as f, gzip.open(tmp_path / "mixed.jsonl.gz", "wb") as g:
        g.write(f.read())
    # a compressed file cannot be sought in: no marks, the same count
    assert inputs.count_records(str(tmp_path / "mixed.jsonl.gz"), "jsonl.gz", "text") == (records, True, [])


@pytest.mark.parametrize("block_bytes", [64, 1000, 1 << 20])
def test_a_range_that_ends_inside_a_block_of_records_is_still_decoded_whole(tmp_path, monkeypatch, block_bytes):
    """Blocks with no blank or long line: the lines of a range that starts or ends inside one are sliced out
    and decoded at once (no line-by-line split), with what reading line by line gives, bad records included."""
    from recipes.dataprep import inputs, line_reader

    monkeypatch.setattr(line_reader, "BLOCK_BYTES", block_bytes)
    lines = [json.dumps({"text": f"document {i} " + "x" * (i % 37)}) for i in range(500)]
    lines[123], lines[300] = '{"text": null}', '{"text": " "}'
    corpus = tmp_path / "plain.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    for start, end in ((0, 500), (7, 8), (37, 263), (123, 124), (299, 301), (499, 500)):
        want_bad, got_bad = inputs.BadRecords(), inputs.BadRecords()
        want = _line_by_line(corpus, start, end, want_bad)
        with monkeypatch.context() as m:
            for module in (inputs, record_texts):
                m.setattr(module, "split", lambda *a: pytest.fail("a block was split line by line"))
            got = list(inputs.read_texts(str(corpus), "jsonl", "text", start, end, got_bad))
        assert [t for _, texts in got for t in texts.to_pylist()] == want
        assert (got_bad.counts, got_bad.examples) == (want_bad.counts, want_bad.examples)
        assert sum(size for size, _ in got) == sum(len(line) + 1 for line in lines[start:end])


def test_a_bad_record_in_the_middle_of_a_decoded_block_is_placed_exactly(tmp_path):
    """One block of 2,000 records, decoded by Arrow in one go: the null, the blank text and (strict) the
    first of them still name their own lines."""
    from recipes.dataprep import inputs

    lines = [json.dumps({"text": f"document {i}"}) for i in range(2000)]
    lines[1234] = '{"text": null}'
    lines[1500] = '{"text": "\\n\\n  "}'
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    bad = inputs.BadRecords()
    blocks = list(inputs.read_texts(str(corpus), "jsonl", "text", 0, 2000, bad))
    assert len(blocks) == 1 and len(blocks[0][1]) == 1998
    assert bad.examples == {"missing_field": [f"{corpus}:1235: no 'text' field"],
                            "empty_text": [f"{corpus}:1501: 'text' is empty"]}
    with pytest.raises(BadRecordError, match=f"missing_field.*{corpus}:1235"):
        list(inputs.read_texts(str(corpus), "jsonl", "text", 0, 2000, inputs.BadRecords(strict=True)))


def test_block_and_line_decoding_write_the_same_shard_bytes(tmp_path, monkeypatch):
    """A shard written through Arrow's reader and the same shard decoded line by line (the reader made to
    refuse every block): the same .bin/.idx, the same bad records."""
    import pyarrow as pa
    import pyarrow.json

    docs = read_docs(TINY / "corpus.jsonl.gz", "text")[:400]
    lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate(docs)]
    lines[10:10] = ['{"text": null}', '{"text": "  "}', '{"text": 5}', "{broken"]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    from recipes.dataprep import inputs, line_reader

    monkeypatch.setattr(line_reader, "BLOCK_BYTES", 16 << 10)  # many blocks: the bad ones are in one
    source = inputs.scan(str(corpus), "jsonl", "text")
    tok_json = (TINY / "tokenizer.json").read_text()
    sha = hashlib.sha256(tok_json.encode()).hexdigest()
    task = shards.plan_dataset("d", str(tmp_path / "out"), "text", [source], 1, sha, 0, "uint16",
                                inputs.MAX_RECORD_BYTES)[0]
    read_json, decoded = pyarrow.json.read_json, []

    def counted(*args, **kwargs):
        table = read_json(*args, **kwargs)
        decoded.append(table.num_rows)
        return table

    monkeypatch.setattr(pyarrow.json, "read_json", counted)
    fast = shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="tokenizers")
    assert sum(decoded) > 300  # most records went through Arrow
    want = shard_hashes(tmp_path / "out")

    def refuse(*args, **kwargs):
        raise pa.ArrowInvalid("refused")

    monkeypatch.setattr(pyarrow.json, "read_json", refuse)
    slow = shards.write_shard(task, tok_json, sha, 0, "uint16", encoder="tokenizers")
    assert shard_hashes(tmp_path / "out") == want
    assert slow["bad"] == fast["bad"] and fast["bad"]["counts"] == {"invalid_json": 1, "missing_field": 1,
                                                                     "not_a_string": 1, "empty_text": 1}
    assert fast["docs"] == 400 and fast["tokens"] == slow["tokens"]


def test_blank_texts_in_parquet_are_found_in_arrays(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recipes.dataprep import inputs

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"t": ["a", None, " \u2029", "b", "", "c"]}), path, row_group_size=4)
    bad = inputs.BadRecords()
    texts = [t for _, block in inputs.read_texts(str(path), "parquet", "t", 1, 6, bad) for t in block.to_pylist()]
    assert texts == ["b", "c"]
    assert bad.examples == {"missing_field": [f"{path}:row=1: no 't' field"],
                            "empty_text": [f"{path}:row=2: 't' is empty", f"{path}:row=4: 't' is empty"]}


def test_whitespace_is_what_str_strip_strips():
    assert record_texts.whitespace() == "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())


# ---- errors before anything is written -------------------------------------------------------------------

def _garbage_tokenizer(tmp: Path) -> str:
    (tmp / "tok").mkdir()
    (tmp / "tok" / "tokenizer.json").write_text('{"this is": "not a tokenizer"}')
    return str(tmp / "tok")


@pytest.mark.parametrize("case, expect", [
    ("missing_input", "matches no input file"),
    ("missing_glob", "matches no input file"),
    ("missing_tokenizer", "does not exist"),
    ("unreadable_tokenizer", "is not a readable tokenizer.json"),
    ("empty_corpus", "empty corpus"),
    ("blank_corpus", "empty corpus"),
    ("parquet_without_field", "has no column 'body'"),
    ("workers_not_a_count", "workers must be an integer or null, not 'four'"),  # ranges: the launcher's
])
def test_input_errors_are_one_line_exit_2_and_write_nothing(case, expect, tmp_path):
    out = tmp_path / "out"
    good = str(TINY / "corpus.jsonl.gz")
    cfg = {"datasets": [{"name": "d", "path": good}], "tokenizer": str(TINY), "output_dir": str(out)}
    if case == "missing_input":
        cfg["datasets"][0]["path"] = str(tmp_path / "nope.jsonl")
    elif case == "missing_glob":
        cfg["datasets"] = [{"name": "a", "path": good}, {"name": "b", "path": str(tmp_path / "none" / "*.parquet")}]
    elif case == "missing_tokenizer":
        cfg["tokenizer"] = str(tmp_path / "no-such-tokenizer")
    elif case == "unreadable_tokenizer":
        cfg["tokenizer"] = _garbage_tokenizer(tmp_path)
    elif case == "empty_corpus":
        (tmp_path / "empty.jsonl").write_bytes(b"")
        cfg["datasets"][0]["path"] = str(tmp_path / "empty.jsonl")
    elif case == "blank_corpus":
        with gzip.open(tmp_path / "blank.jsonl.gz", "wb") as f:
            f.write(b"\n  \n\n")
        cfg["datasets"] = [{"name": "a", "path": good}, {"name": "b", "path": str(tmp_path / "blank.jsonl.gz")}]
    elif case == "parquet_without_field":
        cfg["datasets"] = [{"name": "e", "path": str(TINY / "encyclopedia.parquet"), "text_field": "body"}]
    elif case == "workers_not_a_count":
        cfg["workers"] = "four"
    r = prep(cfg, tmp_path, timeout=60)
    assert r.rc == 2, (r.out, r.err)
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ultra3 data prep pretrain: error: ") and expect in lines[0], r.err
    assert not out.exists()


# ---- kill -9 at any point, then resume -------------------------------------------------------------------

def _wait_for(proc: subprocess.Popen, cond, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not cond():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (rc {proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-2000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _kill_when(config: Path, where: Path, cond, what: str) -> None:
    proc = subprocess.Popen([*RUNTIME, "--config", str(config)], env=ENV, cwd=where,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for(proc, cond, what)
    kill_session(proc.pid)
    proc.communicate()


def _check_visible_shards(d: Path) -> None:
    """Every shard under its final name is whole: its .bin holds exactly what its .idx describes."""
    for idx in d.glob("shard_*.idx"):
        index = indexed.read_index(str(idx))
        size = int(index["lengths"].astype(np.int64).sum()) * np.dtype(index["dtype"]).itemsize
        assert idx.with_suffix(".bin").stat().st_size == size


def test_kill_9_anywhere_then_resume_gives_the_same_bytes(ray_cluster, tmp_path):
    # ~14 MB of text in 6 shards, written one at a time: each takes long enough to be killed in the middle
    docs = [json.loads(line) for line in gzip.open(TINY / "corpus.jsonl.gz")]
    with open(tmp_path / "big.jsonl", "w") as f:
        for copy in range(6):
            for d in docs:
                f.write(json.dumps({"id": f"{copy}-{d['id']}", "text": d["text"]}) + "\n")
    out = tmp_path / "out"
    cfg = {"datasets": [{"name": "big", "path": str(tmp_path / "big.jsonl")}], "tokenizer": str(TINY),
           "output_dir": str(out), "num_shards": 6, "object_store_mb": 100, "progress_interval": 0.5}

    reference = prep({**cfg, "workers": 2}, tmp_path, env=ray_cluster)  # uninterrupted
    assert reference.rc == 0, reference.err
    want = file_hashes(out)
    out.rename(tmp_path / "reference")

    config = write_config(tmp_path / "config.yaml", {**cfg, "workers": 1})
    shard_dir = out / "big"
    receipts = lambda: sorted(shard_dir.glob("shard_*.json"))  # noqa: E731
    writing = lambda: any(".tmp-" in p.name for p in shard_dir.glob("shard_*"))  # noqa: E731

    # 1. killed in the middle of the first shard
    first = lambda: any(shard_dir.glob("shard_*.bin.tmp-*"))  # noqa: E731
    _kill_when(config, tmp_path, lambda: shard_dir.is_dir() and first(), "the first shard started")
    assert receipts() == []
    _check_visible_shards(shard_dir)
    # 2. killed with some shards done and another half written
    _kill_when(config, tmp_path, lambda: len(receipts()) >= 2 and writing(), "2 shards")
    _check_visible_shards(shard_dir)
    kept = stat_of(p for r in receipts() for p in (r, r.with_suffix(".bin"), r.with_suffix(".idx")))
    # 3. killed with most shards done
    _kill_when(config, tmp_path, lambda: len(receipts()) >= 5 and writing(), "5 shards")
    _check_visible_shards(shard_dir)
    done = len(receipts())
    assert done >= 5
    # 4. resumed to the end (on the other Ray: the cluster)
    proc = subprocess.run([*RUNTIME, "--config", str(config)], env={**ENV, **ray_cluster},
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert f"shards written {6 - done}, reused {done}" in proc.stdout, proc.stdout
    assert file_hashes(out) == want
    assert stat_of(kept) == kept  # shards finished before a kill were never rewritten
    assert not [p for p in shard_dir.iterdir() if ".tmp-" in p.name]


# ---- pieces ----------------------------------------------------------------------------------------------

def test_index_writer_matches_megatron_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(indexed, "CHUNK", 3)  # several chunks of lengths, offsets and document indices
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 60_000, size=n).astype(np.uint16) for n in (5, 1, 9, 2, 7, 3, 1, 4, 8, 6, 2)]
    w = indexed.IndexedWriter(str(tmp_path / "x.bin"), str(tmp_path / "x.idx"), "uint16", str(tmp_path / "x.len"))
    w.add(np.concatenate(docs[:4]), [len(d) for d in docs[:4]])
    w.add(np.concatenate(docs[4:]), [len(d) for d in docs[4:]])
    stats = w.finish()
    assert stats["docs"] == len(docs) and stats["tokens"] == sum(map(len, docs))
    assert stats["idx"]["bytes"] == 34 + len(docs) * 12 + (len(docs) + 1) * 8
    ds, seqs = megatron_sequences(tmp_path / "x")
    assert seqs == [d.tolist() for d in docs]
    assert list(ds.index.sequence_pointers) == list(np.concatenate(([0], np.cumsum([len(d) * 2 for d in docs])[:-1])))
    assert not (tmp_path / "x.len").exists()


README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
  - split: validation
    path: data/validation-*
- config_name: math
  data_files:
  - split: train
    path: math/*.parquet
---
# card
"""


def test_hub_file_selection():
    files = ["README.md", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
             "data/validation-00000-of-00001.parquet", "math/part-0.parquet", "math/part-1.parquet", ".gitattributes"]
    configs = hub.card_configs(README)
    assert [c["config_name"] for c in configs] == ["default", "math"]
    assert hub.select_data_files("o/n", files, configs, None, "train") == files[1:3]
    assert hub.select_data_files("o/n", files, configs, None, "valid") == [files[3]]
    assert hub.select_data_files("o/n", files, configs, "math", "train") == files[4:6]
    assert hub.select_data_files("o/n", files, configs, None, "train", "math/*-1.parquet") == [files[5]]
    with pytest.raises(hub.DataPrepError, match="no subset 'code'"):
        hub.select_data_files("o/n", files, configs, "code", "train")
    with pytest.raises(hub.DataPrepError, match="no split 'test'"):
        hub.select_data_files("o/n", files, configs, "math", "test")
    # no card configs: the layout decides
    plain = ["en/train/0.jsonl.zst", "en/test/0.jsonl.zst", "de/train/0.jsonl.zst"]
    assert hub.select_data_files("o/n", plain, [], "en", "train") == ["en/train/0.jsonl.zst"]
    assert hub.select_data_files("o/n", ["a/x.parquet", "b/y.parquet"], [], None, "train") == ["a/x.parquet",
                                                                                                "b/y.parquet"]
    assert hub.parse_hf_path("hf://nvidia/Nemotron-CC-v2") == ("nvidia/Nemotron-CC-v2", None)
    assert hub.parse_hf_path("hf://datasets/o/n/data/*.parquet") == ("o/n", "data/*.parquet")


def test_one_writer_per_output_dir(ray_cluster, tmp_path):
    """A second run into an output dir another live run holds refuses, naming it; a dead run's lock is taken."""
    import socket

    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".ultra3-lock"
    lock.write_text(json.dumps({"job": "ultra3-data-prep-pretrain_other", "host": socket.gethostname(),
                                "pid": os.getpid(), "since": "2026-01-01 00:00:00"}))  # this test: alive
    r = prep(tiny_config(out), tmp_path, env=ray_cluster)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert r.rc == 2 and len(lines) == 1 and lines[0].startswith(
        f"ultra3 data prep pretrain: error: {out} is being written by ultra3-data-prep-pretrain_other (pid "
        f"{os.getpid()} on {socket.gethostname()}, since 2026-01-01 00:00:00); wait for it or cancel it"), r.err
    assert sorted(p.name for p in out.iterdir()) == [".ultra3-lock"]  # nothing written
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"job": "killed", "host": socket.gethostname(), "pid": int(dead.stdout)}))
    again = prep(tiny_config(out), tmp_path, env=ray_cluster)
    assert again.rc == 0, again.err
    assert not lock.exists() and (out / "blend.json").exists()
