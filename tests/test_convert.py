"""`ultra3 convert hf-to-megatron|megatron-to-hf`, the launcher side: the Ultra configs sized for a 550B
conversion, the store and pipe wiring (sft starts from an imported checkpoint), and bad input refused in one line
with nothing written. The runtime's own checks are tests/test_convert_runtime.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = yaml.safe_load((REPO / "configs/convert/hf_to_megatron/tiny.yaml").read_text())["model"]


def errors(r) -> list[str]:
    return [line for line in r.err_lines if line.startswith("error")]


@pytest.mark.parametrize("stage, extra", [("hf-to-megatron", []),
                                          ("megatron-to-hf", ["megatron_checkpoint=/lustre/ckpt/sft"])])
def test_ultra_dry_run_sizes_a_550b_conversion(cli_here, stage, extra):
    r = cli_here("convert", stage, "--batch", "blackwell", "--dry-run", "--full", *extra)
    assert r.rc == 0, r.err
    rows = {line[:28].strip(): line[28:] for line in r.out.split("== conversion memory ==\n")[1].splitlines()[:5]}
    assert rows == {"model weights (BF16)": "1,121.0 GB",  # 550B-A55B with its MTP layers
                    "busiest GPU holds": "50.1 GB",  # TP1 PP4 EP8
                    "GPUs": "32", "GPU memory": "180 GB (b200)",
                    "parity: HF model on node 0": "1,121.0 GB of 1,440 GB GPU memory"}
    assert "world size    32" in r.out and "#SBATCH --nodes=4" in r.out
    assert f"convert {stage} ~ " in r.out and "checkpoint read and write" in r.out
    assert "recipe: recipes.convert" in r.out and "launch: torchrun" in r.out


def test_weights_over_a_gpu_are_one_error(cli_here, home):
    r = cli_here("convert", "hf-to-megatron", "--batch", "blackwell", "--dry-run",
                 "model.pipeline_model_parallel_size=1", "model.expert_model_parallel_size=1")
    assert r.rc == 2
    assert errors(r) == [e for e in errors(r) if "1,121 GB of weights, over 90% of a b200's 180 GB" in e]
    assert len(errors(r)) == 1 and "Traceback" not in r.err
    assert not (home / "nemorun").exists()


def test_a_gate_model_over_the_first_node_is_a_warning(cli_here):
    r = cli_here("convert", "hf-to-megatron", "--batch", "hopper", "--dry-run")
    assert r.rc == 0, r.err
    assert "warning: parity.tokens: the gate's Hugging Face model (1,121 GB) does not fit the first node's GPUs " \
           "(640 GB)" in r.out


def test_a_bad_path_seen_here_is_an_error_for_a_cluster_too(cli_here, home, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model.safetensors").write_text("x")
    r = cli_here("convert", "hf-to-megatron", "--batch", "blackwell", "--dry-run", f"output_dir={tmp_path}/full")
    assert r.rc == 2 and errors(r) == [f"error: output_dir: {tmp_path}/full exists and is not an empty directory (set "
                                       "in command line); choose a new output_dir"], r.err
    r = cli_here("convert", "hf-to-megatron", "--batch", "blackwell", "--dry-run", "parity.data=/lustre/held-out.jsonl")
    assert r.rc == 0 and "warning: parity.data: /lustre/held-out.jsonl does not exist" in r.out  # the cluster's path


def nemotron_h_dir(path: Path, model_type: str = "nemotron_h") -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


def megatron_dir(path: Path, model: dict) -> Path:
    (path / "iter_0000040").mkdir(parents=True)
    (path / "latest_checkpointed_iteration.txt").write_text("40\n")
    (path / "iter_0000040" / "run_config.yaml").write_text(yaml.safe_dump({"model": model}))
    return path


CASES = {
    "missing hf dir": (["convert", "hf-to-megatron", "-c", "tiny", "make_checkpoint=false", "hf_model={t}/nope"],
                       "error: hf_model: {t}/nope does not exist"),
    "not nemotron-h": (["convert", "hf-to-megatron", "-c", "tiny", "make_checkpoint=false", "hf_model={t}/llama"],
                       "error: hf_model: {t}/llama is not a Nemotron-H Hugging Face checkpoint (its config.json says "
                       "model_type 'llama', not 'nemotron_h')"),
    "output exists": (["convert", "hf-to-megatron", "-c", "tiny", "output_dir={t}/full"],
                      "error: output_dir: {t}/full exists and is not an empty directory"),
    "other model": (["convert", "megatron-to-hf", "-c", "tiny", "megatron_checkpoint={t}/ultra"],
                    "error: megatron_checkpoint: {t}/ultra holds another model: num_layers 108 (config: 7)"),
    "not megatron": (["convert", "megatron-to-hf", "-c", "tiny", "megatron_checkpoint={t}/llama"],
                     "error: megatron_checkpoint: {t}/llama is not a Megatron-Bridge checkpoint"),
    "bad gate": (["convert", "megatron-to-hf", "-c", "tiny", "megatron_checkpoint={t}/tiny",
                  "parity.min_top1=1.5"], "error: parity.min_top1: 1.5 is not between 0 and 1"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_nothing_written(cli_here, home, tmp_path, case):
    nemotron_h_dir(tmp_path / "llama", "llama")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model.safetensors").write_text("x")
    megatron_dir(tmp_path / "ultra", {**TINY_MODEL, "num_layers": 108})
    megatron_dir(tmp_path / "tiny", {**TINY_MODEL, "hybrid_layer_pattern": "MEM|*EME"})  # another layout only
    args, message = CASES[case]
    r = cli_here(*[a.format(t=tmp_path) for a in args])
    assert r.rc == 2, r.out + r.err
    assert len(errors(r)) == 1 and errors(r)[0].startswith(message.format(t=tmp_path)), r.err
    assert "Traceback" not in r.err
    assert not (home / "nemorun").exists()  # no job dir, nothing submitted


@pytest.mark.parametrize("pattern", ["MEM|*EME", "MEM*EME/*E/*E", "train state"])  # another layout; the MTP block
def test_a_checkpoint_of_the_same_model_is_taken(cli_here, tmp_path, pattern):  # as saved; a .pt tracker only
    shape = pattern.replace("train state", "MEM*EME")
    ckpt = megatron_dir(tmp_path / "tiny", {**TINY_MODEL, "hybrid_layer_pattern": shape})
    if pattern == "train state":
        (ckpt / "latest_checkpointed_iteration.txt").unlink()
        (ckpt / "latest_train_state.pt").write_bytes(b"")
    r = cli_here("convert", "megatron-to-hf", "-c", "tiny", "--dry-run", f"megatron_checkpoint={ckpt}")
    assert r.rc == 0, r.err
    assert f"megatron_checkpoint = {ckpt}  (set in command line)" in r.out


def test_release_pipe_fine_tunes_from_the_imported_checkpoint(cli_here):
    r = cli_here("pipe", "-c", "from_release", "--batch", "blackwell", "--dry-run")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    sft = next(i for i, line in enumerate(lines) if "ultra3 sft -c default" in line)
    assert "/megatron  (from pipe step import" in lines[sft + 1]  # recipe.pretrained_checkpoint
    assert lines[sft + 1].lstrip().startswith("recipe.pretrained_checkpoint = ")
    export = next(i for i, line in enumerate(lines) if "ultra3 convert megatron-to-hf" in line)
    assert "(from pipe step sft" in lines[export + 1] and "megatron_checkpoint = " in lines[export + 1]
