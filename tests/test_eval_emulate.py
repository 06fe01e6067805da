"""The hf backend's emulation of a ModelOpt-quantized checkpoint (recipes/evaluation/emulate.py): E2M1 codes
unpacked low nibble first, NVFP4 and FP8 weights dequantized with their scales, FP8 activations saturating at 448,
and the BF16 copy written once with the scales its hooks read."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors.torch")

from recipes.evaluation import emulate  # noqa: E402


def test_two_codes_a_byte_low_nibble_first():
    packed = torch.tensor([[0x21, 0x9F]], dtype=torch.uint8)  # 1, 2 | 15 (-6), 9 (-0.5)
    assert emulate.unpack_e2m1(packed).tolist() == [[0.5, 1.0, -6.0, -0.5]]


def test_nvfp4_and_fp8_weights_dequantized_with_their_scales():
    codes = torch.arange(32, dtype=torch.uint8).reshape(1, 32) % 16  # 64 values: four blocks of 16
    packed = (codes[:, 1::2] << 4 | codes[:, 0::2]).reshape(1, 16).repeat(2, 2)  # [2, 32] -> 64 inputs a row
    tensors = {
        "e.weight": packed, "e.weight_scale": torch.tensor([[1.0, 2.0, 4.0, 0.5]] * 2).to(torch.float8_e4m3fn),
        "e.weight_scale_2": torch.tensor(0.25), "e.input_scale": torch.tensor(0.1),
        "f.weight": torch.tensor([[1.5, -3.0]]).to(torch.float8_e4m3fn), "f.weight_scale": torch.tensor(0.5),
        "f.input_scale": torch.tensor(0.02), "k.weight": torch.ones(2, 2, dtype=torch.bfloat16),
        "k.k_scale": torch.tensor(0.03), "norm.weight": torch.ones(3, dtype=torch.bfloat16),
    }
    out, scales = emulate.dequantize(tensors)
    assert set(out) == {"e.weight", "f.weight", "k.weight", "norm.weight"}
    assert all(t.dtype == torch.bfloat16 for t in out.values())
    row = emulate.unpack_e2m1(packed[:1])[0] * 0.25
    assert out["e.weight"].shape == (2, 64)
    assert out["e.weight"][0, :16].float().tolist() == (row[:16] * 1.0).tolist()
    assert out["e.weight"][0, 16:32].float().tolist() == (row[16:32] * 2.0).tolist()
    assert out["e.weight"][0, 48:].float().tolist() == (row[48:] * 0.5).tolist()
    assert out["f.weight"].float().tolist() == [[0.75, -1.5]]
    assert scales == {"f": ["input", pytest.approx(0.02)], "k": ["output", pytest.approx(0.03)]}


def test_fp8_activations_saturate_and_round():
    x = torch.tensor([0.0, 0.01, 1.0, 100.0], dtype=torch.bfloat16)
    y = emulate.fake_fp8(x, 0.01)
    assert y.dtype == torch.bfloat16
    assert y.float().tolist()[:2] == [0.0, pytest.approx(0.01, rel=0.01)]
    assert y.float()[3].item() == pytest.approx(4.48, rel=0.01)  # 448 steps of 0.01 at most
    assert abs(y.float()[2].item() - 1.0) <= 1.0 / 16  # three mantissa bits


def test_the_bf16_copy_is_written_once_with_its_scales(tmp_path):
    src, dest = tmp_path / "nvfp4", tmp_path / "bf16"
    src.mkdir()
    safetensors.save_file({"f.weight": torch.tensor([[1.0]]).to(torch.float8_e4m3fn),
                           "f.weight_scale": torch.tensor(2.0), "f.input_scale": torch.tensor(0.5)},
                          str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "x", "quantization_config": {"quant_algo": "FP8"}}))
    (src / "hf_quant_config.json").write_text("{}")
    (src / "tokenizer.json").write_text("{}")
    assert emulate.bf16_copy(str(src), str(dest)) == str(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["activation_scales.json", "config.json", "model.safetensors",
                                                      "tokenizer.json"]
    assert "quantization_config" not in json.loads((dest / "config.json").read_text())
    assert json.loads((dest / emulate.SCALES).read_text()) == {"f": ["input", 0.5]}
    stamp = (dest / "model.safetensors").stat().st_mtime_ns
    emulate.bf16_copy(str(src), str(dest))  # complete: reused
    assert (dest / "model.safetensors").stat().st_mtime_ns == stamp
