"""`ultra3 quantize` for real: the tiny Nemotron-H checkpoint through ModelOpt's Ultra recipe on CPU, the export
read back tensor by tensor, the CPU NVFP4 fallback against ModelOpt's own reference quantizer, bad inputs; a
Megatron-Bridge checkpoint as input (told apart from a Hugging Face one, taken from the job registry, its export
calls checked against the recorded Megatron-Bridge API)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")
pytest.importorskip("modelopt.torch.quantization")
from recipes.quantization import megatron_export  # noqa: E402
from safetensors import safe_open  # noqa: E402
from test_training_inputs import completed_pretrain_job, provenance  # noqa: E402

from ultra3 import megatron_api, training_inputs  # noqa: E402

pytestmark = pytest.mark.heavy  # Ray, torch, NeMo-Run or real jobs: not in the fast tier

ULTRA = yaml.safe_load((REPO / "configs/quantize/default.yaml").read_text())["modelopt_recipe"]  # the shipped recipe
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


def tiny_config(tmp: Path, **over) -> dict:
    cfg = yaml.safe_load((REPO / "configs/quantize/tiny.yaml").read_text())
    cfg.pop("defaults")
    cfg.update(bf16_checkpoint=str(tmp / "bf16"), output_dir=str(tmp / "out"), modelopt_recipe=ULTRA, seed=1234,
               tokenizer=str(REPO / cfg["tokenizer"]), device="cpu")
    cfg["calibration"]["path"] = str(REPO / cfg["calibration"]["path"])
    cfg.update(over)
    return cfg


def run_script(cfg: dict, path: Path) -> subprocess.CompletedProcess:
    path.write_text(json.dumps(cfg))
    return subprocess.run([sys.executable, "-m", "recipes.quantize", "--config", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=600)


def tensors(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def flow(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("quantize")
    cfg = tiny_config(tmp)
    p = run_script(cfg, tmp / "config.yaml")
    assert p.returncode == 0, p.stdout + p.stderr
    out = Path(cfg["output_dir"])
    return {"cfg": cfg, "out": out, "log": p.stdout,
            "src": tensors(Path(cfg["bf16_checkpoint"]) / "model.safetensors"), "q": tensors(out / "model.safetensors"),
            "report": json.loads((out / "quantization_report.json").read_text())}


def kind(name: str) -> str:
    """What the Ultra recipe makes of a hub-layout tensor name."""
    if re.search(r"mixer\.experts\.\d+\.(up|down)_proj\.weight$", name):
        return "nvfp4"
    if re.search(r"mixer\.(shared_experts\.(up|down)_proj|in_proj|out_proj)\.weight$", name):
        return "fp8"
    return "bf16"


def test_files_and_quant_config(flow):
    out = flow["out"]
    assert {"config.json", "hf_quant_config.json", "model.safetensors", "tokenizer.json", "quantization_report.json",
            "generation_config.json"} <= {p.name for p in out.iterdir()}
    assert not Path(f"{out}.staging").exists()
    hq = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == "MIXED_PRECISION" and hq["kv_cache_quant_algo"] == "FP8"
    assert set(hq["exclude_modules"]) >= {"mtp.layers.0*", "mtp.layers.1*"}
    layers = hq["quantized_layers"]
    assert layers["backbone.layers.1.mixer.experts"] == {"quant_algo": "NVFP4", "group_size": 16}
    assert layers["backbone.layers.0.mixer.in_proj"] == {"quant_algo": "FP8"}
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt"
    for name in ("hf_quant_config.json", "config.json"):
        text = (out / name).read_text()
        assert "\\u0000" not in text and "sentinel" not in text, name  # ModelOpt 0.47's suffix is gone


def test_export_tensor_by_tensor(flow):
    src, q = flow["src"], flow["q"]
    counts = {"nvfp4": 0, "fp8": 0, "bf16": 0}
    for name, ref in src.items():
        k = kind(name)
        counts[k] += 1
        stem = name.removesuffix(".weight")
        if k == "nvfp4":
            out_f, in_f = ref.shape
            assert q[name].dtype == torch.uint8 and q[name].shape == (out_f, in_f // 2), name
            assert q[f"{stem}.weight_scale"].dtype == torch.float8_e4m3fn, name
            assert q[f"{stem}.weight_scale"].shape == (out_f, in_f // 16), name
            assert q[f"{stem}.weight_scale_2"].numel() == 1 and q[f"{stem}.input_scale"].numel() == 1, name
        elif k == "fp8":
            assert q[name].dtype == torch.float8_e4m3fn and q[name].shape == ref.shape, name
            assert q[f"{stem}.weight_scale"].numel() == 1 and q[f"{stem}.input_scale"].numel() == 1, name
        else:  # attention, latent projections, embeddings, lm_head, norms, Mamba's own, MTP: unchanged
            assert torch.equal(q[name].to(ref.dtype), ref), name
    assert counts["nvfp4"] == 3 * 16 * 2 and counts["fp8"] == 3 * 2 + 3 * 2
    assert sum(n.startswith("mtp.") for n in q) == 8
    for layer in (3,):  # the attention layer of MEM*EME
        for kv in ("k", "v"):
            assert q[f"backbone.layers.{layer}.mixer.{kv}_proj.{kv}_scale"].dtype == torch.float32


def test_bits_per_element_from_the_tensors(flow):
    """The report's figure (from the config and the recipe alone) against a count over the source tensors."""
    bits = {"nvfp4": 4.5, "fp8": 8.0, "bf16": 16.0}
    main = {n: t for n, t in flow["src"].items() if not n.startswith("mtp.")}
    expected = sum(t.numel() * bits[kind(n)] for n, t in main.items()) / sum(t.numel() for t in main.values())
    assert flow["report"]["bits_per_element"] == pytest.approx(expected, abs=1e-3)
    assert flow["report"]["bits_per_element"] == pytest.approx(8.5608, abs=1e-4)


def test_report_accuracy(flow):
    acc = flow["report"]["accuracy"]
    assert acc["held_out_tokens"] == 4 * 64
    assert 0 < acc["relative_logit_error"] < 0.3 and acc["top1_agreement"] > 0.6
    assert abs(acc["perplexity_change"]) < 0.05
    assert "pure-PyTorch fallback" in flow["log"]
    modules = {m["module"]: m for m in flow["report"]["modules"]}
    assert modules["model.layers.N.mixer.experts.up_proj"]["weights"] == "NVFP4"
    assert modules["model.layers.N.mixer.q_proj"]["weights"] == "BF16" and flow["report"]["kv_cache"] == "FP8"


def dequantize(q: dict) -> dict:
    """The export back to BF16: E2M1 codes x E4M3 block scales x scale_2, FP8 x scale."""
    out = {}
    for name, t in q.items():
        if name.endswith(("_scale", "_scale_2")):
            continue
        stem = name.removesuffix(".weight")
        if t.dtype == torch.uint8:
            codes = torch.stack([t & 0x0F, t >> 4], dim=-1).reshape(t.shape[0], -1).long()
            scale = q[f"{stem}.weight_scale"].float().repeat_interleave(16, -1) * q[f"{stem}.weight_scale_2"].float()
            t = E2M1[codes] * scale
        elif t.dtype == torch.float8_e4m3fn:
            t = t.float() * q[f"{stem}.weight_scale"].float()
        out[name] = t.to(torch.bfloat16)
    return out


def test_dequantized_export_matches_the_fake_quantized_model(flow, tmp_path):
    """Weights only (activations and KV in BF16 on both sides): the packed export, dequantized, gives the logits
    of ModelOpt's fake-quantized model within 5% relative error (E2M1/E4M3 rounding ties break differently
    in fake-quant and in export; measured about 2%)."""
    import shutil

    import modelopt.torch.quantization as mtq
    from modelopt.recipe import load_recipe
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipes.quantization import calibration, nvfp4_cpu

    torch.set_num_threads(1)
    nvfp4_cpu.install()
    cfg, src_dir = flow["cfg"], Path(flow["cfg"]["bf16_checkpoint"])
    c = cfg["calibration"]
    calib, held = calibration.windows(c["path"], AutoTokenizer.from_pretrained(src_dir), c["samples"], c["held_out"],
                                      c["seq_length"])
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        model = mtq.quantize(model, load_recipe(ULTRA).quantize.model_dump(),
                             lambda m: [m(calib[i:i + 4]) for i in range(0, len(calib), 4)])
        mtq.disable_quantizer(model, lambda n: n.endswith(("input_quantizer", "bmm_quantizer")))
        fake = model(held).logits.float()
    deq_dir = tmp_path / "deq"
    shutil.copytree(src_dir, deq_dir)
    save_file({**dequantize(flow["q"])}, str(deq_dir / "model.safetensors"), metadata={"format": "pt"})
    with torch.no_grad():
        deq = AutoModelForCausalLM.from_pretrained(deq_dir, dtype=torch.bfloat16).eval()(held).logits.float()
    assert float((deq - fake).norm() / fake.norm()) < 0.05
    assert float((deq.argmax(-1) == fake.argmax(-1)).float().mean()) > 0.9


def test_cpu_fallback_matches_modelopt_reference_quantizer():
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    from recipes.quantization import nvfp4_cpu

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen) * torch.logspace(-3, 1, 64).unsqueeze(1)
    global_amax = x.abs().max()
    packed, scale, scale_2 = NVFP4QTensor.quantize(x.clone(), 16)
    reference = packed.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
    assert torch.equal(nvfp4_cpu.dynamic_fake_quant(x, global_amax, 16), reference)
    block_amax = x.reshape(-1, 16).abs().amax(-1)
    assert torch.equal(nvfp4_cpu.static_fake_quant(x, block_amax, global_amax), reference)
    assert torch.equal(nvfp4_cpu.round_e2m1(torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, -7.0])),
                       torch.tensor([0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -6.0]))


@pytest.mark.parametrize("change, message", [
    ({"make_checkpoint": False, "bf16_checkpoint": "/nonexistent/ultra-bf16"}, "bf16_checkpoint: /nonexistent"),
    ({"modelopt_recipe": "models/nvidia/no-such-recipe"}, "modelopt_recipe: cannot load"),
    ({"modelopt_recipe": "__NOMATCH__"}, "matches no module of the nemotron_h model"),
    ({"calibration": {"path": "__BAD__", "samples": 4, "held_out": 1, "seq_length": 16}}, "bad.jsonl:2 is not a JSON"),
    ({"calibration": {"path": "/nonexistent/*.jsonl"}}, "matches no file"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(change, message, tmp_path):
    (tmp_path / "nomatch.yaml").write_text(yaml.safe_dump({"metadata": {"recipe_type": "ptq"}, "quantize": {
        "algorithm": "max", "quant_cfg": [{"quantizer_name": "*", "enable": False}, {
            "quantizer_name": "*decoder.no_such_module*", "cfg": {"num_bits": [4, 3]}}]}}))
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"txt": 1}\n')
    change = json.loads(json.dumps(change).replace("__NOMATCH__", str(tmp_path / "nomatch.yaml"))
                        .replace("__BAD__", str(tmp_path / "bad.jsonl")))
    cfg = tiny_config(tmp_path, **change)
    p = run_script(cfg, tmp_path / "config.yaml")
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("ultra3 quantize: error: ") and message in err, p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "bf16").exists()


def test_a_hub_checkpoint_out_of_reach_is_the_machines_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as without a network: nothing cached, nothing fetched
    p = run_script(tiny_config(tmp_path, make_checkpoint=False, bf16_checkpoint="org/no-such-model"),
                   tmp_path / "config.yaml")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ultra3 quantize: error: bf16_checkpoint: org/no-such-model: the Hugging Face Hub cannot "
                           "be reached from this machine ("), p.stderr


@pytest.mark.parametrize("lines, message", [
    ('{"text": "fine"}\n{"txt": 1}\n', "bad.jsonl:2 is not a JSON record"),
    ('{"text": "too little text for 5 windows of 16 tokens"}\n',
     "holds 42 bytes of text in 1 document(s), at most 43 tokens, fewer than the 80 needed"),
])
def test_calibration_content_is_checked_before_modelopt_torch_or_transformers(lines, message, tmp_path):
    (tmp_path / "bad.jsonl").write_text(lines)
    cfg = tiny_config(tmp_path, calibration={"path": str(tmp_path / "bad.jsonl"), "samples": 4, "held_out": 1,
                                             "seq_length": 16})
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    probe = ("import sys\nfrom recipes import quantize\nrc = quantize.main(['--config', sys.argv[1]])\n"
             "heavy = sorted(m for m in ('modelopt', 'torch', 'transformers') if m in sys.modules)\n"
             "print(rc, heavy)\n")
    p = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "config.yaml")], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert p.stdout.strip() == "2 []", p.stdout + p.stderr
    assert message in p.stderr.strip().splitlines()[-1], p.stderr


def test_bad_input_found_in_the_job_is_one_line_exit_2_through_the_cli(cli, tmp_path):
    """An attached run whose runtime stops on its input: the CLI ends with that one line and exit code 2."""
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"txt": 1}\n')
    r = cli("quantize", "-c", "tiny", f"calibration.path={tmp_path / 'bad.jsonl'}")
    assert r.rc == 2, r.out + r.err
    assert r.err.strip().splitlines() == [r.err.strip()]  # one line
    assert "stopped on its input: ultra3 quantize: error: calibration.path:" in r.err and "bad.jsonl:2" in r.err
    assert "Traceback" not in r.out + r.err


AUTO_BRIDGE = "megatron.bridge.models.conversion.auto_bridge.AutoBridge"
HAS_BRIDGE = bool(importlib.util.find_spec("megatron") and importlib.util.find_spec("megatron.bridge"))


def megatron_checkpoint(path: Path, tracker: str = "latest_checkpointed_iteration.txt") -> Path:
    """The checkpoint.save dir Megatron-Bridge leaves: an iteration dir and (unless tracker="") its tracker."""
    (path / "iter_0000040").mkdir(parents=True)
    if tracker:
        (path / tracker).write_text("40\n")
    return path


def test_hf_megatron_or_neither_checkpoint_dir(cli, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    mb = megatron_checkpoint(tmp_path / "mb")
    neither = megatron_checkpoint(tmp_path / "neither", tracker="")
    assert [megatron_export.is_megatron(str(p)) for p in (hf, mb, neither)] == [False, True, False]
    args = ("quantize", "-c", "tiny", "--dry-run", "make_checkpoint=false")
    for ok in (hf, mb):
        r = cli(*args, f"bf16_checkpoint={ok}")
        assert r.rc == 0, r.err
    r = cli(*args, f"bf16_checkpoint={neither}")
    assert r.rc == 2 and "Traceback" not in r.err
    assert f"error: bf16_checkpoint: {neither} is neither a Hugging Face checkpoint (config.json) nor a " \
           "Megatron-Bridge checkpoint (latest_train_state.pt or latest_checkpointed_iteration.txt); give the model " \
           "directory or the checkpoint.save directory of a pretrain/sft job" in r.err_lines


def test_unset_checkpoint_comes_from_the_latest_completed_sft_else_pretrain_job(cli, home, tmp_path):
    args = ("quantize", "-c", "tiny", "--dry-run", "make_checkpoint=false", "bf16_checkpoint=null")
    none = cli(*args)
    assert none.rc == 2 and "error: bf16_checkpoint: no mopd-policy or rlvr-policy or sft-checkpoint or " \
                              "pretrain-checkpoint artifact for this machine in " in none.err
    pre = completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260101-000000-aaaaaa")
    r = cli(*args)
    assert r.rc == 0, r.err
    assert provenance("bf16_checkpoint", pre, "ultra3-pretrain_20260101-000000-aaaaaa",
                      "ultra3-pretrain-checkpoint-tiny:v1").search(r.out), r.out
    sft = completed_pretrain_job(home, tmp_path, "ultra3-sft_20260102-000000-bbbbbb", stage="sft")
    completed_pretrain_job(home, tmp_path, "ultra3-pretrain_20260103-000000-cccccc")  # newer, but sft comes first
    completed_pretrain_job(home, tmp_path, "ultra3-sft_20260104-000000-dddddd", stage="sft", tracker=False)  # none
    r = cli(*args)
    assert r.rc == 0, r.err
    assert provenance("bf16_checkpoint", sft, "ultra3-sft_20260102-000000-bbbbbb",
                      "ultra3-sft-checkpoint-tiny:v1").search(r.out), r.out


def test_runtime_finds_the_job_that_saved_a_megatron_checkpoint(home, tmp_path):
    """The job config next to the checkpoint (<job dir>/<task>/code/config.yaml) is found; without one, or without
    Megatron-Bridge (this CPU machine), the run stops with one line, exit 2 and nothing written."""
    ckpt = Path(completed_pretrain_job(home, tmp_path, "ultra3-sft_20260102-000000-bbbbbb", stage="sft"))
    train, code_dir = megatron_export.training_config(str(ckpt))
    assert train["checkpoint"]["save"] == str(ckpt) and code_dir == str(ckpt.parent / "sft" / "code")
    orphan = megatron_checkpoint(tmp_path / "orphan")
    cases = [(orphan, (f"bf16_checkpoint: {orphan} is a Megatron checkpoint, but no job config (<job dir>/<task>/"
                       "code/config.yaml) next to it saved there"))]
    if not HAS_BRIDGE:
        cases.append((ckpt, (f"bf16_checkpoint: {ckpt} is a Megatron checkpoint, and exporting it needs "
                             "Megatron-Bridge: run in the training container")))
    for path, message in cases:
        job_dir = tmp_path / "quantize-job"
        p = run_script(tiny_config(tmp_path, make_checkpoint=False, bf16_checkpoint=str(path),
                                   job={"dir": str(job_dir)}), tmp_path / "config.yaml")
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.strip().splitlines()[-1].startswith(f"ultra3 quantize: error: {message}"), p.stderr
        assert not job_dir.exists() and not (tmp_path / "out").exists()


def test_reference_model_of_a_job_built_from_our_keys(tmp_path):
    """recipe.hf_model null (the tiny training configs): the config.json the training runtime builds the model
    from, which Megatron-Bridge's HF -> Megatron mapping takes back to the job's keys, and the job's tokenizer."""
    from transformers import AutoTokenizer

    train = yaml.safe_load((REPO / "configs/_shared/tiny.yaml").read_text())
    ref = megatron_export.reference_model(train, str(REPO), str(tmp_path / "ref"))
    back = training_inputs.hf_model_keys(json.loads((Path(ref) / "config.json").read_text()))
    shared = {k: v for k, v in back.items() if k in train["model"]}
    assert len(shared) >= 12 and shared == {k: train["model"][k] for k in shared}
    assert len(AutoTokenizer.from_pretrained(ref)) == train["model"]["vocab_size"]
    hub = {"recipe": {"hf_model": "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"}}
    assert megatron_export.reference_model(hub, str(REPO), str(tmp_path / "no")) == hub["recipe"]["hf_model"]
    assert not (tmp_path / "no").exists()


def test_export_calls_match_the_recorded_api():
    """Every Megatron-Bridge call of the export (on AutoBridge or a bridge it made) against the record of the
    0.6.2 wheel: the method exists, takes that many positional arguments and every keyword."""
    tree = ast.parse(Path(megatron_export.__file__).read_text())
    imported = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("megatron.bridge") for a in n.names}
    assert imported == {AUTO_BRIDGE}
    bridges = {"AutoBridge"} | {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
                                and getattr(n.value.func.value, "id", "") == "AutoBridge" for t in n.targets}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and getattr(n.func.value, "id", "") in bridges]
    assert sorted(c.func.attr for c in calls) == ["export_ckpt", "from_auto_config"]
    assert megatron_api.versions()["megatron-bridge"] == "0.6.2"
    for call in calls:
        name = f"{AUTO_BRIDGE}.{call.func.attr}"
        sig = megatron_api.signature(name)
        assert len(call.args) <= len(sig["params"]) or sig["varargs"], name
        for kw in call.keywords:
            assert megatron_api.accepts(name, kw.arg), f"{name} takes no keyword {kw.arg}"
    assert megatron_api.signature(f"{AUTO_BRIDGE}.export_ckpt")["params"][:2] == ["megatron_path", "hf_path"]


def test_calibration_windows_from_the_packed_parquet_of_sft_data_prep(tmp_path):
    """The directory `ultra3 data prep sft` writes (here through its own Parquet writer): the train split's
    token ids in shard order, cut into windows; ids beyond the tokenizer are refused with one line."""
    import numpy as np
    import pyarrow.parquet as pq
    from transformers import PreTrainedTokenizerFast

    from recipes.dataprep import packed_parquet
    from recipes.quantization import calibration
    from recipes.quantization.errors import QuantizeError

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(REPO / "recipes/samples/tiny/tokenizer.json"))

    def packs(folder: Path, ids: list[list[int]]) -> Path:
        (folder / "train").mkdir(parents=True)
        flat = np.concatenate([np.asarray(p) for p in ids])
        offsets = np.cumsum([0, *(len(p) for p in ids)])
        starts = np.zeros(len(ids), dtype=np.int32)
        pq.write_table(packed_parquet.table(flat, np.ones_like(flat), offsets, starts, np.arange(len(ids) + 1)),
                       folder / "train" / "shard_000000.parquet")
        (folder / calibration.PACKED_MARK).write_text("[]")
        return folder

    good = packs(tmp_path / "good", [list(range(10, 30)), list(range(100, 120))])
    calib, held = calibration.windows(str(good), tokenizer, samples=3, held_out=1, seq_length=10)
    assert calib.tolist() == [list(range(10, 20)), list(range(20, 30)), list(range(100, 110))]
    assert held.tolist() == [list(range(110, 120))]
    bad = packs(tmp_path / "bad", [[1, 2, len(tokenizer) + 5]])
    with pytest.raises(QuantizeError, match=rf"calibration.path: \S+shard_000000.parquet holds token id "
                                            rf"{len(tokenizer) + 5}, beyond the tokenizer's {len(tokenizer)} ids"):
        calibration.windows(str(bad), tokenizer, samples=1, held_out=0, seq_length=2)
