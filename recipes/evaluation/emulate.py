"""A ModelOpt-quantized Hugging Face checkpoint (NVFP4 experts, FP8 projections, FP8 KV cache) run by the hf
backend, on CPU or any GPU: its weights dequantized exactly as stored into a BF16 copy, and its activations
quantized where a weight-only kernel would not:

* FP8 layers (weight float8_e4m3fn with a per-tensor weight_scale): inputs fake-quantized to E4M3 with the
  calibrated static input_scale, as an FP8 GEMM reads them;
* the KV cache: k_proj and v_proj outputs fake-quantized to E4M3 with their k_scale and v_scale;
* NVFP4 layers (two E2M1 codes per byte, low nibble first, FP8 E4M3 scales per 16 inputs under a per-tensor
  weight_scale_2): weights only; activations stay BF16, as in vLLM's weight-only FP4 kernel on GPUs without FP4
  tensor cores (before Blackwell). The fused experts of transformers' Nemotron-H take no input hook.

results.json names the emulation, so a comparison says what it compared."""

from __future__ import annotations

import glob
import json
import os
import shutil

from ..contract import QUANT_CONFIG

E4M3_MAX = 448.0
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes by the low three bits; bit 3 is the sign
SCALES = "activation_scales.json"  # in the BF16 copy: module -> (kind, scale) of the quantized activations
SUMMARY = ("weights dequantized from the checkpoint; FP8 layer inputs and the FP8 KV cache fake-quantized with their "
           "calibrated scales; NVFP4 expert activations in BF16 (weight-only FP4)")


def unpack_e2m1(packed):
    """uint8 [..., n/2] -> float32 [..., n]: the low nibble is the even element."""
    import torch

    table = torch.tensor([*E2M1, *(-v for v in E2M1)], dtype=torch.float32)
    low, high = (packed & 0x0F).long(), (packed >> 4).long()
    return torch.stack((table[low], table[high]), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize(tensors: dict) -> tuple[dict, dict]:
    """(BF16 tensors, module -> [kind, scale]) of a quantized state dict."""
    import torch

    out, scales = {}, {}
    for key, value in tensors.items():
        module, _, leaf = key.rpartition(".")
        if leaf in ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale"):
            continue
        if leaf == "weight" and value.dtype == torch.uint8:  # NVFP4
            blocks = tensors[f"{module}.weight_scale"].float() * tensors[f"{module}.weight_scale_2"].float()
            codes = unpack_e2m1(value)
            group = codes.shape[-1] // blocks.shape[-1]
            value = codes * blocks.repeat_interleave(group, dim=-1)
        elif leaf == "weight" and value.dtype == torch.float8_e4m3fn:  # FP8, per tensor
            value = value.float() * tensors[f"{module}.weight_scale"].float()
            if f"{module}.input_scale" in tensors:
                scales[module] = ["input", float(tensors[f"{module}.input_scale"])]
        out[key] = value.to(torch.bfloat16) if value.is_floating_point() else value
        for kv in ("k_scale", "v_scale"):
            if leaf == "weight" and f"{module}.{kv}" in tensors:
                scales[module] = ["output", float(tensors[f"{module}.{kv}"])]
    return out, scales


def bf16_copy(src: str, dest: str) -> str:
    """`dest`: a BF16 Hugging Face checkpoint of the quantized `src`, written once (a complete copy is reused)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if os.path.isfile(os.path.join(dest, SCALES)):
        return dest
    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    scales = {}
    for path in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            tensors, found = dequantize({k: f.get_tensor(k) for k in f.keys()})
        save_file(tensors, os.path.join(tmp, os.path.basename(path)), metadata={"format": "pt"})
        scales.update(found)
    for name in os.listdir(src):
        if not name.endswith(".safetensors") and name not in (QUANT_CONFIG, "config.json") and \
                os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), tmp)
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    config["dtype"] = "bfloat16"
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(tmp, SCALES), "w", encoding="utf-8") as f:  # written last: the copy is complete
        json.dump(scales, f, indent=1)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def fake_fp8(x, scale: float):
    """x through E4M3 at `scale` (saturating), back in x's dtype."""
    import torch

    return ((x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def quantize_activations(model, folder: str) -> int:
    """Hooks on `model` (loaded from a bf16_copy) for its quantized activations; the number of modules hooked.
    Checkpoint names start `backbone.`, transformers' modules `model.`."""
    with open(os.path.join(folder, SCALES), encoding="utf-8") as f:
        scales = json.load(f)
    modules = dict(model.named_modules())
    hooked = 0
    for name, (where, scale) in scales.items():
        module = modules.get(name) or modules.get("model." + name.removeprefix("backbone."))
        if module is None:
            continue  # a module the HF class drops (the MTP layers)
        if where == "input":
            module.register_forward_pre_hook(lambda _m, args, s=scale: (fake_fp8(args[0], s), *args[1:]))
        else:
            module.register_forward_hook(lambda _m, _args, out, s=scale: fake_fp8(out, s))
        hooked += 1
    return hooked
