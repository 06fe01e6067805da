"""Golden dry-run output of the shipped configs with the sample `blackwell` profile: any change to
what a user sees shows up as a diff. Regenerate with UPDATE_GOLDEN=1 after an intended change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import inputs

from ultra3.paths import config_names
from ultra3.stages import STAGES

GOLDEN = Path(__file__).parent / "golden"
CASES = [(s, c) for s in STAGES for c in config_names(s.config_dir)]


@pytest.mark.parametrize("stage,config", CASES, ids=[f"{s.slug}-{c}" for s, c in CASES])
def test_dry_run_matches_golden(cli_here, home, stage, config):  # in this process: the same entry point and output
    result = cli_here(*stage.words, "-c", config, "--batch", "blackwell", "--dry-run", "--full",
                      *inputs(stage.name, config))
    assert result.rc == 0, result.err
    text = result.out.replace(str(Path.cwd()), "<cwd>").replace(str(home), "<home>")
    golden = GOLDEN / f"{stage.slug}-{config}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.is_file(), f"no golden file {golden.name}; run with UPDATE_GOLDEN=1"
    assert text == golden.read_text()
