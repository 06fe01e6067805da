"""Runtime of `ultra3 quantize`: NVFP4 post-training quantization of a BF16 Nemotron-H checkpoint with a ModelOpt
recipe (default: the Ultra NVFP4 recipe shipped in ModelOpt), exported as a quantized Hugging Face checkpoint
with a report.

    python -m recipes.quantize --config config.yaml

Started by recipes.launch under torchrun (one process per GPU; one process on a CPU-only machine) after the
preflight; it runs just as well by hand. Needs the `quantize` extra (nvidia-modelopt, transformers, requests).

Config keys (others, such as `run` and `job`, are ignored):

    bf16_checkpoint: DIR|NAME  # the BF16 checkpoint: Hugging Face (a directory or a hub id), or the Megatron-Bridge
                               # checkpoint dir of a pretrain/sft job, exported to <job.dir>/bf16-hf first
    make_checkpoint: false     # build a seeded random checkpoint of `model` at bf16_checkpoint first (-c tiny)
    tokenizer: null            # tokenizer.json of a made checkpoint (otherwise the checkpoint's own)
    modelopt_recipe: NAME|PATH # a ModelOpt recipe shipped in modelopt_recipes/ or a recipe YAML
    output_dir: DIR            # the quantized checkpoint and quantization_report.json (must be new or empty)
    force: false               # replace an existing output_dir
    backend: hf                # hf: one process, any device; megatron: Megatron-Bridge on the torchrun ranks
    device: auto               # hf backend: auto (cuda when visible) | cpu | cuda
    seed: 1234
    calibration: {path: JSONL, samples: 512, held_out: 16, seq_length: 4096, batch_size: 1}
    model: {...}               # Megatron-Bridge names: the made checkpoint's shape and the calibration layout
    export: {...}              # megatron backend: the export layout (tensor/pipeline/expert_model_parallel_size)
    megatron: {examples_dir: DIR}

Output (output_dir): model*.safetensors (routed experts NVFP4 as packed uint8 + E4M3 block scales, FP8 layers,
KV-cache scales, the rest and the MTP weights BF16), config.json with its quantization_config,
hf_quant_config.json, generation_config.json, the tokenizer, quantization_report.json.

Exit codes: 0 done; 2 a config or input problem (one line on stderr, nothing written: a missing checkpoint, an
unknown recipe, a recipe that matches no module of the model, unusable calibration data, an output_dir holding
something else); 1 anything else (with its traceback).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from . import entry, quiet
from .dataprep.errors import HubUnreachable
from .dataprep.settings import load_config
from .quantization import megatron_export
from .quantization.errors import QuantizeError

PROG = "ultra3 quantize"
REPORT = "quantization_report.json"


def log(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def check_output(cfg: dict) -> str:
    out = cfg.get("output_dir")
    if not out:
        raise QuantizeError("output_dir is not set; set where the quantized checkpoint goes")
    if os.path.isdir(out) and os.listdir(out) and not cfg.get("force"):
        raise QuantizeError(f"output_dir: {out} is not empty; choose a new directory or set force=true")
    return out


def precheck(cfg: dict) -> str:
    """What needs no ModelOpt, torch or transformers, checked first: a bad path costs no heavy import. Returns
    output_dir."""
    out = check_output(cfg)
    ckpt = cfg.get("bf16_checkpoint")
    if ckpt and not cfg.get("make_checkpoint") and ckpt.startswith(("/", ".", "~")) and \
            not os.path.isfile(os.path.join(os.path.expanduser(ckpt), "config.json")) and \
            not megatron_export.is_megatron(ckpt):
        raise QuantizeError(f"bf16_checkpoint: {ckpt} is neither a Hugging Face checkpoint (config.json) nor a "
                            f"Megatron-Bridge checkpoint ({' or '.join(megatron_export.TRACKERS)}); fix the path")
    calib = cfg.get("calibration") or {}
    path = calib.get("path")
    if path and not str(path).startswith("hf://"):
        from .dataprep import inputs
        from .quantization import calibration

        if not inputs.expand(str(path)):
            raise QuantizeError(f"calibration.path: {path} matches no file; give a JSONL file, directory or glob")
        if cfg.get("backend") != "megatron" and not os.path.isfile(os.path.join(path, calibration.PACKED_MARK)):
            calibration.check_text(str(path), *calibration.sizes(calib))
    return out


def load_recipe(name: str) -> dict:
    from modelopt.recipe import load_recipe as load

    try:
        with quiet.prints():  # `[load_recipe] loading: ...`
            recipe = load(name)
    except Exception as e:  # a missing name or file, bad YAML, a schema error: the user's input
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise QuantizeError(f"modelopt_recipe: cannot load {name!r} ({first}); give a recipe shipped in ModelOpt's "
                            "modelopt_recipes/ (without .yaml) or a recipe YAML file") from None
    if getattr(recipe, "quantize", None) is None:
        raise QuantizeError(f"modelopt_recipe: {name!r} is not a post-training quantization recipe "
                            "(no `quantize` section)")
    return recipe.quantize.model_dump()


def source(cfg: dict):
    """(transformers config, tokenizer) of the checkpoint, or of the one `make_checkpoint` will build."""
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    from .quantization import tiny_checkpoint

    ckpt = cfg.get("bf16_checkpoint")
    if not ckpt:
        raise QuantizeError("bf16_checkpoint is not set; give a BF16 Hugging Face checkpoint (a directory or hub id) "
                            "or a Megatron-Bridge checkpoint dir")
    if cfg.get("make_checkpoint"):
        tok_file = cfg.get("tokenizer")
        if not tok_file or not os.path.isfile(tok_file):
            raise QuantizeError(f"tokenizer: {tok_file} is not a tokenizer.json file (make_checkpoint needs one)")
        return tiny_checkpoint.hf_config(cfg["model"]), PreTrainedTokenizerFast(
            tokenizer_file=tok_file, eos_token="<|endoftext|>", pad_token="<|pad|>")
    if ckpt.startswith(("/", ".", "~")) and not os.path.isfile(os.path.join(os.path.expanduser(ckpt), "config.json")):
        raise QuantizeError(f"bf16_checkpoint: {ckpt} is neither a Hugging Face checkpoint (config.json) nor a "
                            f"Megatron-Bridge checkpoint ({' or '.join(megatron_export.TRACKERS)}); fix the path")
    try:
        return AutoConfig.from_pretrained(ckpt), AutoTokenizer.from_pretrained(ckpt)
    except OSError as e:
        from .dataprep.hub import failed

        found = failed(f"bf16_checkpoint: {ckpt}", e.__cause__ or e, "cannot be read")  # transformers wraps the hub's
        raise (found if isinstance(found, HubUnreachable) else
               QuantizeError(f"bf16_checkpoint: cannot read {ckpt} ({str(e).splitlines()[0]})")) from None


def plan(config, quant_cfg: dict, recipe: str) -> dict:
    """What the recipe does to this model, from its config alone; an error when it quantizes nothing."""
    from .quantization import precision

    model = precision.plan(config, quant_cfg)
    if not precision.enabled_quantizers(model):
        patterns = [e["quantizer_name"] for e in quant_cfg["quant_cfg"]
                    if e.get("enable", True) and (e.get("cfg") or {}).get("enable", True)]
        raise QuantizeError(f"modelopt_recipe: {recipe} matches no module of the {config.model_type} model: "
                            f"none of its patterns {', '.join(patterns)} names a quantizer; "
                            "use a recipe written for this model")
    return precision.summary(model)


def pick_device(cfg: dict) -> str:
    import torch

    wanted = cfg.get("device") or "auto"
    if wanted not in ("auto", "cpu", "cuda"):
        raise QuantizeError(f"device: {wanted!r} is not auto, cpu or cuda")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise QuantizeError("device: cuda, but no GPU is visible; use device=auto or cpu")
    device = "cuda" if wanted == "auto" and torch.cuda.is_available() else wanted.replace("auto", "cpu")
    if device == "cpu":
        from .quantization import nvfp4_cpu

        torch.set_num_threads(1)  # tiny ops on busy cores: extra threads only spin
        nvfp4_cpu.install()
        log("no GPU: NVFP4 fake quantization of CPU tensors runs in the pure-PyTorch fallback "
            "(recipes/quantization/nvfp4_cpu.py); ModelOpt's kernels handle everything else")
    return device


def quantize_hf(cfg: dict, config, tokenizer, quant_cfg: dict, staging: str) -> dict:
    """Calibrate, evaluate against BF16 and export, in this process; the report's measured part."""
    import torch
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    from .quantization import accuracy, calibration, export, tiny_checkpoint

    calib = cfg.get("calibration") or {}
    batch = calib.get("batch_size") or 1
    calib_windows, held_out = calibration.windows(calib.get("path") or "", tokenizer, *calibration.sizes(calib))
    device = pick_device(cfg)
    timings = {}
    t0 = time.time()
    if cfg.get("make_checkpoint") and not os.path.isdir(cfg["bf16_checkpoint"]):
        tiny_checkpoint.make(cfg["model"], cfg["tokenizer"], cfg["bf16_checkpoint"], cfg.get("seed") or 0)
        log(f"made the BF16 checkpoint {cfg['bf16_checkpoint']}")
    model = AutoModelForCausalLM.from_pretrained(cfg["bf16_checkpoint"], dtype=torch.bfloat16).to(device).eval()
    timings["load_s"] = time.time() - t0
    held_out, calib_windows = held_out.to(device), calib_windows.to(device)
    reference = accuracy.logits(model, held_out, batch)

    def forward_loop(m):
        with torch.no_grad():
            for i in range(0, len(calib_windows), batch):
                m(calib_windows[i:i + batch])

    t0 = time.time()
    with quiet.prints():  # the modules it found and the quantizers it inserted
        model = mtq.quantize(model, quant_cfg, forward_loop)
    timings["calibrate_s"] = time.time() - t0
    metrics = accuracy.compare(reference, accuracy.logits(model, held_out, batch), held_out)
    log(f"accuracy on {metrics['held_out_tokens']:,} held-out tokens: relative logit error "
        f"{metrics['relative_logit_error']:.4f}, top-1 agreement {metrics['top1_agreement']:.4f}, perplexity "
        f"{metrics['perplexity_bf16']:.3f} -> {metrics['perplexity_quantized']:.3f}")
    t0 = time.time()
    fixes = export.export(model, tokenizer, cfg["bf16_checkpoint"], staging)
    timings["export_s"] = time.time() - t0
    return {"device": device, "calibration": {"path": calib.get("path"), "windows": len(calib_windows),
                                              "seq_length": calib_windows.shape[1]},
            "accuracy": metrics, "export_fixes": fixes, "timings": {k: round(v, 3) for k, v in timings.items()}}


def run(config_path: str) -> int:
    started = time.time()
    cfg = load_config(config_path)
    out = precheck(cfg)
    recipe = cfg.get("modelopt_recipe") or ""
    quant_cfg = load_recipe(recipe)
    given = cfg.get("bf16_checkpoint")
    cfg["bf16_checkpoint"] = megatron_export.to_hf(cfg, log)
    config, tokenizer = source(cfg)
    planned = plan(config, quant_cfg, recipe)
    from .quantization import megatron, precision

    log(f"recipe {recipe}, checkpoint {cfg['bf16_checkpoint']}, backend {cfg.get('backend') or 'hf'}\n"
        + precision.format_table(planned))
    staging = f"{out.rstrip('/')}.staging"
    rank = int(os.environ.get("RANK", "0"))  # only rank 0 clears staging: the others write into it with rank 0
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        if cfg.get("backend") == "megatron":
            exported = megatron.run(cfg, recipe, staging)
            if rank:
                return 0
            from .quantization import export

            tokenizer.save_pretrained(exported)
            measured = {"accuracy": None, "export_fixes": {"sentinel_names_fixed": export.fix_sentinel_names(exported)}}
        else:
            exported = staging
            measured = quantize_hf(cfg, config, tokenizer, quant_cfg, staging)
        origin = {"megatron_checkpoint": given} if given != cfg["bf16_checkpoint"] else {}
        report = {"recipe": recipe, "bf16_checkpoint": cfg["bf16_checkpoint"], **origin,
                  "backend": cfg.get("backend") or "hf",
                  **measured, **planned, "wall_s": round(time.time() - started, 3)}
        with open(os.path.join(exported, REPORT), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(exported, out)
    finally:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
    log(f"wrote {out} (bits per element {planned['bits_per_element']:.3f}) in {time.time() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    # input: QuantizeError, the config unreadable; the machine: the hub unreachable
    return entry.main(__doc__, run, PROG, (HubUnreachable,), argv)


if __name__ == "__main__":
    sys.exit(main())
