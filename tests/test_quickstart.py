"""The README's set-up command, through the real CLI on this machine: the tiny data prep on the embedded
Ray, then the tiny pretraining dry run that consumes its blend.json."""

from __future__ import annotations

import json
import os


def test_tiny_data_prep_then_the_pretrain_dry_run_that_reads_it(cli, home, tmp_path):
    out = tmp_path / "data" / "tiny"
    prep = cli("data", "prep", "pretrain", "-c", "tiny", f"output_dir={out}")
    assert prep.rc == 0, prep.err + prep.out[-2000:]
    assert "COMPLETED" in prep.out
    blend = json.loads((out / "blend.json").read_text())
    assert set(blend) == {"train", "valid", "test"} and blend["train"]
    dry = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false", f"dataset.blend_path={out}/blend.json")
    assert dry.rc == 0, dry.err
    assert f"dataset.blend_path                        = {out}/blend.json  <- command line" in dry.out
    # a blend naming shards that are gone is caught before anything runs
    first = blend["train"][1]  # [weight, prefix, ...] with absolute prefixes
    for ext in (".bin", ".idx"):
        os.unlink(first + ext)
    broken = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false", f"dataset.blend_path={out}/blend.json")
    assert broken.rc == 2 and broken.err_lines[0].startswith("error: dataset.blend_path: ")
    assert "without .bin/.idx" in broken.err
