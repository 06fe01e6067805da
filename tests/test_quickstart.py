"""The README's set-up command, through the real CLI on this machine: the tiny data prep on the embedded
Ray, then the tiny pretraining dry run that finds its blend.json in the artifact store by itself."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # Ray, torch, NeMo-Run or real jobs: not in the fast tier


def test_tiny_data_prep_then_the_pretrain_dry_run_that_reads_it(cli, home):
    prep = cli("data", "prep", "pretrain", "-c", "tiny")
    assert prep.rc == 0, prep.err + prep.out[-2000:]
    job = re.search(r"^submitted (\S+) ", prep.out, re.M).group(1)
    published = re.search(r"^published (ultra3-pretrain-data-tiny:v1) -> (\S+)$", prep.out, re.M)
    assert published and "COMPLETED" in prep.out, prep.out[-2000:]
    path = Path(published.group(2))
    blend = json.loads(path.read_text())
    assert set(blend) == {"train", "valid", "test"} and blend["train"]

    dry = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false")
    assert dry.rc == 0, dry.err
    assert re.search(rf"^dataset.blend_path = {re.escape(str(path))}  \(from {job} completed "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d, ultra3-pretrain-data-tiny:v1\)$", dry.out, re.M), dry.out
    explicit = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false", f"dataset.blend_path={path}")
    assert re.search(rf"^dataset.blend_path +\= {re.escape(str(path))}  <- command line$", explicit.out, re.M)

    # a blend naming shards that are gone is caught before anything runs
    first = blend["train"][1]  # [weight, prefix, ...] with absolute prefixes
    for ext in (".bin", ".idx"):
        os.unlink(first + ext)
    broken = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false")
    assert broken.rc == 2 and broken.err_lines[0].startswith("error: dataset.blend_path: ")
    assert "without .bin/.idx" in broken.err


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("stage", ["pretrain", "sft"])
def test_a_second_local_run_into_the_same_output_reuses_everything_byte_for_byte(cli, home, tmp_path, stage):
    """Each local job reads its own copy of the shipped samples: what identifies the work is their content."""
    out = tmp_path / "data"
    first = cli("data", "prep", stage, "-c", "tiny", f"output_dir={out}")
    assert first.rc == 0, first.err + first.out[-2000:]
    before = _tree(out)
    second = cli("data", "prep", stage, "-c", "tiny", f"output_dir={out}")
    assert second.rc == 0, second.err + second.out[-2000:]
    if stage == "pretrain":
        assert re.search(r"shards written 0, reused [1-9]", second.out), second.out[-2000:]
    else:
        assert "is up to date (same inputs and settings)" in second.out, second.out[-2000:]
    assert _tree(out) == before


def test_a_relative_nemotron_home_is_where_the_launcher_started(cli, home, tmp_path, monkeypatch):
    """NEMOTRON_HOME=state (relative): the job dirs and the store go under the submitting directory, and the job
    completes and is reported COMPLETED (not lost under its own code dir)."""
    monkeypatch.delenv("NEMORUN_HOME", raising=False)
    r = cli("data", "prep", "pretrain", "-c", "tiny", f"output_dir={tmp_path}/data", env={"NEMOTRON_HOME": "state"})
    assert r.rc == 0 and "COMPLETED" in r.out, r.err + r.out[-2000:]
    assert (Path.cwd() / "state" / "jobs").is_dir() and (Path.cwd() / "state" / "nemorun" / "artifacts").is_dir()
    listed = cli("jobs", "list", prog="nemotron", env={"NEMOTRON_HOME": str(Path.cwd() / "state")})
    assert " COMPLETED " in listed.out, listed.out
