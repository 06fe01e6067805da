"""Faults during `ultra3 data prep pretrain` (the runtime run as a job runs it, on the process pool), with real
processes and a real filesystem: the output dir's lock of a run killed with SIGKILL whose process is still a
zombie (its parent has not reaped it yet), or whose pid another process has since, is taken over at once, and
the run that takes it ends with the bytes of an uninterrupted run; a full disk (a size-limited tmpfs) ends in
one line and exit 2, with no temporary file and no lock left, and a run with space again resumes to the same
bytes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import kill_session, stage_config
from recipes.contract import INPUT_ERROR_EXIT
from recipes.dataprep import lock
from recipes.dataprep.errors import DataPrepError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny"
PROG = "ultra3 data prep pretrain"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_"))}, "PYTHONPATH": str(REPO)}


def config(where: Path, out: Path, encoder: str = "auto") -> Path:
    """The tiny blend, one shard at a time; with `tokenizers`, slow enough to be killed halfway (the bytes are the
    same with any encoder)."""
    cfg = {**stage_config("data_prep/pretrain"),
           "datasets": [{"name": "stories", "path": str(TINY / "corpus.jsonl.gz"), "weight": 3.0},
                        {"name": "encyclopedia", "path": str(TINY / "encyclopedia.parquet"), "text_field": "content"}],
           "tokenizer": str(TINY), "output_dir": str(out), "num_shards": 4, "backend": "processes", "workers": 1,
           "encoder": encoder, "job": {"id": "test"}}
    path = where / f"config-{out.name}-{encoder}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(cfg: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recipes.data_prep_pretrain", "--config", str(cfg)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def prep(cfg: Path) -> subprocess.CompletedProcess:
    p = start(cfg)
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def file_hashes(root: Path) -> dict:
    """sha256 of every file under `root` (blend.json's absolute prefixes written as ROOT)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes().replace(str(root).encode(), b"ROOT")).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def temporary(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if ".tmp-" in p.name or p.name == lock.LOCK]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The hashes of an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("reference")
    r = prep(config(tmp, tmp / "out"))
    assert r.returncode == 0, r.stderr
    return file_hashes(tmp / "out")


def lock_pid(out: Path) -> int | None:
    """The pid the output dir's lock names, once written."""
    try:
        return json.loads((out / lock.LOCK).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


# ---- the lock of a run that is gone ----------------------------------------------------------------------

@pytest.mark.heavy  # real data-prep runs, killed (7 s)
@pytest.mark.parametrize("when", ["lock taken", "first shard published"])
def test_a_killed_run_not_yet_reaped_does_not_hold_the_lock(reference, tmp_path, when):
    out = tmp_path / "out"
    ready = {"lock taken": lambda: lock_pid(out) is not None,
             "first shard published": lambda: any(out.glob("*/shard_*.json"))}[when]
    run = start(config(tmp_path, out, encoder="tokenizers"))
    try:
        deadline = time.time() + 120
        while not ready():
            assert run.poll() is None and time.time() < deadline, f"the run ended before {when}"
            time.sleep(0.005)
        os.kill(run.pid, signal.SIGKILL)  # the run, not reaped: a zombie until wait()
        kill_session(run.pid, keep=run.pid)
        while state(run.pid) != "Z":
            time.sleep(0.005)
        assert lock_pid(out) == run.pid
        again = prep(config(tmp_path, out))
        assert state(run.pid) == "Z"  # still not reaped while the second run took over
    finally:
        run.kill()
        run.communicate()
    assert again.returncode == 0, again.stderr
    assert file_hashes(out) == reference


def holder(out: Path) -> subprocess.Popen:
    """A process that takes `out`'s lock (as a run does), says so and sleeps."""
    script = (f"import time; from recipes.dataprep import lock\n"
              f"with lock.holding({str(out)!r}, 'holder'):\n"
              f"    print('held', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", script], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


def test_the_lock_is_taken_from_a_zombie_and_from_a_process_with_its_pid_since(tmp_path):
    out = tmp_path / "out"
    live = holder(out)
    try:
        with pytest.raises(DataPrepError, match=rf"is being written by holder \(pid {live.pid} on "):
            with lock.holding(str(out), "second"):
                pass
        live.kill()  # not reaped yet: a zombie
        time.sleep(0.2)
        assert state(live.pid) == "Z"
        with lock.holding(str(out), "second"):
            assert json.loads((out / lock.LOCK).read_text())["job"] == "second"
    finally:
        live.kill()
        live.wait()
    # a lock naming a live process started after the one that took it: its pid is another's now
    other = subprocess.Popen(["sleep", "60"])
    try:
        held = {"job": "gone", "host": socket.gethostname(), "pid": other.pid, "since": "2026-01-01 00:00:00"}
        out.mkdir(exist_ok=True)
        (out / lock.LOCK).write_text(json.dumps({**held, "started": "1"}))
        with lock.holding(str(out), "third"):
            assert json.loads((out / lock.LOCK).read_text())["job"] == "third"
        (out / lock.LOCK).write_text(json.dumps({**held, "started": lock._started(other.pid)}))
        with pytest.raises(DataPrepError, match=rf"is being written by gone \(pid {other.pid} on "):
            with lock.holding(str(out), "fourth"):
                pass
    finally:
        other.kill()
        other.wait()


def test_an_output_dir_that_cannot_be_written_is_one_line(read_only):
    with pytest.raises(DataPrepError, match=rf"^output_dir {read_only} is not writable \(.+\); choose a writable "):
        with lock.holding(str(read_only), "job"):
            pass
    with pytest.raises(DataPrepError, match=rf"^output_dir {read_only}/out cannot be created \(.+\); choose a "):
        with lock.holding(str(read_only / "out"), "job"):
            pass


# ---- a full disk -----------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of a size set by the test (mount -o remount,size=...): a real filesystem that fills up."""
    where = tmp_path / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")

    def resize(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)

    yield where, resize
    subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.mark.heavy  # real data-prep runs on a filled tmpfs (8 s)
def test_a_full_disk_ends_in_one_line_and_the_run_resumes_with_space(reference, tmp_path, small_disk):
    disk, resize = small_disk
    out = disk / "out"
    cfg = config(tmp_path, out)
    kept: list[str] = []
    # room for nothing (the lock), the plan, some shards, all shards but one; each run resumes the one before
    for size in ("4k", "64k", "400k", "1200k"):
        resize(size)
        r = prep(cfg)
        assert r.returncode == INPUT_ERROR_EXIT, r.stdout + r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"{PROG}: error: No space left on device: the filesystem of output_dir (or "
                                   "hf_cache_dir) is full; free space or choose another output_dir"), r.stderr
        assert temporary(disk) == []
        left = file_hashes(out) if out.exists() else {}
        assert "blend.json" not in left
        published = [name for name in left if name.endswith(".json") and "/shard_" in name]
        assert set(kept) <= set(published)  # what a run finished stays
        kept = published
        for name in kept:  # and is whole: the uninterrupted run's bytes
            for ext in (".json", ".bin", ".idx"):
                assert left[name.removesuffix(".json") + ext] == reference[name.removesuffix(".json") + ext]
    assert 0 < len(kept) < 8
    resize("16m")
    again = prep(cfg)
    assert again.returncode == 0, again.stderr
    assert f"reused {len(kept)};" in again.stdout, again.stdout
    assert file_hashes(out) == reference
    assert temporary(disk) == []
