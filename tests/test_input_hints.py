"""Every "run X first" hint names the producer config that fits: the one the input takes from, else the consumer's
own config name where the producer has one (tiny for tiny), never the full run's default for a smoke test."""

from __future__ import annotations

import pytest

from conftest import inputs

from ultra3.compile import compile_job
from ultra3.job import Options
from ultra3.paths import config_names
from ultra3.stages import STAGES, producers

CASES = [(s, c) for s in STAGES if s.inputs for c in config_names(s.config_dir)]


@pytest.mark.parametrize("stage,config", CASES, ids=[f"{s.slug}-{c}" for s, c in CASES])
def test_each_shipped_pair_hints_the_producer_config_that_fits(home, stage, config):
    job = compile_job(stage, Options(config=config, batch="blackwell", overrides=inputs(stage.name, config)))
    for inp, recorded in zip(stage.inputs, job.config["job"]["inputs"]):
        maker = next(s for kind in inp.kinds for s in producers(kind))
        named = inp.only(lambda key: job.flat.get(key))
        want = named[0] if named else None if inp.config_key or config not in config_names(maker.config_dir) \
            else config
        suffix = f" -c {want}" if want not in (None, "default") else ""
        assert recorded["hint"] == f"ultra3 {maker.name}{suffix} --batch blackwell", (inp.key, recorded["hint"])
        assert want is None or want in config_names(maker.config_dir)  # a config the producer ships


@pytest.mark.parametrize("words, hints", [
    (["rl", "mopd"], ["ultra3 rl rlvr -c tiny", "ultra3 data prep rl -c tiny"]),
    (["rl", "rlvr"], ["ultra3 sft -c tiny", "ultra3 data prep rl -c tiny"]),
])
def test_an_rl_smoke_test_is_sent_to_the_tiny_producers(cli_here, home, words, hints):
    r = cli_here(*words, "-c", "tiny", "--dry-run")
    assert r.rc == 2
    for command in hints:
        assert f"run `{command}` first" in r.err, r.err


def test_a_missing_path_names_the_producer_config(cli_here, home):
    r = cli_here("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false", "dataset.blend_path=/nonexistent/b.json")
    assert r.rc == 2 and "run `ultra3 data prep pretrain -c tiny` or fix the path" in r.err, r.err
