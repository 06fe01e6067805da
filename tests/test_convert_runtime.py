"""The runtime of `ultra3 convert` (recipes/convert.py) on this CPU machine, for real: every bad input through
`python -m recipes.convert` (exit 2, one line, nothing written), a Megatron checkpoint's run_config.yaml against a
Hugging Face config.json, the held-out tokens of the shipped tiny data, the parity gate on the logits of a real tiny
Nemotron-H (itself, and a copy with damaged weights), the report and the .partial / rename / .failed-parity dirs.
The Megatron side (AutoBridge import, load, export) needs the training container and a GPU: scripts/gpu/smoke.sh's
`convert` step runs it; here a valid config stops, before writing anything, at the missing Megatron-Bridge."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipes import convert
from recipes.conversion import checks
from recipes.conversion.checks import ConvertError
from recipes.conversion.parity import Parity, ParityFailed
from recipes.training.hf_config import hf_config

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "recipes/samples/tiny/tokenizer.json"
DATA = REPO / "recipes/samples/tiny/sft.jsonl.gz"


def stage_config(direction: str) -> dict:
    """configs/convert/<direction>/tiny.yaml over its default.yaml, as the launcher layers them."""
    folder = REPO / "configs/convert" / direction.replace("-", "_")
    cfg = yaml.safe_load((folder / "default.yaml").read_text())
    for key, value in yaml.safe_load((folder / "tiny.yaml").read_text()).items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key != "model" else value
    cfg.pop("defaults", None)
    return cfg


MODEL = stage_config("hf-to-megatron")["model"]


def config(tmp: Path, direction: str = "hf-to-megatron", **over) -> dict:
    cfg = stage_config(direction)
    cfg.update(job={"stage": f"convert {direction}", "dir": str(tmp)}, output_dir=str(tmp / "out"))
    if direction == "hf-to-megatron":
        cfg.update(tokenizer=str(TOKENIZER), hf_model=str(tmp / "tiny-hf"))
    cfg["parity"]["data"] = str(DATA)
    cfg.update(over)
    return cfg


def run_cli(cfg: dict, tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "config.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "recipes.convert", "--config", str(tmp / "config.yaml")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def hf_dir(path: Path, model: dict = MODEL, model_type: str = "nemotron_h") -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**hf_config(model), "model_type": model_type}))
    shutil.copy(TOKENIZER, path / "tokenizer.json")
    return path


def megatron_checkpoint(path: Path, model: dict = MODEL, iteration: int | None = 0, reference: bool = True) -> Path:
    """A checkpoint dir as Megatron-Bridge saves one (tracker, iter dir, run_config.yaml; no weights), with the
    pipeline splits and the MTP part in its pattern, and an hf-to-megatron output's hf_reference/."""
    path.mkdir(parents=True)
    (path / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    saved = {**model, "hybrid_layer_pattern": "MEM|*EME/*E/*E", "_target_": "HybridModelProvider"}
    if iteration is not None:
        (path / f"iter_{iteration:07d}").mkdir()
        (path / f"iter_{iteration:07d}" / "run_config.yaml").write_text(yaml.safe_dump({"model": saved}))
    if reference:
        hf_dir(path / "hf_reference")
    return path


# -- bad input through the real entry point -------------------------------------------------------------------------


def _cases(tmp: Path) -> dict:
    wide = {**MODEL, "hidden_size": 256}
    return {
        "no stage": ({"job": {"dir": str(tmp)}}, "ultra3 convert: error: job.stage: None is not"),
        "key missing": ({"seed": "__DROP__"}, "seed is not set"),
        "bad kind": ({"parity": {**config(tmp)["parity"], "tokens": "many"}}, "parity.tokens must be an integer"),
        "output_dir not empty": ({}, "output_dir: "),
        "hf_model missing": ({"make_checkpoint": False, "hf_model": str(tmp / "nowhere")}, "hf_model: "),
        "hf_model not nemotron_h": ({"make_checkpoint": False,
                                     "hf_model": str(hf_dir(tmp / "llama", model_type="llama"))},
                                    "model_type 'llama', not 'nemotron_h'"),
        "hf_model null": ({"hf_model": None}, "hf_model is null"),
        "no tokenizer to make with": ({"tokenizer": str(tmp / "none.json")}, "tokenizer: "),
        "no data": ({"parity": {**config(tmp)["parity"], "data": str(tmp / "none.jsonl")}}, "parity.data: "),
        "too little data": ({"parity": {**config(tmp)["parity"], "tokens": 10**9}}, "fewer than parity.tokens"),
        "checkpoint null": ({"megatron_checkpoint": None}, "megatron_checkpoint is null"),
        "no tracker": ({"megatron_checkpoint": str(hf_dir(tmp / "hf-not-megatron"))}, "is not a Megatron-Bridge"),
        "no iteration dir": ({"megatron_checkpoint": str(megatron_checkpoint(tmp / "c1", iteration=None))},
                             "names no iteration dir"),
        "another model": ({"megatron_checkpoint": str(megatron_checkpoint(tmp / "c2", model=wide))},
                          "hidden_size 256 vs 192"),
        "no job saved it": ({"megatron_checkpoint": str(megatron_checkpoint(tmp / "c3", reference=False))},
                            "no job config"),
        "hf_model given, another model": ({"megatron_checkpoint": str(megatron_checkpoint(tmp / "c4")),
                                           "hf_model": str(hf_dir(tmp / "wide", model=wide))},
                                          "hidden_size 192 vs 256"),
    }


@pytest.mark.parametrize("case", ["no stage", "key missing", "bad kind", "output_dir not empty", "hf_model missing",
                                  "hf_model not nemotron_h", "hf_model null", "no tokenizer to make with", "no data",
                                  "too little data", "checkpoint null", "no tracker", "no iteration dir",
                                  "another model", "no job saved it", "hf_model given, another model"])
def test_bad_input_is_one_line_exit_2_nothing_written(case, tmp_path):
    change, message = _cases(tmp_path)[case]
    direction = "megatron-to-hf" if "megatron_checkpoint" in change or "checkpoint" in case else "hf-to-megatron"
    cfg = config(tmp_path, direction, **change)
    if change.get("seed") == "__DROP__":
        del cfg["seed"]
    out = tmp_path / "out"
    if case == "output_dir not empty":
        out.mkdir()
        (out / "theirs.txt").write_text("kept")
    before = sorted([p.name for p in tmp_path.iterdir()] + ["config.yaml"])
    p = run_cli(cfg, tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    prefix = "ultra3 convert: error: " if case == "no stage" else f"ultra3 convert {direction}: error: "
    assert lines[0].startswith(prefix) and message in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no .partial, no made checkpoint, no output
    assert not out.exists() or [f.name for f in out.iterdir()] == ["theirs.txt"]


def test_input_is_checked_before_torch_transformers_or_megatron(tmp_path):
    cfg = config(tmp_path, "megatron-to-hf", megatron_checkpoint=str(megatron_checkpoint(tmp_path / "c", {
        **MODEL, "num_layers": 9})))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    probe = ("import sys\nfrom recipes import convert\nrc = convert.main(['--config', sys.argv[1]])\n"
             "print(rc, sorted(m for m in ('torch', 'transformers', 'megatron') if m in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "config.yaml")], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert p.stdout.strip() == "2 []", p.stdout + p.stderr
    assert "num_layers 7 vs 7" not in p.stderr and "num_layers 9 vs 7" in p.stderr, p.stderr


@pytest.mark.parametrize("direction", ["hf-to-megatron", "megatron-to-hf"])
def test_valid_config_stops_at_the_megatron_side_here_leaving_everything_as_it_was(direction, tmp_path):
    """Every check passes; without the training container the run stops before making or clearing anything."""
    over = {"megatron_checkpoint": str(megatron_checkpoint(tmp_path / "ckpt"))} if direction == "megatron-to-hf" else {}
    cfg = config(tmp_path, direction, **over)
    stale = tmp_path / "out.partial"
    stale.mkdir()
    (stale / "half.bin").write_text("x")
    p = run_cli(cfg, tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and ("megatron.bridge cannot be imported" in lines[0] or "no GPU" in lines[0]), p.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "tiny-hf").exists()
    assert (stale / "half.bin").exists()


def test_the_stage_configs_give_every_key_the_runtime_takes(tmp_path):
    for direction in ("hf-to-megatron", "megatron-to-hf"):
        cfg = stage_config(direction)
        cfg["job"] = {"stage": f"convert {direction}", "dir": str(tmp_path)}
        s = checks.settings(cfg)
        assert s["direction"] == direction and s["parity"]["tokens"] == 128 and s["model"]["num_layers"] == 7


# -- a checkpoint's run_config.yaml against a Hugging Face config.json ------------------------------------------


def test_compare_refuses_another_shape_and_names_it(tmp_path):
    iter_dir = checks.iteration_dir(str(megatron_checkpoint(tmp_path / "ckpt", reference=False)))
    assert iter_dir.endswith("iter_0000000")
    checks.compare(iter_dir, hf_config(MODEL), "(ours)")  # hybrid_override_pattern, as the training runtime writes
    for key, value, shown in (("hidden_size", 256, "hidden_size 192 vs 256"),
                              ("hybrid_layer_pattern", "MEM*EMM", "'MEM*EME' vs 'MEM*EMM'"),
                              ("mtp_num_layers", 1, "mtp_num_layers 2 vs 1"),
                              ("vocab_size", 8192, "vocab_size 4096 vs 8192")):
        with pytest.raises(ConvertError, match=shown.replace("*", r"\*")):
            checks.compare(iter_dir, hf_config({**MODEL, key: value}), "(ours)")
    layout = {**MODEL, "pipeline_model_parallel_size": 2, "tensor_model_parallel_size": 4, "seq_length": 8192}
    checks.compare(iter_dir, hf_config(layout), "(ours)")  # layout and sequence length are no shape


@pytest.mark.heavy  # builds the tiny model with transformers
def test_compare_reads_the_config_transformers_writes(tiny, tmp_path):
    iter_dir = checks.iteration_dir(str(megatron_checkpoint(tmp_path / "ckpt", reference=False)))
    made = json.loads((tiny / "config.json").read_text())  # layers_block_type, as transformers 5.2x saves it
    assert "hybrid_override_pattern" not in made and checks.hf_shape(made)["hybrid_layer_pattern"] == "MEM*EME"
    checks.compare(iter_dir, made, "(made)")
    with pytest.raises(ConvertError, match="hybrid_layer_pattern 'MEM\\*EME' vs 'MMM\\*EME'"):
        checks.compare(iter_dir, {**made, "layers_block_type": ["mamba"] * 3 + made["layers_block_type"][3:]}, "")


# -- held-out tokens, logits and the gate on a real tiny Nemotron-H ----------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    from recipes.quantization import tiny_checkpoint

    out = tmp_path_factory.mktemp("convert") / "tiny-hf"
    tiny_checkpoint.make(MODEL, str(TOKENIZER), str(out), 1234)
    return out


@pytest.fixture(scope="module")
def logits(tiny, tmp_path_factory) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    from recipes.conversion.parity import held_out_ids, hf_logits

    ids = held_out_ids(str(DATA), str(tiny), 128)
    damaged = tmp_path_factory.mktemp("damaged") / "hf"
    shutil.copytree(tiny, damaged)
    weights = load_file(damaged / "model.safetensors")
    conv = [k for k in weights if k.endswith("mixer.conv1d.weight")]
    weights[conv[0]] = torch.zeros_like(weights[conv[0]])  # a conversion that lost a Mamba layer's convolution
    save_file(weights, damaged / "model.safetensors", metadata={"format": "pt"})
    return {"ids": ids, "source": hf_logits(str(tiny), ids, torch.float32),
            "damaged": hf_logits(str(damaged), ids, torch.float32)}


@pytest.mark.heavy
def test_held_out_tokens_are_the_first_of_the_data(tiny, logits):
    from transformers import AutoTokenizer

    from recipes.quantization import calibration

    ids = logits["ids"]
    tok = AutoTokenizer.from_pretrained(str(tiny))
    first = tok.encode(next(calibration.texts(str(DATA))), add_special_tokens=False)
    assert ids.shape == (1, 128) and int(ids.max()) < MODEL["vocab_size"]
    assert ids[0, :min(len(first), 128)].tolist() == first[:128]
    assert tok.eos_token_id in ids[0].tolist()  # documents joined by the end-of-text token


@pytest.mark.heavy
def test_gate_passes_the_same_weights_and_fails_damaged_ones(logits):
    from recipes.conversion.parity import parity

    limits = {k: stage_config("hf-to-megatron")["parity"][k] for k in ("max_relative_error", "min_top1")}
    same = parity(logits["source"], logits["source"].clone(), MODEL["vocab_size"])
    assert (same.tokens, same.relative_error, same.top1, same.max_abs) == (128, 0.0, 1.0, 0.0)
    assert same.failures(**limits) == []
    bad = parity(logits["source"], logits["damaged"], MODEL["vocab_size"])
    assert bad.relative_error > 0.1 and bad.top1 < 0.9, bad
    assert [f.split()[0] for f in bad.failures(**limits)] == ["relative", "top-1"]


@pytest.mark.heavy
def test_padded_vocab_is_cut_and_nan_fails():
    import torch

    from recipes.conversion.parity import parity

    a = torch.randn(16, 100)
    padded = torch.cat([a, torch.full((16, 28), 50.0)], dim=1)  # Megatron pads the vocab; the padding is no token
    assert parity(a, padded, 100).relative_error == 0.0 and parity(a, padded, 100).top1 == 1.0
    assert parity(a, torch.full_like(a, float("nan")), 100).failures(1.0, 0.0)
    with pytest.raises(ValueError, match="shapes differ"):
        parity(a, a[:8], 100)


def _settings(tmp: Path) -> dict:
    return checks.settings(config(tmp))


def test_finish_renames_partial_on_a_pass_with_the_report(tmp_path, capsys):
    s = _settings(tmp_path)
    (tmp_path / "out").mkdir()  # an empty output_dir is taken
    partial = Path(convert.fresh_partial(s["output_dir"]))
    partial.mkdir()
    (partial / "model.safetensors").write_text("weights")
    convert.finish(s, str(partial), Parity(128, 0.0, 1.0, 0.0), 0.0)
    out = tmp_path / "out"
    assert not partial.exists() and (out / "model.safetensors").read_text() == "weights"
    report = json.loads((out / convert.REPORT).read_text())
    assert report["direction"] == "hf-to-megatron" and report["source"] == s["hf_model"]
    assert report["parity"] == {"tokens": 128, "relative_error": 0.0, "top1": 1.0, "max_abs": 0.0,
                                "max_relative_error": 0.05, "min_top1": 0.9, "passed": True}
    assert "torch" in report["versions"]
    from recipes.publish import describe

    assert describe(str(out))["parity"] == report["parity"]  # what the published manifest's metadata carries
    assert "ultra3 convert: parity: relative error 0, top-1 1.0000 over 128 tokens (limits 0.05, 0.9)" in \
        capsys.readouterr().out


def test_finish_keeps_a_failed_conversion_aside_and_writes_no_output(tmp_path):
    s = _settings(tmp_path)
    failed = tmp_path / "out.failed-parity"
    failed.mkdir()
    (failed / "older.txt").write_text("an earlier failure")
    partial = tmp_path / "out.partial"
    partial.mkdir()
    with pytest.raises(ParityFailed, match=r"relative error .* > 0.05; top-1 .* < 0.9 over 128 tokens"):
        convert.finish(s, str(partial), Parity(128, 1.23, 0.023, 4.5), 0.0)
    assert not (tmp_path / "out").exists() and not partial.exists()
    assert not (failed / "older.txt").exists()
    assert json.loads((failed / convert.REPORT).read_text())["parity"]["passed"] is False


def test_stale_partial_is_cleared_by_rank_0_only(tmp_path, monkeypatch):
    stale = tmp_path / "out.partial"
    stale.mkdir()
    (stale / "half.bin").write_text("x")
    monkeypatch.setenv("RANK", "1")
    assert convert.fresh_partial(str(tmp_path / "out/")) == str(stale) and stale.exists()
    monkeypatch.setenv("RANK", "0")
    convert.fresh_partial(str(tmp_path / "out"))
    assert not stale.exists()


def test_reference_files_of_a_local_source(tmp_path):
    source = hf_dir(tmp_path / "src")
    (source / "model.safetensors").write_text("weights stay behind")
    (source / "tokenizer_config.json").write_text("{}")
    convert.copy_reference(str(source), str(tmp_path / "ref"))
    assert sorted(p.name for p in (tmp_path / "ref").iterdir()) == ["config.json", "tokenizer.json",
                                                                     "tokenizer_config.json"]
    assert checks.hf_dir_config(str(tmp_path / "ref"), "hf_model")["model_type"] == "nemotron_h"


def test_quantize_takes_an_imported_checkpoint_by_its_saved_reference(tmp_path):
    """An hf-to-megatron output names no job config; quantize's export finds the model by its hf_reference/ and, on
    this CPU machine, stops only at Megatron-Bridge."""
    from recipes.quantization import megatron_export
    from recipes.quantization.errors import QuantizeError

    if importlib.util.find_spec("megatron") and importlib.util.find_spec("megatron.bridge"):
        pytest.skip("Megatron-Bridge is installed: the export would run")
    ckpt = megatron_checkpoint(tmp_path / "imported")
    assert megatron_export.imported_reference(str(ckpt)) == str(ckpt / "hf_reference")
    with pytest.raises(QuantizeError, match="exporting it needs Megatron-Bridge"):
        megatron_export.export_once(str(ckpt), str(tmp_path / "bf16-hf"), "bf16_checkpoint", print)
    own = megatron_checkpoint(tmp_path / "trained", reference=False)
    assert megatron_export.imported_reference(str(own)) is None
    with pytest.raises(QuantizeError, match="no job config"):
        megatron_export.export_once(str(own), str(tmp_path / "bf16-hf2"), "bf16_checkpoint", print)


def test_an_input_error_is_said_once_by_rank_0(tmp_path):
    cfg = config(tmp_path, "hf-to-megatron", seed="__DROP__")
    del cfg["seed"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "recipes.convert", "--config", str(tmp_path / "config.yaml")]
    ranks = [subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env={**os.environ, "RANK": r}, timeout=120)
             for r in ("0", "1")]
    assert [p.returncode for p in ranks] == [2, 2]
    assert len(ranks[0].stderr.splitlines()) == 1 and "seed is not set" in ranks[0].stderr
    assert ranks[1].stderr == ""
