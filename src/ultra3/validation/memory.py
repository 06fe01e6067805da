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

from . import params as P
from ._common import (
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
    bf16_layer_counts,
    flag,
    fmt_count,
    fmt_gib,
    fp4_param_gather,
    get,
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


def check(cfg: dict, report) -> None:
    num_layers = pos_int(get(cfg, "model.num_layers"))
    d, why = P.dims(cfg)
    if d is None or num_layers is None or num_layers > MAX_LAYERS:
        reason = why or ("model.num_layers is unset" if num_layers is None else f"more than {MAX_LAYERS} layers")
        report.note("model", f"memory estimate skipped: {reason}")
        return
    symbols, mix_source = P.layer_types(cfg, num_layers)
    table_per_symbol = P.per_symbol(d)
    model = P.count(cfg, d, symbols)
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

    m = mesh(cfg)
    seq = pos_int(get(cfg, SEQ))
    mbs = pos_int(get(cfg, MBS))
    if m is None or m.world is None or m.dp is None or m.edp is None or seq is None or mbs is None:
        rows.append(("per-GPU estimate", "skipped: needs the world size, a valid mesh, seq_length and MBS"))
        return
    nmb = num_microbatches(cfg, m) or m.pp  # a batch error is reported elsewhere; assume a full pipeline

    prec = precision(cfg)
    fp4_weights = fp4_param_gather(cfg, prec)
    bf16_start, bf16_end = bf16_layer_counts(cfg, prec, len(symbols))
    grad_bytes = 2 if flag(cfg, "ddp.grad_reduce_in_fp32") is False else 4
    distributed = not (
        flag(cfg, "ddp.use_distributed_optimizer") is False or flag(cfg, "optimizer.use_distributed_optimizer") is False
    )
    dense_shards = m.dp * m.cp if distributed else 1
    expert_shards = m.edp if distributed else 1
    granularity, modules, method, group = _recompute(cfg)
    sp = flag(cfg, "model.sequence_parallel") is True and m.tp > 1
    tokens = mbs * seq / m.cp

    def per_token_bytes(symbol: str) -> float:
        outside, inside = _layer_activation(symbol, d, cfg, modules if granularity == "selective" else set())
        return 2 * (outside / (m.tp if sp else 1) + inside / m.tp)

    hidden_bytes = 2 * d.h / (m.tp if sp else 1)  # one stored hidden state per token
    ranks = P.rank_layers(cfg, len(symbols), m.pp, m.vpp)
    chunks = m.vpp or 1
    results = []
    for r, indices in enumerate(ranks):
        first, last = r == 0, r == m.pp - 1
        dense = expert = fp4_dense = fp4_expert = 0
        for i in indices:
            lp = table_per_symbol.get(symbols[i], P.ZERO)
            dense, expert = dense + lp.dense, expert + lp.expert
            if fp4_weights and bf16_start <= i < len(symbols) - bf16_end:
                fp4_dense, fp4_expert = fp4_dense + lp.linear, fp4_expert + lp.expert
        if first:
            dense += model.embedding
        if last:
            dense += model.output + model.mtp.dense + d.h
            expert += model.mtp.expert
        dense_gpu, expert_gpu = dense / m.tp, expert / m.expert_mesh
        weights = 2 * (dense_gpu + expert_gpu) - (2 - FP4_WEIGHT_BYTES) * (
            fp4_dense / m.tp + fp4_expert / m.expert_mesh
        )
        grads = grad_bytes * (dense_gpu + expert_gpu)
        optimizer = 12 * (dense_gpu / dense_shards + expert_gpu / expert_shards)

        # activations of one microbatch on this rank
        layer_bytes = [per_token_bytes(symbols[i]) * tokens for i in indices]
        transient = 0.0
        if granularity == "full" and layer_bytes:
            if method == "block":
                recomputed = min(len(indices), group * chunks)
                kept = sum(layer_bytes) * (len(indices) - recomputed) / len(indices)  # average layer
                stored = hidden_bytes * tokens * recomputed + kept
            else:
                stored = hidden_bytes * tokens * math.ceil(len(indices) / group)
            transient = max(layer_bytes) * min(group, len(indices))
        else:
            stored = sum(layer_bytes)
        if last and model.mtp_depths:
            mtp_symbols = get(cfg, "model.mtp_hybrid_override_pattern")
            mtp_symbols = mtp_symbols if isinstance(mtp_symbols, str) and mtp_symbols else "*E"
            per_depth = sum(per_token_bytes(s) for s in mtp_symbols) + 2 * hidden_bytes
            stored += per_depth * tokens * model.mtp_depths
        if last:
            transient += (1 + model.mtp_depths) * (mbs * seq / m.cp) * (d.vocab / m.tp) * 4
        if m.vpp:
            in_flight = min(2 * (m.pp - r - 1) + (m.vpp - 1) * m.pp + 1, nmb * m.vpp) / m.vpp
        else:
            in_flight = min(m.pp - r, nmb)
        activations = stored * in_flight + transient
        total = weights + grads + optimizer + activations + OVERHEAD_BYTES
        results.append(
            (total, r, len(indices), dense_gpu, expert_gpu, weights, grads, optimizer, activations, in_flight)
        )

    total, r, n_layers, dense_gpu, expert_gpu, weights, grads, optimizer, activations, in_flight = max(results)
    place = "first" if r == 0 else "last" if r == m.pp - 1 else "middle"
    extras = " + embedding" if r == 0 else ""
    extras += " + output layer + MTP" if r == m.pp - 1 else ""
    weight_note = "BF16 2 B/param"
    if fp4_weights:
        weight_note += f"; NVFP4 layers' linear weights {FP4_WEIGHT_BYTES:.3g} B/param (fp4_param_gather)"
    rows += [
        ("busiest GPU", f"pipeline rank {r + 1} of {m.pp} ({place}: {n_layers} layers{extras})"),
        (
            "params on it",
            f"{fmt_count(dense_gpu + expert_gpu)} (dense {fmt_count(dense_gpu)} over TP={m.tp}, "
            f"experts {fmt_count(expert_gpu)} over EP·ETP={m.expert_mesh})",
        ),
        ("weights", f"{fmt_gib(weights)} ({weight_note})"),
        ("gradients", f"{fmt_gib(grads)} ({grad_bytes} B/param)"),
        (
            "optimizer state",
            f"{fmt_gib(optimizer)} (12 B/param "
            + (f"over DP·CP={dense_shards} dense, expert-DP={expert_shards} experts)" if distributed else "unsharded)"),
        ),
        (
            "activations",
            f"{fmt_gib(activations)} (in flight: {in_flight:g} microbatch{'es' if in_flight != 1 else ''} of "
            f"{int(tokens):,} tokens per CP rank, "
            f"SP={'on' if sp else 'off'}, recompute={granularity or 'none'})",
        ),
        ("overhead", f"{fmt_gib(OVERHEAD_BYTES)} (CUDA context, NCCL/dispatcher buffers, fragmentation)"),
    ]
    report.facts["memory_per_gpu_gib"] = round(total / GIB, 1)
    report.facts["memory_stage_totals_gib"] = [round(x[0] / GIB, 1) for x in sorted(results, key=lambda x: x[1])]

    gpu = gpu_type(cfg)
    if gpu is None:
        rows.append(("total", f"{fmt_gib(total)} per GPU (HBM unknown: cluster.gpu unset)"))
        return
    hbm = gpu.memory_gb * GIB
    share = total / hbm
    rows.append(("total", f"{fmt_gib(total)} per GPU of {gpu.memory_gb:g} GiB {gpu.name} HBM ({share:.0%})"))
    report.facts["memory_fraction"] = round(share, 3)
    breakdown = (
        f"weights {weights / GIB:.1f} + grads {grads / GIB:.1f} + optimizer {optimizer / GIB:.1f} + "
        f"activations {activations / GIB:.1f} + overhead {OVERHEAD_BYTES / GIB:.0f} GiB"
    )
    static_expert = expert_gpu * (2 + grad_bytes + 12 / expert_shards)
    static_dense = dense_gpu * (2 + grad_bytes + 12 / dense_shards)
    if activations > weights + grads + optimizer:
        key, fix = "model.recompute_granularity", "recompute more (model.recompute_granularity=full), more CP/TP or PP"
    elif static_expert > static_dense:
        key, fix = EP, "raise EP (or PP) so fewer experts sit on each GPU, or add nodes for more expert-DP"
    else:
        key, fix = PP, "raise PP (or TP) so fewer layers sit on each GPU, or add nodes for more DP"
    if share > 1:
        report.error(
            key,
            f"estimated {total / GIB:.1f} GiB per GPU on pipeline rank {r + 1} ({breakdown}) exceeds the "
            f"{gpu.memory_gb:g} GiB of {gpu.name}; {fix}",
            quoting=ESTIMATE_KEYS,
        )
    elif share > WARN_FRACTION:
        report.warn(
            key,
            f"estimated {total / GIB:.1f} GiB per GPU on pipeline rank {r + 1} is {share:.0%} of the "
            f"{gpu.memory_gb:g} GiB of {gpu.name} ({breakdown}); little headroom for routing imbalance: {fix}",
            quoting=ESTIMATE_KEYS,
        )
