"""`data prep pretrain|sft -c tiny --batch <local Slurm profile>` through the spine: the job ends
COMPLETED in `nemotron jobs status`, and its output reads back with the real readers."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import wait_for

pytestmark = pytest.mark.slurm


def submit(cli, *argv: str) -> tuple[str, str]:
    """Submit a job; its (job id, job dir)."""
    sub = cli(*argv)
    assert sub.rc == 0, sub.err
    return sub.out.split()[1], sub.out.split("job dir: ", 1)[1].split()[0]


def finish(cli, job_id: str, state: str = "COMPLETED (exit code 0)") -> tuple[str, str]:
    """Wait for the job to end in `state`; its (status, log)."""
    ended = wait_for(lambda: (r := cli("jobs", "status", job_id, prog="nemotron")).rc == 0 and
                     any(s in r.out for s in ("COMPLETED", "FAILED", "CANCELLED")) and r, timeout=300, interval=2)
    logs = cli("jobs", "logs", job_id, prog="nemotron").out
    if not (ended and f"state:     {state}" in ended.out):  # the whole status and log tail, untruncated
        pytest.fail(f"job {job_id} did not end {state}:\n{ended and ended.out}\n--- log tail ---\n{logs[-6000:]}",
                    pytrace=False)
    return ended.out, logs


def _run_to_completion(cli, *stage: str) -> tuple[str, str]:
    job_id, job_dir = submit(cli, *stage, "-c", "tiny", "--batch", "ci")
    return job_dir, finish(cli, job_id)[1]


def test_pretrain_data_prep_on_slurm(slurm, cli, home):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    job_dir, logs = _run_to_completion(cli, "data", "prep", "pretrain")
    assert "preflight ok" in logs
    blend = json.loads(Path(job_dir, "data", "blend.json").read_text())
    prefixes = [p for split in blend.values() for p in split[1::2]]
    assert prefixes and all(Path(p + ".bin").is_file() for p in prefixes)
    docs = sum(len(IndexedDataset(p)) for p in prefixes)
    manifest = json.loads(Path(job_dir, "data", "manifest.json").read_text())
    assert docs == manifest["totals"]["docs"] == sum(d["docs"] for d in manifest["datasets"]) > 0


def test_sft_data_prep_on_slurm(slurm, cli, home):
    job_dir, _ = _run_to_completion(cli, "data", "prep", "sft")
    files = sorted(Path(job_dir, "data", "train").glob("*.parquet"))
    assert files
    table = pq.read_table(files[0])
    assert {"input_ids", "seq_start_id", "loss_mask"} <= set(table.column_names)
    for ids, starts in zip(table.column("input_ids").to_pylist(), table.column("seq_start_id").to_pylist()):
        lengths = [b - a for a, b in zip(starts, starts[1:] + [len(ids)])]
        assert sum(n - 1 for n in lengths) <= 512  # Megatron-Bridge counts len - 1 tokens per sequence
