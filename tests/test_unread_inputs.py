"""An input given explicitly while its `unless` key switches it off (mock data, a checkpoint the job makes) is an
error naming both keys, where each was set and the fix, never a job that silently trains on mock data."""

from __future__ import annotations

import pytest
import yaml

from ultra3.stages import STAGES


def written(home) -> list:
    return sorted(p for p in home.rglob("*") if p.is_file()) if home.exists() else []


@pytest.mark.parametrize("words, given, key, off, where", [
    (["pretrain"], "run.data=ultra3-pretrain-data-tiny:latest", "dataset.blend_path", "dataset.mock",
     "configs/_shared/tiny.yaml"),
    (["pretrain"], "dataset.blend_path=/data/blend.json", "dataset.blend_path", "dataset.mock",
     "configs/_shared/tiny.yaml"),
    (["pretrain"], "data.per_split_data_args_path=/data/blend.json", "dataset.blend_path", "dataset.mock",
     "configs/_shared/tiny.yaml"),
    (["sft"], "dataset.packed_dir=/data/sft", "dataset.packed_dir", "dataset.mock", "configs/_shared/tiny.yaml"),
    (["quantize"], "bf16_checkpoint=/ckpt/bf16", "bf16_checkpoint", "make_checkpoint", "configs/quantize/tiny.yaml"),
    (["convert", "hf-to-megatron"], "hf_model=/ckpt/hf", "hf_model", "make_checkpoint",
     "configs/convert/hf_to_megatron/tiny.yaml"),
])
def test_an_input_given_while_switched_off_is_an_error(cli_here, home, words, given, key, off, where):
    r = cli_here(*words, "-c", "tiny", "--dry-run", given)
    value = given.split("=", 1)[1]
    name = next(i.name for s in STAGES if s.words == tuple(words) for i in s.inputs if i.key == key)
    assert r.rc == 2, r.out
    assert f"error: {key}: {value} given (set in command line), but {off} is true (set in {where}), so " \
           f"{' '.join(words)} would never read its {name} input; set {off}=false to use it, or leave {key} unset" \
           in r.err_lines, r.err
    assert "Traceback" not in r.err and written(home) == []


def test_a_layer_that_sets_both_means_it_and_switching_off_on_top_wins(cli_here, home, tmp_path):
    # quantize -c tiny makes its checkpoint at bf16_checkpoint: the same layer sets both
    assert cli_here("quantize", "-c", "tiny", "--dry-run").rc == 0
    made = cli_here("quantize", "-c", "tiny", "--dry-run", "make_checkpoint=true", f"bf16_checkpoint={tmp_path}/m")
    assert made.rc == 0, made.err
    # the command line switching the input off above a config's value: the config's value is simply not read
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"defaults": ["tiny"], "dataset": {"mock": False, "blend_path": "/data/b.json"}}))
    r = cli_here("pretrain", "-c", str(mine), "--dry-run", "dataset.mock=true")
    assert r.rc == 0 and "dataset.blend_path: not needed (dataset.mock is set)" in r.out, r.err


def test_the_pipe_wiring_is_not_explicit_but_a_pipe_override_is(cli_here, home, tmp_path):
    assert cli_here("pipe", "-c", "tiny", "--dry-run").rc == 0  # wired inputs, dataset.mock=false in the pipe
    pipe = tmp_path / "p.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {"pretrain": {"stage": "pretrain", "config": "tiny", "overrides": {
        "dataset.blend_path": "/data/blend.json"}}}}))
    r = cli_here("pipe", "-c", str(pipe), "--dry-run")
    assert r.rc == 2 and "error: pretrain: dataset.blend_path: /data/blend.json given (set in p.yaml [pretrain]), " \
        "but dataset.mock is true (set in configs/_shared/tiny.yaml), so pretrain would never read its data input; " \
        "set dataset.mock=false to use it, or leave dataset.blend_path unset" in r.err_lines, r.err
