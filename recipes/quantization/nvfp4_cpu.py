"""NVFP4 fake quantization of CPU tensors in pure PyTorch, for machines without a GPU.

ModelOpt 0.47 fake-quantizes NVFP4 with Triton/CUDA kernels only: a dynamic block (activations) asserts
that amax is a CUDA tensor, and a static block (MSE and Four-Over-Six weights) needs Triton. `install()`
routes CPU tensors of those two call sites here and leaves every other tensor to ModelOpt. The math is
ModelOpt's: E2M1 magnitudes with its rounding thresholds, per-block scales block_amax / 6 rounded to FP8
E4M3 under a per-tensor scale (global_amax / 6 / fp8_max, fp8_max = 448, or 256 for Four-Over-Six)."""

from __future__ import annotations

import torch

E2M1_MAX, E4M3_MAX = 6.0, 448.0
# |x|/scale up to each bound rounds to the magnitude at its index; ties go as in ModelOpt's kernels
# (<= at 0.25, 1.25, 2.5, 5.0 rounds down; < at 0.75, 1.75, 3.5 rounds up)
_BOUNDS = ((0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True))
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_e2m1(scaled: torch.Tensor) -> torch.Tensor:
    """|scaled| rounded to the nearest E2M1 magnitude, with the sign of `scaled`."""
    mag = scaled.abs()
    out = torch.full_like(mag, _MAGNITUDES[-1])
    for (bound, inclusive), value in reversed(list(zip(_BOUNDS, _MAGNITUDES))):
        out = torch.where(mag <= bound if inclusive else mag < bound, value, out)
    return torch.where(scaled >= 0, out, -out)


def fp8_block_scales(block_amax: torch.Tensor, global_amax: torch.Tensor, fp8_max: float = E4M3_MAX) -> torch.Tensor:
    """block_amax / 6, saturated and rounded to FP8 E4M3 in units of global_amax / 6 / fp8_max."""
    unit = global_amax.float() / (E2M1_MAX * fp8_max)
    unit = torch.where(unit > 0, unit, torch.ones_like(unit))
    in_fp8 = (block_amax.float() / E2M1_MAX / unit).clamp(max=E4M3_MAX)
    return in_fp8.to(torch.float8_e4m3fn).float() * unit


def _apply(x: torch.Tensor, scales: torch.Tensor, block: int, out_dtype: torch.dtype) -> torch.Tensor:
    blocks = x.float().reshape(-1, block)
    scales = scales.reshape(-1, 1)
    usable = (scales > 0) & torch.isfinite(scales)
    safe = torch.where(usable, scales, torch.ones_like(scales))
    out = torch.where(usable, round_e2m1(blocks / safe) * safe, torch.zeros_like(blocks))
    return out.reshape(x.shape).to(out_dtype)


def dynamic_fake_quant(x: torch.Tensor, global_amax: torch.Tensor, block: int = 16) -> torch.Tensor:
    """Blocks of `block` along the last dim, each scaled by its own amax (activations)."""
    block_amax = x.float().reshape(-1, block).abs().amax(dim=-1)
    scales = fp8_block_scales(block_amax, global_amax)
    scales = torch.where(scales >= 1e-5, scales, torch.ones_like(scales))  # as ModelOpt: tiny blocks unscaled
    return _apply(x, scales, block, x.dtype)


def static_fake_quant(x, amax, global_amax=None, quantize_block_scales=True, fp8_max_for_normalization=E4M3_MAX,
                      out_dtype=None, pass_through_bwd=False) -> torch.Tensor:
    """Blocks with calibrated per-block amax (MSE / Four-Over-Six weights); ModelOpt's signature."""
    block = x.numel() // amax.numel()
    block_amax = amax.float().reshape(-1)
    if global_amax is None:
        global_amax = block_amax.max()
    scales = (fp8_block_scales(block_amax, global_amax * E4M3_MAX / fp8_max_for_normalization)
              if quantize_block_scales else block_amax / E2M1_MAX)
    return _apply(x, scales, block, out_dtype or x.dtype)


def install() -> None:
    """Route CPU tensors of ModelOpt's two GPU-only NVFP4 fake-quant call sites here."""
    from modelopt.torch.quantization import tensor_quant
    from modelopt.torch.quantization.nn.modules import tensor_quantizer

    dynamic_op, static_op = tensor_quant.dynamic_block_quantize_op, tensor_quantizer.static_blockwise_fp4_fake_quant
    if getattr(dynamic_op, "cpu_fallback", False):
        return

    def dynamic(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
        nvfp4 = (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4)
        if nvfp4 and not inputs.is_cuda and amax is not None:
            return dynamic_fake_quant(inputs, amax.amax(), block_size)
        return dynamic_op(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits)

    def static(x, *args, **kwargs):
        return (static_op if x.is_cuda else static_fake_quant)(x, *args, **kwargs)

    dynamic.cpu_fallback = True
    tensor_quant.dynamic_block_quantize_op = dynamic
    tensor_quantizer.static_blockwise_fp4_fake_quant = static
