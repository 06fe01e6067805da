"""Per-GPU memory estimate against the GPU's HBM, and the model's parameter counts.

Parameters come from params.py. Each pipeline rank holds its layers (params.rank_layers), the first rank also the
embedding, the last the output layer and the MTP block; the busiest rank decides. Per GPU a rank's parameters are
dense/TP + experts/(EP·ETP).

Bytes per parameter:

* weights 2 B (BF16). With NVFP4 primary weights (fp4_param_gather, which the MB NVFP4 presets turn on) the linear
  weights of layers outside the BF16 layer set take 1.125 B instead: 4-bit values plus one E4M3 scale per 16
  (0.5625 B), stored rowwise and columnwise. Embedding, output layer, norms, routers and the MTP block stay 2 B.
* gradients 4 B with ddp.grad_reduce_in_fp32 (true unless set false), else 2 B: the full local grad buffer.
* optimizer 12 B (FP32 master weights + Adam m and v). The distributed optimizer (on unless
  ddp/optimizer.use_distributed_optimizer is false) shards dense parameters over DP·CP and experts over expert-DP.

Activations (rough; BF16 values kept for the backward pass, counted per token of one microbatch):

* T = micro_batch_size·seq_length/CP tokens per GPU. With sequence parallelism (TP>1) every stored tensor is split
  over TP; without it only the tensors inside the TP region are, the rest is replicated.
* Per layer (h hidden, d_inner Mamba width, k top-k, F expert hidden, L latent, S shared expert hidden, E experts):
  Mamba-2 2h + in_proj output + conv output + 2·d_inner + FP32 chunk states (heads·head_dim·state/chunk, ×2);
  attention 2h + QKV + core output (flash attention stores nothing quadratic); LatentMoE 2h + FP32 router logits
  2E + L + k·L + 2·k·F + k·L + L + 2S; dense MLP 2h + 2·ffn.
* Selective recompute (model.recompute_modules): layernorm drops a norm output (h), moe keeps only the MoE layer
  input, moe_act drops the expert activation (k·F), shared_experts drops the shared expert's (2S), mlp keeps only
  the dense MLP input; core_attn saves nothing measurable with flash attention.
* Full recompute keeps one hidden state (h) per group of recompute_num_layers layers (method uniform) or for the
  first recompute_num_layers layers of each chunk (method block), plus one group's activations while it recomputes.
* Microbatches in flight on pipeline rank r: min(PP − r, microbatches) under 1F1B; interleaved (VPP):
  min(2·(PP − r − 1) + (VPP − 1)·PP + 1, microbatches·VPP) chunks of 1/VPP of the rank's layers.
* The last rank adds the MTP depths' activations per microbatch, and once FP32 logits for the output layer and each
  MTP depth: seq/CP · vocab/TP · 4 B each.
* Plus a flat 5 GiB for the CUDA context, NCCL and dispatcher buffers, workspaces and fragmentation.

Error above the GPU's HBM, warning above 90% of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dotted import get
from .. import model_params as P
from ..model_math import (
    DP_KEYS,
    EP,
    ETP,
    GBS,
    GIB,
    MBS,
    PP,
    SEQ,
    SP,
    VPP,
    Mesh,
    bf16_layer_counts,
    flag,
    fmt_count,
    fmt_gib,
    fp4_param_gather,
    gpu_type,
    mesh,
    num_microbatches,
    pos_int,
    precision,
)

OVERHEAD_BYTES = 5 * GIB
FP4_WEIGHT_BYTES = 2 * (0.5 + 1 / 16)
WARN_FRACTION = 0.9
MAX_LAYERS = 4096  # beyond this the layer-by-layer estimate is pointless (and no longer takes microseconds)
# the keys the estimate's findings quote: the knobs it turns on, the model's shape aside
ESTIMATE_KEYS = (*DP_KEYS, EP, ETP, VPP, SP, SEQ, MBS, GBS, "model.recompute_granularity", "mixed_precision",
                 "ddp.grad_reduce_in_fp32", "ddp.use_distributed_optimizer", "cluster.gpu")


def _recompute(cfg: dict) -> tuple[str | None, set[str], str, int]:
    granularity = get(cfg, "model.recompute_granularity")
    granularity = granularity if granularity in ("full", "selective") else None
    modules = get(cfg, "model.recompute_modules")
    if granularity == "selective" and not isinstance(modules, list):
        modules = ["core_attn"]  # MCore's default selective module
    method = get(cfg, "model.recompute_method")
    layers = pos_int(get(cfg, "model.recompute_num_layers")) or 1
    return granularity, set(modules) if isinstance(modules, list) else set(), method or "uniform", layers


def _layer_activation(symbol: str, d: P.Dims, cfg: dict, modules: set[str]) -> tuple[float, float]:
    """(elements outside the TP region, elements inside it) stored per token by one layer, selective recompute."""
    h = d.h
    norm = h + (0 if "layernorm" in modules else h)  # norm input + norm output
    if symbol in ("M", "G"):
        d_inner = d.m_heads * d.m_head_dim
        bc = 2 * d.m_groups * d.m_state
        chunk = pos_int(get(cfg, "model.mamba_chunk_size")) or 128
        states = 2 * d.m_heads * d.m_head_dim * d.m_state / chunk  # FP32 = 2 BF16 elements
        return norm, (2 * d_inner + bc + d.m_heads) + (d_inner + bc) + 2 * d_inner + states
    if symbol in ("*", "D", "+"):
        heads, groups, kv = d.heads or 1, d.groups or 1, d.kv or h
        return norm, (heads + 2 * groups) * kv + heads * kv
    if symbol == "E" and d.experts:
        if "moe" in modules:
            return h, 0.0
        width = d.latent or h
        latent = 2 * d.latent if d.latent else 0
        act = 0 if "moe_act" in modules else d.topk * d.moe_ffn
        shared = 0 if "shared_experts" in modules else 2 * d.shared
        routed = latent + 2 * d.topk * width + d.topk * d.moe_ffn + act
        return norm + 2 * d.experts, routed + shared
    # dense MLP ('-'), or an 'E' layer of a model without experts
    if "mlp" in modules:
        return h, 0.0
    return norm, 2.0 * d.ffn


@dataclass(frozen=True)
class _Estimate:
    """What the per-GPU estimate reads: the model, the mesh, the batch and the knobs that change its bytes."""

    cfg: dict
    d: P.Dims
    symbols: list[str]
    table: dict[str, P.LayerParams]
    model: P.ModelCount
    m: Mesh
    microbatches: int
    fp4_weights: bool
    bf16_start: int
    bf16_end: int
    grad_bytes: int
    distributed: bool
    dense_shards: int
    expert_shards: int
    granularity: str | None
    modules: set[str]  # the selective recompute modules (empty unless granularity is selective)
    method: str
    group: int
    sp: bool
    tokens: float  # per GPU in one microbatch

    def per_token_bytes(self, symbol: str) -> float:
        """Activation bytes one layer of type `symbol` stores per token on one GPU."""
        outside, inside = _layer_activation(symbol, self.d, self.cfg, self.modules)
        return 2 * (outside / (self.m.tp if self.sp else 1) + inside / self.m.tp)

    @property
    def hidden_bytes(self) -> float:
        """Bytes of one stored hidden state per token."""
        return 2 * self.d.h / (self.m.tp if self.sp else 1)


@dataclass(frozen=True, order=True)
class _Rank:
    """One pipeline rank's bytes per GPU; ordered by total, then rank: max() finds the busiest (the later on a tie)."""

    total: float
    rank: int
    layers: int
    dense: float  # parameters per GPU
    expert: float
    weights: float
    grads: float
    optimizer: float
    activations: float
    in_flight: float  # microbatches


def check(cfg: dict, report) -> None:
    """Parameter counts into the facts and the memory table, then the busiest GPU's estimate against its HBM."""
    num_layers = pos_int(get(cfg, "model.num_layers"))
    d, why = P.dims(cfg)
    if d is None or num_layers is None or num_layers > MAX_LAYERS:
        reason = why or ("model.num_layers is unset" if num_layers is None else f"more than {MAX_LAYERS} layers")
        report.note("model", f"memory estimate skipped: {reason}")
        return
    symbols, mix_source = P.layer_types(cfg, num_layers)
    table = P.per_symbol(d)
    model = P.count(cfg, d, symbols)
    rows = _parameter_rows(report, model, mix_source)
    e = _estimate(cfg, d, symbols, table, model)
    if e is None:
        rows.append(("per-GPU estimate", "skipped: needs the world size, a valid mesh, seq_length and MBS"))
        return
    layers = P.rank_layers(cfg, len(symbols), e.m.pp, e.m.vpp)
    ranks = [_rank(e, r, indices) for r, indices in enumerate(layers)]
    busiest = max(ranks)
    rows += _busiest_rows(e, busiest)
    report.facts["memory_per_gpu_gib"] = round(busiest.total / GIB, 1)
    report.facts["memory_stage_totals_gib"] = [round(x.total / GIB, 1) for x in ranks]
    _against_hbm(report, rows, e, busiest)


def _parameter_rows(report, model: P.ModelCount, mix_source: str) -> list[tuple[str, str]]:
    """The parameter counts as facts and as the memory table's first rows; returns the table to extend."""
    report.facts.update(
        params_total=model.total,
        params_total_without_mtp=model.total_without_mtp,
        params_active=model.active,
        params_dense=model.dense,
        params_expert=model.expert,
    )
    rows: list[tuple[str, str]] = [
        (
            "parameters",
            f"{fmt_count(model.total)} total ({fmt_count(model.total_without_mtp)} without MTP), "
            f"{fmt_count(model.active)} active; {fmt_count(model.dense)} dense + {fmt_count(model.expert)} experts",
        ),
        ("layer mix", mix_source),
    ]
    report.tables["memory"] = rows
    return rows


def _estimate(
    cfg: dict, d: P.Dims, symbols: list[str], table: dict[str, P.LayerParams], model: P.ModelCount
) -> _Estimate | None:
    """The estimate's inputs; None without the world size, a valid mesh, seq_length or MBS."""
    m = mesh(cfg)
    seq = pos_int(get(cfg, SEQ))
    mbs = pos_int(get(cfg, MBS))
    if m is None or m.world is None or m.dp is None or m.edp is None or seq is None or mbs is None:
        return None
    microbatches = num_microbatches(cfg, m) or m.pp  # a batch error is reported elsewhere; assume a full pipeline
    prec = precision(cfg)
    fp4_weights = fp4_param_gather(cfg, prec)
    bf16_start, bf16_end = bf16_layer_counts(cfg, prec, len(symbols))
    distributed = not (
        flag(cfg, "ddp.use_distributed_optimizer") is False or flag(cfg, "optimizer.use_distributed_optimizer") is False
    )
    granularity, modules, method, group = _recompute(cfg)
    return _Estimate(
        cfg, d, symbols, table, model, m, microbatches, fp4_weights, bf16_start, bf16_end,
        grad_bytes=2 if flag(cfg, "ddp.grad_reduce_in_fp32") is False else 4,
        distributed=distributed,
        dense_shards=m.dp * m.cp if distributed else 1,
        expert_shards=m.edp if distributed else 1,
        granularity=granularity,
        modules=modules if granularity == "selective" else set(),
        method=method,
        group=group,
        sp=flag(cfg, "model.sequence_parallel") is True and m.tp > 1,
        tokens=mbs * seq / m.cp,
    )


def _rank(e: _Estimate, r: int, indices: list[int]) -> _Rank:
    """Bytes per GPU on pipeline rank r, which holds the layers `indices`."""
    m = e.m
    dense, expert, fp4_dense, fp4_expert = _rank_params(e, r, indices)
    dense_gpu, expert_gpu = dense / m.tp, expert / m.expert_mesh
    weights = 2 * (dense_gpu + expert_gpu) - (2 - FP4_WEIGHT_BYTES) * (fp4_dense / m.tp + fp4_expert / m.expert_mesh)
    grads = e.grad_bytes * (dense_gpu + expert_gpu)
    optimizer = 12 * (dense_gpu / e.dense_shards + expert_gpu / e.expert_shards)
    stored, transient = _microbatch_activations(e, indices, last=r == m.pp - 1)
    in_flight = _in_flight(m, r, e.microbatches)
    activations = stored * in_flight + transient
    total = weights + grads + optimizer + activations + OVERHEAD_BYTES
    return _Rank(total, r, len(indices), dense_gpu, expert_gpu, weights, grads, optimizer, activations, in_flight)


def _rank_params(e: _Estimate, r: int, indices: list[int]) -> tuple[int, int, int, int]:
    """Rank r's dense and expert parameters, then the dense linear and expert ones whose weights are NVFP4."""
    dense = expert = fp4_dense = fp4_expert = 0
    for i in indices:
        lp = e.table.get(e.symbols[i], P.ZERO)
        dense, expert = dense + lp.dense, expert + lp.expert
        if e.fp4_weights and e.bf16_start <= i < len(e.symbols) - e.bf16_end:
            fp4_dense, fp4_expert = fp4_dense + lp.linear, fp4_expert + lp.expert
    if r == 0:
        dense += e.model.embedding
    if r == e.m.pp - 1:
        dense += e.model.output + e.model.mtp.dense + e.d.h
        expert += e.model.mtp.expert
    return dense, expert, fp4_dense, fp4_expert


def _microbatch_activations(e: _Estimate, indices: list[int], last: bool) -> tuple[float, float]:
    """(bytes stored per microbatch in flight, bytes held once) of a rank's activations; the last adds MTP, logits."""
    layer_bytes = [e.per_token_bytes(e.symbols[i]) * e.tokens for i in indices]
    transient = 0.0
    if e.granularity == "full" and layer_bytes:
        stored, transient = _full_recompute(e, layer_bytes)
    else:
        stored = sum(layer_bytes)
    if last and e.model.mtp_depths:
        mtp_symbols = get(e.cfg, "model.mtp_hybrid_override_pattern")
        mtp_symbols = mtp_symbols if isinstance(mtp_symbols, str) and mtp_symbols else "*E"
        per_depth = sum(e.per_token_bytes(s) for s in mtp_symbols) + 2 * e.hidden_bytes
        stored += per_depth * e.tokens * e.model.mtp_depths
    if last:
        transient += (1 + e.model.mtp_depths) * e.tokens * (e.d.vocab / e.m.tp) * 4  # FP32 logits
    return stored, transient


def _full_recompute(e: _Estimate, layer_bytes: list[float]) -> tuple[float, float]:
    """(stored, transient) bytes under full recompute: the kept hidden states, and one group while it recomputes."""
    n, hidden = len(layer_bytes), e.hidden_bytes * e.tokens
    if e.method == "block":
        recomputed = min(n, e.group * (e.m.vpp or 1))
        kept = sum(layer_bytes) * (n - recomputed) / n  # average layer
        stored = hidden * recomputed + kept
    else:
        stored = hidden * math.ceil(n / e.group)
    return stored, max(layer_bytes) * min(e.group, n)


def _in_flight(m: Mesh, r: int, microbatches: int) -> float:
    """Microbatches whose activations pipeline rank r holds at once: 1F1B, or interleaved chunks under VPP."""
    if m.vpp:
        return min(2 * (m.pp - r - 1) + (m.vpp - 1) * m.pp + 1, microbatches * m.vpp) / m.vpp
    return min(m.pp - r, microbatches)


def _busiest_rows(e: _Estimate, b: _Rank) -> list[tuple[str, str]]:
    """The memory table's rows for the busiest GPU: where it sits, its parameters and each part of its memory."""
    m = e.m
    place = "first" if b.rank == 0 else "last" if b.rank == m.pp - 1 else "middle"
    extras = " + embedding" if b.rank == 0 else ""
    extras += " + output layer + MTP" if b.rank == m.pp - 1 else ""
    weight_note = "BF16 2 B/param"
    if e.fp4_weights:
        weight_note += f"; NVFP4 layers' linear weights {FP4_WEIGHT_BYTES:.3g} B/param (fp4_param_gather)"
    sharding = f"over DP·CP={e.dense_shards} dense, expert-DP={e.expert_shards} experts)"
    return [
        ("busiest GPU", f"pipeline rank {b.rank + 1} of {m.pp} ({place}: {b.layers} layers{extras})"),
        (
            "params on it",
            f"{fmt_count(b.dense + b.expert)} (dense {fmt_count(b.dense)} over TP={m.tp}, "
            f"experts {fmt_count(b.expert)} over EP·ETP={m.expert_mesh})",
        ),
        ("weights", f"{fmt_gib(b.weights)} ({weight_note})"),
        ("gradients", f"{fmt_gib(b.grads)} ({e.grad_bytes} B/param)"),
        ("optimizer state", f"{fmt_gib(b.optimizer)} (12 B/param " + (sharding if e.distributed else "unsharded)")),
        (
            "activations",
            f"{fmt_gib(b.activations)} (in flight: {b.in_flight:g} microbatch{'es' if b.in_flight != 1 else ''} of "
            f"{int(e.tokens):,} tokens per CP rank, "
            f"SP={'on' if e.sp else 'off'}, recompute={e.granularity or 'none'})",
        ),
        ("overhead", f"{fmt_gib(OVERHEAD_BYTES)} (CUDA context, NCCL/dispatcher buffers, fragmentation)"),
    ]


def _against_hbm(report, rows: list[tuple[str, str]], e: _Estimate, b: _Rank) -> None:
    """The total row against the GPU's HBM: an error above it, a warning above WARN_FRACTION of it."""
    gpu = gpu_type(e.cfg)
    if gpu is None:
        rows.append(("total", f"{fmt_gib(b.total)} per GPU (HBM unknown: cluster.gpu unset)"))
        return
    hbm = gpu.memory_gb * GIB
    share = b.total / hbm
    rows.append(("total", f"{fmt_gib(b.total)} per GPU of {gpu.memory_gb:g} GiB {gpu.name} HBM ({share:.0%})"))
    report.facts["memory_fraction"] = round(share, 3)
    breakdown = (
        f"weights {b.weights / GIB:.1f} + grads {b.grads / GIB:.1f} + optimizer {b.optimizer / GIB:.1f} + "
        f"activations {b.activations / GIB:.1f} + overhead {OVERHEAD_BYTES / GIB:.0f} GiB"
    )
    key, fix = _advice(e, b)
    if share > 1:
        report.error(
            key,
            f"estimated {b.total / GIB:.1f} GiB per GPU on pipeline rank {b.rank + 1} ({breakdown}) exceeds the "
            f"{gpu.memory_gb:g} GiB of {gpu.name}; {fix}",
            quoting=ESTIMATE_KEYS,
        )
    elif share > WARN_FRACTION:
        report.warn(
            key,
            f"estimated {b.total / GIB:.1f} GiB per GPU on pipeline rank {b.rank + 1} is {share:.0%} of the "
            f"{gpu.memory_gb:g} GiB of {gpu.name} ({breakdown}); little headroom for routing imbalance: {fix}",
            quoting=ESTIMATE_KEYS,
        )


def _advice(e: _Estimate, b: _Rank) -> tuple[str, str]:
    """The key to change and the fix, after what takes most of the busiest GPU's memory."""
    static_expert = b.expert * (2 + e.grad_bytes + 12 / e.expert_shards)
    static_dense = b.dense * (2 + e.grad_bytes + 12 / e.dense_shards)
    if b.activations > b.weights + b.grads + b.optimizer:
        return "model.recompute_granularity", "recompute more (model.recompute_granularity=full), more CP/TP or PP"
    if static_expert > static_dense:
        return EP, "raise EP (or PP) so fewer experts sit on each GPU, or add nodes for more expert-DP"
    return PP, "raise PP (or TP) so fewer layers sit on each GPU, or add nodes for more DP"
