"""The full-scale path: Megatron-Bridge's ModelOpt scripts (examples/quantization in the training container,
MB branch ultra-v3) on every rank of the torchrun job: calibration at the model.* layout into a Megatron
checkpoint, then export to Hugging Face at the export.* layout. Each script runs as a child of the rank's
process with the rank's torchrun environment. Not run in this repository's tests (it needs 9 x 8 GPUs and the
container); the command lines follow Megatron-Bridge's documented examples."""

from __future__ import annotations

import os
import subprocess
import sys

from .errors import QuantizeError


def parallel_args(section: dict) -> list[str]:
    return ["--tp", str(section.get("tensor_model_parallel_size") or 1),
            "--pp", str(section.get("pipeline_model_parallel_size") or 1),
            "--ep", str(section.get("expert_model_parallel_size") or 1)]


def commands(cfg: dict, recipe: str, staging: str) -> list[list[str]]:
    examples = os.path.join(cfg["megatron"]["examples_dir"], "quantization")
    megatron_ckpt = os.path.join(staging, "megatron")
    calib = cfg.get("calibration") or {}
    return [
        [sys.executable, os.path.join(examples, "quantize.py"), "--hf-model-id", cfg["bf16_checkpoint"],
         "--export-quant-cfg", recipe, "--calib-size", str(calib.get("samples") or 512),
         "--megatron-save-path", megatron_ckpt, *parallel_args(cfg.get("model") or {}), "--trust-remote-code"],
        [sys.executable, os.path.join(examples, "export.py"), "--hf-model-id", cfg["bf16_checkpoint"],
         "--megatron-load-path", megatron_ckpt, "--export-dir", os.path.join(staging, "hf"),
         *parallel_args(cfg.get("export") or {}), "--dtype", "bfloat16", "--trust-remote-code"],
    ]


def run(cfg: dict, recipe: str, staging: str) -> str:
    """Calibrate and export on this rank; the exported HF directory."""
    if not os.path.isdir(os.path.join(cfg["megatron"]["examples_dir"], "quantization")):
        raise QuantizeError(f"megatron.examples_dir: {cfg['megatron']['examples_dir']}/quantization does not exist; "
                            "run in the training container or point it at Megatron-Bridge's examples")
    env = {**os.environ, "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    for argv in commands(cfg, recipe, staging):
        print("+ " + " ".join(argv), flush=True)
        code = subprocess.call(argv, env=env)
        if code:
            raise SystemExit(code)
    return os.path.join(staging, "hf")
