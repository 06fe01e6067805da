"""The facts of a training config that the validation rules, the cost model and the precision map all compute:
safe config reads, the parallel mesh, GPU and precision facts, the hybrid layer pattern (parameter counts:
ultra3.model_params).

Everything here is a pure function of the resolved config (plain dicts), so a caller can call it again instead
of depending on the order in which the rules run. Stdlib only: the dry run must stay fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ultra3.dotted import get
from ultra3.gpus import GPU_TYPES, GpuType

# Megatron-Bridge config keys the rules talk about.
TP = "model.tensor_model_parallel_size"
PP = "model.pipeline_model_parallel_size"
VPP = "model.virtual_pipeline_model_parallel_size"
CP = "model.context_parallel_size"
EP = "model.expert_model_parallel_size"
ETP = "model.expert_tensor_parallel_size"
SP = "model.sequence_parallel"
LAYOUT = "model.pipeline_model_parallel_layout"
SEQ = "model.seq_length"
GBS = "train.global_batch_size"
MBS = "train.micro_batch_size"
NUM_LAYERS = "model.num_layers"
EXPERTS = "model.num_moe_experts"
NODES = "run.nodes"
GPUS = "run.gpus_per_node"

PARALLEL_SIZE_KEYS = (TP, PP, CP, EP, ETP)
# what a finding quoting a derived size names (report.error(..., quoting=...)): the keys the size comes from
WORLD_KEYS = (NODES, GPUS)
DP_KEYS = (*WORLD_KEYS, TP, PP, CP)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def pos_int(value: object) -> int | None:
    """The value when it is a positive int (bools are not ints here), else None."""
    return value if is_int(value) and value > 0 else None  # type: ignore[return-value]


def number(value: object) -> float | None:
    """An int or float config value as float; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def flag(cfg: dict, dotted: str) -> bool | None:
    """A boolean config value; None when unset or not a bool."""
    value = get(cfg, dotted)
    return value if isinstance(value, bool) else None


def slurm_seconds(text: str) -> int | None:
    """A Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds, or None."""
    days, dash, clock = text.partition("-") if "-" in text else ("0", "", text)
    parts = clock.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    values = [int(p) for p in parts]
    if dash:  # D-HH[:MM[:SS]]
        h, m, s = (values + [0, 0])[:3]
    else:  # MM, MM:SS, HH:MM:SS
        h, m, s = [0] * (3 - len(values)) + values if len(values) == 3 else (0, *(values + [0])[:2])
    return int(days) * 86400 + h * 3600 + m * 60 + s


def divisors(n: int, limit: int = 8) -> str:
    """'1, 2, 3, 4, 6, 9, 12, ...' — the first `limit` divisors of n, for fix hints."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divs = sorted(set(small + [n // d for d in small]))
    text = ", ".join(str(d) for d in divs[:limit])
    return text + (", ..." if len(divs) > limit else "")


def fmt_count(n: float) -> str:
    """Human token/parameter counts: 20.00T, 200.0B, 7.3M, 512."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.2f}{unit}" if value < 100 else f"{value:.1f}{unit}"
    return f"{n:g}"


GIB = 1024**3


def fmt_gib(nbytes: float) -> str:
    if nbytes < GIB:
        return f"{nbytes / 1024**2:.0f} MiB"
    return f"{nbytes / GIB:.1f} GiB"


# ---------------------------------------------------------------------------------------------------------
# The parallel mesh


@dataclass(frozen=True)
class Mesh:
    """Parallel sizes (defaults as in Megatron-Bridge: 1 when unset) and the cluster size when known."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int | None
    etp_was_set: bool
    nodes: int | None
    gpus_per_node: int | None

    @property
    def world(self) -> int | None:
        if self.nodes is None or self.gpus_per_node is None:
            return None
        return self.nodes * self.gpus_per_node

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def expert_mesh(self) -> int:
        return self.ep * self.etp

    @property
    def dp(self) -> int | None:
        """Data-parallel size, None when the world size is unknown or not a multiple of TP·PP·CP."""
        world = self.world
        if world is None or world % self.model_parallel:
            return None
        return world // self.model_parallel

    @property
    def edp(self) -> int | None:
        """Expert data-parallel size: the GPUs of one pipeline stage (TP·CP·DP) over the expert mesh."""
        dp = self.dp
        if dp is None:
            return None
        stage = self.tp * self.cp * dp
        if stage % self.expert_mesh:
            return None
        return stage // self.expert_mesh


def mesh(cfg: dict) -> Mesh | None:
    """The mesh, or None when a parallel size is not a positive int (parallelism.check reports that)."""
    sizes = {}
    for key in PARALLEL_SIZE_KEYS:
        raw = get(cfg, key)
        sizes[key] = 1 if raw is None else pos_int(raw)
        if sizes[key] is None:
            return None
    vpp_raw = get(cfg, VPP)
    vpp = None if vpp_raw is None else pos_int(vpp_raw)
    if vpp_raw is not None and vpp is None:
        return None
    return Mesh(
        tp=sizes[TP],
        pp=sizes[PP],
        cp=sizes[CP],
        ep=sizes[EP],
        etp=sizes[ETP],
        vpp=vpp if vpp and vpp > 1 else None,
        etp_was_set=get(cfg, ETP) is not None,
        nodes=pos_int(get(cfg, NODES)),
        gpus_per_node=pos_int(get(cfg, GPUS)),
    )


def num_microbatches(cfg: dict, m: Mesh) -> int | None:
    """GBS / (MBS·DP) when everything is known and divides, else None."""
    gbs, mbs, dp = pos_int(get(cfg, GBS)), pos_int(get(cfg, MBS)), m.dp
    if gbs is None or mbs is None or dp is None or gbs % (mbs * dp):
        return None
    return gbs // (mbs * dp)


# ---------------------------------------------------------------------------------------------------------
# GPU type


def gpu_type(cfg: dict) -> GpuType | None:
    """The profile's GPU type, None when unknown (unset or not in GPU_TYPES)."""
    name = get(cfg, "cluster.gpu")
    if not isinstance(name, str):
        return None
    return GPU_TYPES.get(name.strip().lower())


def nvlink_domain_key(cfg: dict) -> str:
    """The key nvlink_domain() reads its size from: the override when set, else the GPU type."""
    return "cluster.nvlink_domain_size" if pos_int(get(cfg, "cluster.nvlink_domain_size")) else "cluster.gpu"


def nvlink_domain(cfg: dict) -> int | None:
    """GPUs per NVLink domain: cluster.nvlink_domain_size when set, else the GPU type's; None when unknown."""
    override = pos_int(get(cfg, "cluster.nvlink_domain_size"))
    if override is not None:
        return override
    gpu = gpu_type(cfg)
    return gpu.nvlink_domain if gpu else None


# ---------------------------------------------------------------------------------------------------------
# Mixed precision

# BF16 layer defaults of the NVFP4 presets: (first_last_layers_bf16, num_layers_at_start_in_bf16,
# num_layers_at_end_in_bf16). Sources: megatron-bridge.md §3.1 (MB 0.6.2 presets; Nemotron builds the Ultra one by
# hand with the same numbers). Any other NVFP4 preset keeps every layer in NVFP4 unless the model keys say otherwise.
_BF16_LAYER_PRESETS = {
    "nemotron_3_ultra_bf16_with_nvfp4_mixed": (True, 0, 16),
    "nemotron_3_super_bf16_with_nvfp4_mixed": (True, 0, 14),
}


@dataclass(frozen=True)
class Precision:
    name: str  # preset name as written, or "custom" for a dict
    nvfp4: bool
    mxfp8: bool
    fp8: bool  # any FP8 recipe (mxfp8 included)
    preset: dict  # the dict form's fields ({} for a preset name)


def precision(cfg: dict) -> Precision | None:
    """Classify `mixed_precision`: a Megatron-Bridge preset name, or a MixedPrecisionConfig-like dict."""
    value = cfg.get("mixed_precision") if isinstance(cfg, dict) else None
    if isinstance(value, str) and value.strip():
        name = value.strip().lower()
        return Precision(value.strip(), "nvfp4" in name, "mxfp8" in name, "fp8" in name, {})
    if isinstance(value, dict):
        fp4 = bool(value.get("fp4")) and str(value.get("fp4_recipe") or "nvfp4").lower() == "nvfp4"
        fp8 = bool(value.get("fp8"))
        mxfp8 = fp8 and str(value.get("fp8_recipe") or "").lower() == "mxfp8"
        return Precision("custom", fp4, mxfp8, fp8, value)
    return None


def precision_knob(cfg: dict, prec: Precision | None, name: str) -> object:
    """A precision field: model.<name> wins, then the mixed_precision dict's field, else None."""
    value = get(cfg, f"model.{name}")
    if value is None and prec is not None:
        value = prec.preset.get(name)
    return value


def fp4_param_gather(cfg: dict, prec: Precision | None) -> bool:
    """Whether NVFP4 primary weights are on. The MB NVFP4 presets set fp4_param_gather=True (so fp4_param=True)."""
    if prec is None or not prec.nvfp4:
        return False
    explicit = get(cfg, "ddp.fp4_param_gather")
    if isinstance(explicit, bool):
        return explicit
    for name in ("fp4_param_gather", "fp4_param"):
        value = precision_knob(cfg, prec, name)
        if isinstance(value, bool):
            return value
    return True


def bf16_layer_counts(cfg: dict, prec: Precision | None, num_layers: int) -> tuple[int, int]:
    """(layers at the start, layers at the end) that stay BF16 under NVFP4; (0, 0) when none do."""
    first_last, start, end = _BF16_LAYER_PRESETS.get((prec.name.lower() if prec else ""), (False, 0, 0))
    value = precision_knob(cfg, prec, "first_last_layers_bf16")
    if isinstance(value, bool):
        first_last = value
    value = precision_knob(cfg, prec, "num_layers_at_start_in_bf16")
    if is_int(value) and value >= 0:
        start = value
    value = precision_knob(cfg, prec, "num_layers_at_end_in_bf16")
    if is_int(value) and value >= 0:
        end = value
    if not first_last:
        return 0, 0
    start = min(start, num_layers)
    end = min(end, num_layers - start)
    return start, end


# ---------------------------------------------------------------------------------------------------------
# Hybrid layer pattern

PATTERN_SYMBOLS = {
    "M": "Mamba-2",
    "*": "attention",
    "E": "MoE",
    "-": "dense MLP",
    "G": "GDN",
    "D": "DS-attention",
    "+": "MLA",
}
PIPE = "|"
MTP_SEPARATOR = "/"


def pattern(cfg: dict) -> tuple[str, str] | None:
    """(key, pattern) of the hybrid layer pattern; the deprecated hybrid_override_pattern counts too."""
    for key in ("model.hybrid_layer_pattern", "model.hybrid_override_pattern"):
        value = get(cfg, key)
        if isinstance(value, str) and value:
            return key, value
    return None


def main_pattern(text: str) -> str:
    """The main decoder part of a pattern: before the MTP separator '/', pipeline splits '|' kept."""
    return text.split(MTP_SEPARATOR, 1)[0]
