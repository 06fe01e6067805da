"""`ultra3 quantize`: NVFP4 post-training quantization with ModelOpt into a Hugging Face checkpoint."""

from __future__ import annotations

from ..stage import Input, Output, Parts, Stage


def parts() -> Parts:
    from ..cost import quantize
    from ..schema import QUANTIZE as SCHEMA
    from ..validation.quantize import validate_quantize

    return Parts(SCHEMA, validate_quantize, quantize)


QUANTIZE = Stage(
    ("quantize",), "NVFP4 post-training quantization with ModelOpt into a Hugging Face checkpoint.",
    "quantize", "quantize", "torchrun", ("python_version", "image", "quantize_packages", "gpus", "inputs"), parts,
    inputs=(Input("checkpoint", "bf16_checkpoint", ("mopd-policy", "rlvr-policy", "sft-checkpoint",
                                                    "pretrain-checkpoint"), unless="make_checkpoint"),
            Input("calibration", "calibration.path", ("sft-data",), required=False)),
    outputs=(Output("quantized-checkpoint", "output_dir"),),
    examples=("ultra3 quantize -c tiny", "ultra3 quantize -c tiny --dry-run",
              "ultra3 quantize --batch mycluster bf16_checkpoint=/lustre/ckpt/ultra-bf16 "
              "output_dir=/lustre/ckpt/ultra-nvfp4",
              "ultra3 quantize --batch mycluster bf16_checkpoint=/lustre/ckpt/sft calibration.path=/lustre/data/sft"),
)
