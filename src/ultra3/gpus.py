"""Facts about the GPU types a profile can name, and the GPUs visible on this machine."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from .contract import trains_nvfp4


@dataclass(frozen=True)
class GpuType:
    name: str
    compute_capability: tuple[int, int]
    memory_gb: float  # usable HBM per GPU
    nvlink_domain: int  # GPUs that share one NVLink domain
    platform: str = "linux/amd64"  # of its nodes' CPUs (Grace: linux/arm64)

    @property
    def supports_nvfp4(self) -> bool:
        return trains_nvfp4(self.compute_capability)


GPU_TYPES: dict[str, GpuType] = {
    g.name: g
    for g in (
        GpuType("a100", (8, 0), 80, 8),  # BF16 only: no FP8 (SM 8.9+) nor NVFP4 (Blackwell) tensor cores
        GpuType("h100", (9, 0), 80, 8),
        GpuType("h200", (9, 0), 141, 8),
        GpuType("b200", (10, 0), 180, 8),
        GpuType("gb200", (10, 0), 186, 72, "linux/arm64"),
        GpuType("gb300", (10, 3), 288, 72, "linux/arm64"),
    )
}


def visible_gpu_count() -> int:
    """NVIDIA GPUs this process may use, without importing torch or calling nvidia-smi."""
    devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(devices)
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(len(ids), len(devices))
