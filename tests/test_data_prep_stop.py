"""The time-limit signal in the data preps (recipes/dataprep/stop.py), with real processes and files: SIGUSR1, sent
to every process of the run's session as Slurm sends it to a job step's (its workers' and Ray's too), once some
tasks are done, ends the run with exit 75 (CONTINUE_EXIT) and one line, the finished shards kept by their receipts
and nothing else left (no temporary file, no blend, no lock); the next run goes on from them and ends with every
file byte for byte that of an uninterrupted run. An allocation that finishes nothing exits 1 with one line; a
signal once every task is done changes nothing. The runs start with the signal ignored, as recipes/attempts.py
starts them. The time from the signal to the exit is printed (`-s`)."""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import stage_config
from recipes.contract import ATTEMPTS_FILE, CONTINUE_EXIT
from recipes.dataprep import cluster, lock, stop

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_"))}, "PYTHONPATH": str(REPO),
       "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
STOPPED = re.compile(r"^(ultra3 data prep \w+): stopped for the time limit: (\d+) of (\d+) (\w+) done, (\d+) left for "
                     r"the next allocation(.*)$", re.M)


# ---- the stream of tasks, in this process ----------------------------------------------------------------

def sleeper(i: int, seconds: float, marks: str) -> int:
    """A task that says when it starts and when it ends."""
    Path(marks, f"started-{i}").touch()
    time.sleep(seconds)
    Path(marks, f"ended-{i}").touch()
    return i


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with stop.armed(), cluster.Cluster("processes") as c:
        c.start(processes=2)
        yield c


def test_the_signal_ends_the_running_tasks_and_starts_no_more(pool, tmp_path):
    results, pids = [], []
    with pytest.raises(stop.TimeLimit):
        for event in pool.stream(sleeper, [(0, 0.0, tmp_path), (1, 0.0, tmp_path)] + [(i, 30.0, tmp_path)
                                                                                       for i in range(2, 8)], 2):
            if event is not None:
                results.append(event[1])
                if len(results) == 2:  # both quick ones back: two long ones run
                    pids = [p.pid for p in pool.pool.processes()]
                    while len(list(tmp_path.glob("started-*"))) < 4:
                        time.sleep(0.01)
                    signalled = time.time()
                    os.kill(os.getpid(), stop.SIGNAL)
    assert time.time() - signalled < 5 and sorted(results) == [0, 1]
    assert pids and not any(_alive(pid) for pid in pids)  # the workers are gone: nothing they write comes after
    time.sleep(0.5)
    assert sorted(p.name for p in tmp_path.glob("started-*")) == [f"started-{i}" for i in range(4)]
    assert sorted(p.name for p in tmp_path.glob("ended-*")) == ["ended-0", "ended-1"]


def test_a_signal_once_the_last_task_is_done_changes_nothing(pool, tmp_path):
    got = []
    for event in pool.stream(sleeper, [(i, 0.0, tmp_path) for i in range(3)], 2):
        if event is not None:
            got.append(event[1])
            if len(got) == 3:
                os.kill(os.getpid(), stop.SIGNAL)
                time.sleep(0.1)
    assert sorted(got) == [0, 1, 2] and stop.requested()  # seen, and nothing to stop


# ---- force: the first attempt's --------------------------------------------------------------------------

def test_force_redoes_everything_in_the_first_attempt_only(tmp_path):
    from recipes.data_prep_pretrain import parse_settings

    cfg = {**stage_config("data_prep/pretrain"), "datasets": [{"name": "a", "path": "x"}], "tokenizer": "t",
           "output_dir": str(tmp_path / "out"), "force": True, "job": {"id": "j", "dir": str(tmp_path)}}
    assert parse_settings(cfg).force  # no ledger: a run outside a supervised job
    ledger = tmp_path / ATTEMPTS_FILE
    ledger.write_text(json.dumps({"event": "start", "attempt": 1}) + "\n")
    assert parse_settings(cfg).force
    ledger.write_text(ledger.read_text() + json.dumps({"event": "end", "attempt": 1, "outcome": "continue"}) + "\n"
                      + json.dumps({"event": "start", "attempt": 2}) + "\n")
    assert not parse_settings(cfg).force  # the stopped run goes on from what the first attempt finished
    assert not parse_settings({**cfg, "force": False}).force


# ---- the runtimes, as subprocesses -----------------------------------------------------------------------

def start(module: str, cfg: dict, where: Path) -> subprocess.Popen:
    """The runtime in a session of its own, the signal ignored until it installs its handler (as the job's
    supervisor starts it)."""
    path = where / f"config-{len(list(where.glob('config-*')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.Popen([sys.executable, "-m", f"recipes.{module}", "--config", str(path)], cwd=where, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(stop.SIGNAL, signal.SIG_IGN))


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(module: str, cfg: dict, where: Path) -> subprocess.CompletedProcess:
    return finish(start(module, cfg, where))


def files(root: Path, pattern: str) -> list[str]:
    """The files under `root` (hidden folders too) whose name matches `pattern`."""
    return [os.path.join(d, f) for d, _, names in os.walk(root) for f in names if fnmatch.fnmatch(f, pattern)]


def wait_for_files(proc: subprocess.Popen, root: Path, pattern: str, count: int) -> None:
    deadline = time.time() + 240
    while len(files(root, pattern)) < count:
        assert proc.poll() is None, f"the run ended before {count} {pattern}: " + finish(proc).stdout
        assert time.time() < deadline, f"no {count} {pattern} within 240 s"
        time.sleep(0.005)


def signal_session(proc: subprocess.Popen) -> float:
    """SIGUSR1 to every process of the run's session, as Slurm sends it to every process of the step; when."""
    at = time.time()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[3]) == proc.pid:
                os.kill(int(pid), stop.SIGNAL)
        except (OSError, IndexError, ValueError):
            pass
    return at


def stopped_at(proc: subprocess.Popen, root: Path, pattern: str, count: int) -> tuple[subprocess.CompletedProcess,
                                                                                       float]:
    """The run signalled once `count` files named like `pattern` exist: how it ended, and the seconds it took."""
    wait_for_files(proc, root, pattern, count)
    at = signal_session(proc)
    done = finish(proc)
    return done, time.time() - at


def leftovers(root: Path) -> list[str]:
    """What an ended run must not leave: files under temporary names, the output dir's lock."""
    return files(root, "*.tmp-*") + files(root, lock.LOCK)


def assert_same_files(got: Path, want: Path) -> None:
    """Every file byte for byte (blend.json names its shards by their absolute paths: each root as ROOT)."""
    listing = [sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) for root in (got, want)]
    assert listing[0] == listing[1]
    for name in listing[1]:
        a, b = (((root / name).read_bytes().replace(str(root).encode(), b"ROOT")) for root in (got, want))
        assert a == b, name


def words_corpus(path: Path, docs: int) -> Path:
    """Generated documents of random words: the shards of a worker take a few tenths of a second each."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    with gzip.open(path, "wt", compresslevel=1) as f:
        for _ in range(docs):
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=100))}) + "\n")
    return path


def pretrain_config(out: Path, datasets: list, **over) -> dict:
    return {**stage_config("data_prep/pretrain"), "datasets": datasets, "tokenizer": str(TINY),
            "output_dir": str(out), "workers": 1, "progress_interval": 1, "object_store_mb": 100,
            "job": {"id": "test"}, **over}


def test_an_allocation_that_finishes_no_shard_exits_1_with_one_line(tmp_path):
    out = tmp_path / "out"
    cfg = pretrain_config(out, [{"name": "stories", "path": str(TINY / "corpus.jsonl.gz")}], num_shards=1,
                          backend="processes", encoder="tokenizers")  # one shard of 2,600 documents: a while
    done, seconds = stopped_at(start("data_prep_pretrain", cfg, tmp_path), out, "shard_000000.bin.tmp-*", 1)
    print(f"\nno shard finished: exit {done.returncode} {seconds:.2f} s after the signal")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ("ultra3 data prep pretrain: error: the time limit came before any of the 1 shards finished "
                           "in this allocation (0 done in earlier ones): the next would get no further; give each "
                           "allocation more time (run.time), or make the shards smaller (a larger num_shards)\n")
    assert not files(out, "shard_*") and not leftovers(out) and not (out / "blend.json").exists()


@pytest.mark.heavy  # three data prep runs (embedded Ray: its start, twice), 10-60 s
@pytest.mark.parametrize("backend", ["processes", "ray"])
def test_pretrain_stops_and_the_next_allocation_ends_byte_identical(tmp_path, backend):
    corpus = words_corpus(tmp_path / "corpus.jsonl.gz", 30_000)
    datasets = [{"name": "words", "path": str(corpus)}, {"name": "stories", "path": str(TINY / "corpus.jsonl.gz")}]
    whole = run("data_prep_pretrain", pretrain_config(tmp_path / "whole", datasets, num_shards=6), tmp_path)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "out"
    cfg = pretrain_config(out, datasets, num_shards=6, backend=backend)
    done, seconds = stopped_at(start("data_prep_pretrain", cfg, tmp_path), out, "shard_*.json", 2)
    print(f"\npretrain ({backend}): exit {done.returncode} {seconds:.2f} s after the signal")
    assert done.returncode == CONTINUE_EXIT, done.stdout + done.stderr
    line = STOPPED.search(done.stdout)
    assert line and line.group(1, 3, 4, 6) == ("ultra3 data prep pretrain", "12", "shards", ""), done.stdout
    kept = files(out, "shard_*.json")
    assert int(line.group(2)) == len(kept) and 2 <= len(kept) < 12 and int(line.group(5)) == 12 - len(kept)
    assert done.stderr == "" and not leftovers(out), done.stderr
    assert not (out / "blend.json").exists() and not (out / "manifest.json").exists()
    receipts = {p: os.stat(p).st_mtime_ns for p in kept}

    # the next allocation, signalled once its last shard is done: it ends as usual
    again = start("data_prep_pretrain", cfg, tmp_path)
    wait_for_files(again, out, "shard_*.json", 12)
    signal_session(again)
    done = finish(again)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"shards written {12 - len(kept)}, reused {len(kept)}" in done.stdout
    assert {p: os.stat(p).st_mtime_ns for p in kept} == receipts  # kept, not written again
    assert_same_files(out, tmp_path / "whole")


def sft_config(out: Path, chats: Path, **over) -> dict:
    return {**stage_config("data_prep/sft"), "datasets": [{"name": "chat", "path": str(chats)}],
            "tokenizer": str(TINY / "tokenizer.json"), "output_dir": str(out), "num_shards": 6, "workers": 1,
            "backend": "processes", "progress_interval": 1, "job": {"id": "test"}, **over}


@pytest.mark.heavy  # three SFT data prep runs, 15-25 s
@pytest.mark.parametrize("phase, receipts, unit", [("tokenize", "part_*.npz", "partitions"),
                                                   ("write", "*-shard_*.json", "shards")])
def test_sft_stops_and_the_next_allocation_ends_byte_identical(tmp_path, phase, receipts, unit):
    import itertools

    from recipes.samples.make_tiny_sft import conversations

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in itertools.islice(conversations(), 4000)))
    whole = run("data_prep_sft", sft_config(tmp_path / "whole", chats), tmp_path)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "out"
    done, seconds = stopped_at(start("data_prep_sft", sft_config(out, chats), tmp_path), out, receipts, 1)
    print(f"\nsft ({phase}): exit {done.returncode} {seconds:.2f} s after the signal")
    assert done.returncode == CONTINUE_EXIT, done.stdout + done.stderr
    line = STOPPED.search(done.stdout)
    kept = files(out, receipts)
    assert line and line.group(1, 4) == ("ultra3 data prep sft", unit), done.stdout
    assert int(line.group(2)) == len(kept) and 0 < len(kept) < int(line.group(3))
    assert line.group(6) == (", then the packed shards" if phase == "tokenize" else "")
    assert done.stderr == "" and not leftovers(out), done.stderr
    assert [p.name for p in out.iterdir()] == [Path(kept[0]).parts[-3]]  # the staging dir alone

    done = run("data_prep_sft", sft_config(out, chats), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(kept)} of {line.group(3)} " in done.stdout and "kept from an earlier run" in done.stdout
    assert_same_files(out, tmp_path / "whole")


@pytest.mark.heavy  # three RL data prep runs over 3 x 25 MB blends, 10-20 s
def test_rl_stops_and_the_next_allocation_ends_byte_identical(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    tiny = [json.loads(line) for line in (TINY / "rl" / "rlvr1.jsonl").read_text().splitlines()]
    for b in ("a", "b", "c"):
        with open(src / f"{b}.jsonl", "w") as f:
            for i in range(12_000):
                f.write(json.dumps({**tiny[i % len(tiny)], "uuid": f"{b}-{i}", "context": "x" * 2000}) + "\n")
    shipped = stage_config("data_prep/rl")
    sources = {"dapo": "dapo-math-17k.jsonl", "skywork": "skywork-or1-math.jsonl"}
    cfg = {**shipped, "source": str(src), "blends": ["a", "b", "c"], "val_rows": 100, "workers": 1,
           "backend": "processes", "progress_interval": 1, "job": {"id": "test"},
           "placeholders": {s: {**shipped["placeholders"][s], "path": str(TINY / "rl" / "sources" / f)}
                            for s, f in sources.items()}}
    whole = run("data_prep_rl", {**cfg, "output_dir": str(tmp_path / "whole")}, tmp_path)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "out"
    done, seconds = stopped_at(start("data_prep_rl", {**cfg, "output_dir": str(out)}, tmp_path), out, "a.json", 1)
    print(f"\nrl: exit {done.returncode} {seconds:.2f} s after the signal")
    assert done.returncode == CONTINUE_EXIT, done.stdout + done.stderr
    line = STOPPED.search(done.stdout)
    assert line and line.group(1, 3, 4) == ("ultra3 data prep rl", "3", "blends"), done.stdout
    assert done.stderr == "" and not leftovers(out) and not (out / "metadata.json").exists(), done.stderr

    done = run("data_prep_rl", {**cfg, "output_dir": str(out)}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{3 - int(line.group(2))} to prepare, {line.group(2)} kept from an interrupted run" in done.stdout
    assert_same_files(out, tmp_path / "whole")


# ---- on Slurm: a Ray cluster over two nodes (recipes/ray_nodes.py), the runtime its driver on the first ----------

TWO_NODES = """
[two-nodes]
extends = "ci-cpu"
partition = "multi"
"""


@pytest.mark.slurm
def test_a_two_node_ray_data_prep_stops_at_the_signal_and_its_next_allocation_ends_byte_identical(slurm, cli, home,
                                                                                                   tmp_path):
    from conftest import wait_for
    from test_long_runs_slurm import ended, ledger, shards_done, submit

    Path("env.toml").write_text(Path("env.toml").read_text() + TWO_NODES)
    corpus = words_corpus(tmp_path / "corpus.jsonl.gz", 60_000)
    config = tmp_path / "words.yaml"
    config.write_text(f"defaults: [tiny]\nnum_shards: 12\nprogress_interval: 1\ndatasets:\n"
                      f"  - {{name: words, path: {corpus}, text_field: text}}\n")
    job_id, job_dir, slurm_id = submit(cli, config, "two-nodes", "run.nodes=2")
    assert wait_for(lambda: shards_done(job_dir) >= 2, timeout=240, interval=0.05), "no shard done"
    signalled = time.time()
    subprocess.run(["scancel", "--signal=USR1", slurm_id], check=True)  # what Slurm sends at run.grace_s
    status = ended(cli, job_id, timeout=400)
    assert "state:     COMPLETED (exit code 0)" in status, status
    ends = [e for e in ledger(job_dir) if e["event"] == "end"]
    assert [(e["attempt"], e["outcome"]) for e in ends] == [(1, "continue"), (2, "done")]
    print(f"\ntwo nodes: attempt 1 ended {ends[0]['at'] - signalled:.1f} s after the signal")
    logs = cli("jobs", "logs", job_id, prog="nemotron").out
    line = STOPPED.search(logs)
    assert line and line.group(1, 3, 4) == ("ultra3 data prep pretrain", "12", "shards"), logs[-3000:]
    assert "ray cluster up: 2 nodes" in logs and "Traceback" not in logs, logs[-3000:]
    assert f"shards written {12 - int(line.group(2))}, reused {line.group(2)}" in logs

    whole_id, whole_dir, _ = submit(cli, config, "ci-cpu")  # one node, one allocation: the pool of processes
    assert "state:     COMPLETED (exit code 0)" in ended(cli, whole_id)
    assert_same_files(job_dir / "data", whole_dir / "data")
