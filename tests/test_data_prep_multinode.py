"""Multi-node jobs on the local Slurm cluster's two nodes (partition `multi`: localhost on 127.0.0.1 and
localhost2 on 127.0.0.2, each its own slurmd): `data prep pretrain|sft` on a Ray cluster spanning both
(head and driver on node 0, a worker on node 1), byte for byte the output of a one-node job; and the
torchrun stage's per-node launch (its rendezvous from the Slurm environment, a preflight on every node)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import REPO
from test_data_prep_slurm import finish, submit

pytestmark = pytest.mark.slurm

PROFILES = """
[two-nodes]
extends = "ci-cpu"
partition = "multi"

[two-gpu-nodes]
extends = "ci"
partition = "multi"
"""
TWO = "run.nodes=2"  # the tiny configs size their jobs (one node): a profile's `nodes` would not change that
NODES = ["node 0 of 2: localhost", "node 1 of 2: localhost2"]


@pytest.fixture
def two_nodes(slurm, home):
    nodes = subprocess.run(["sinfo", "-h", "-p", "multi", "-o", "%D"], capture_output=True, text=True,
                           check=False).stdout
    assert nodes.strip() == "2", "no 2-node partition 'multi': re-run scripts/slurm-local/start.sh (as root)"
    with open("env.toml", "a") as f:
        f.write(PROFILES)


def run_both(cli, *stage: str, config: str = "tiny") -> tuple[Path, Path, str]:
    """The stage on one node and on two at once; (one-node job dir, two-node job dir, two-node log)."""
    one = submit(cli, *stage, "-c", config, "--batch", "ci-cpu")
    two = submit(cli, *stage, "-c", config, "--batch", "two-nodes", TWO)
    finish(cli, one[0])
    _, log = finish(cli, two[0])
    for line in [*NODES, "ray cluster up: 2 nodes (127.0.0.1 with 1 CPU(s), 127.0.0.2 with 1 CPU(s))"]:
        assert line in log, log[-3000:]
    assert log.count("preflight ok on ") == 2, log[-3000:]
    # the worker node's Ray stopped before the head's: no RpcError traceback from a node that lost its head
    assert "Traceback" not in log and "RpcError" not in log, log[-3000:]
    assert list(Path(two[1]).glob("ray-*.stopped-1")), sorted(p.name for p in Path(two[1]).iterdir())
    return Path(one[1]), Path(two[1]), log


def tasks_on(log: str) -> dict[str, dict[str, int]]:
    """The launcher's `ray tasks per node:` line as {node IP: {task: count}}."""
    line = re.search(r"ray tasks per node: (.*)$", log, re.M)
    assert line, log[-3000:]
    return {node: {name: int(n) for n, name in (t.split(" ", 1) for t in tasks.split(", "))}
            for node, tasks in (part.split(": ", 1) for part in line.group(1).split("; "))}


def assert_same_output(one: Path, two: Path, *data: str) -> list[Path]:
    """The two jobs wrote the same data files, byte for byte (their metadata differ: the inputs' paths,
    in each job's own code dir, are part of the plan's hash)."""
    def files(job: Path) -> list[Path]:
        return sorted(p.relative_to(job / "data") for p in (job / "data").rglob("*") if p.suffix in data)

    assert files(one) and files(one) == files(two), (files(one), files(two))
    for rel in files(one):
        assert (one / "data" / rel).read_bytes() == (two / "data" / rel).read_bytes(), \
            f"{rel} differs between the 1-node and the 2-node job"
    return files(two)


def test_pretrain_data_prep_on_two_nodes(two_nodes, cli, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    # the tiny corpus 24 times over (11M tokens, some seconds a shard): work enough for node 1's Ray
    # workers, which start a few seconds after node 0's, to take shards too
    corpus = gzip.decompress((REPO / "recipes/samples/tiny/corpus.jsonl.gz").read_bytes())
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(corpus * 24, compresslevel=1))
    (tmp_path / "big.yaml").write_text(f"defaults: [tiny]\nnum_shards: 12\ndatasets:\n"
                                       f"  - {{name: big, path: {tmp_path / 'big.jsonl.gz'}, text_field: text}}\n")
    one, two, log = run_both(cli, "data", "prep", "pretrain", config=str(tmp_path / "big.yaml"))
    shards = {node: tasks.get("write_shard", 0) for node, tasks in tasks_on(log).items()}
    assert shards.keys() == {"127.0.0.1", "127.0.0.2"} and all(shards.values()), shards  # both wrote shards

    files = assert_same_output(one, two, ".bin", ".idx")
    assert sum(1 for f in files if f.suffix == ".bin") == 12, files
    blend = json.loads((two / "data" / "blend.json").read_text())
    prefixes = [p for split in blend.values() for p in split[1::2]]
    assert prefixes and all(p.startswith(str(two)) for p in prefixes), prefixes
    docs = sum(len(IndexedDataset(p)) for p in prefixes)
    manifest = json.loads((two / "data" / "manifest.json").read_text())
    assert docs == manifest["totals"]["docs"] > 0


def test_sft_data_prep_on_two_nodes(two_nodes, cli):
    one, two, log = run_both(cli, "data", "prep", "sft")
    assert tasks_on(log), log[-3000:]

    parquet = [two / "data" / f for f in assert_same_output(one, two, ".parquet")]
    rows = sum(pq.read_table(p).num_rows for p in parquet)
    assert rows > 0 and {"input_ids", "seq_start_id", "loss_mask"} <= set(pq.read_table(parquet[0]).column_names)


def test_torchrun_stage_runs_its_preflight_on_both_nodes(two_nodes, cli):
    job_id, job_dir = submit(cli, "pretrain", "-c", "tiny", "--batch", "two-gpu-nodes", TWO)
    status, log = finish(cli, job_id, "FAILED (exit code 3)")
    assert all(line in log for line in NODES), log[-3000:]
    failed = re.findall(r"PREFLIGHT FAILED on \S+: [^\n]*?not importable: megatron\.bridge", log)
    assert len(failed) == 2, log[-3000:]  # one line per node
    assert re.search(r"^reason:\s+PREFLIGHT FAILED on \S+: ", status, re.M), status

    # what each node's launcher would start once its preflight passes: rendezvous at the first node
    code = Path(job_dir) / "pretrain" / "code"
    probe = ("import yaml; from recipes import launch; print(' '.join(launch.torchrun_argv("
             "yaml.safe_load(open('config.yaml')), 'recipes.pretrain', 'config.yaml')))")
    sbatch_log = next((Path(job_dir) / "pretrain").glob("sbatch_*.out")).read_text()
    head = re.search(r"^\+ export ULTRA3_HEAD_NODE=(\S+)$", sbatch_log, re.M)  # as the job script set it
    assert head and head.group(1) == "127.0.0.1", sbatch_log
    ran = subprocess.run(["srun", "-p", "multi", "-N", "2", "-A", "ultra3", "-t", "1", "--chdir", str(code),
                          f"--export=ALL,ULTRA3_HEAD_NODE={head.group(1)}", sys.executable, "-c", probe],
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    argvs = sorted(ran.stdout.splitlines())
    assert len(argvs) == 2, ran.stdout
    for rank, argv in enumerate(argvs):
        assert argv.split()[1:] == ["-m", "torch.distributed.run", "--nproc-per-node=1", "--nnodes=2",
                                    f"--node-rank={rank}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29500",
                                    f"--rdzv-id={job_id}", "--module", "recipes.pretrain", "--config",
                                    "config.yaml"], argv
