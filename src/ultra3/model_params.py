"""Parameter counts from the model dims, per layer type, and which layers each pipeline rank holds.

Formulas (Megatron-Core / Nemotron-H layers; no linear biases, squared-ReLU MLPs are not gated):

* Mamba-2 ``M``; d_inner = mamba_num_heads·mamba_head_dim, conv_dim = d_inner + 2·groups·state::

      norm h + in_proj h·(2·d_inner + 2·groups·state + heads) + conv1d conv_dim·(4 + 1)
      + A_log, D, dt_bias 3·heads + gated norm d_inner + out_proj d_inner·h

* Attention ``*`` (GQA): norm h + QKV h·(heads + 2·query_groups)·kv_channels + proj heads·kv_channels·h
* LatentMoE ``E``, latent size L (L = h and no latent projections when moe_latent_size is unset)::

      norm h + router experts·h + expert bias experts + down/up latent projections 2·h·L
      + routed experts experts·(fc1 L·F + fc2 F·L) + shared expert 2·h·S

* Dense MLP ``-``: norm h + 2·h·ffn_hidden_size.
* ``G`` (GDN) is counted like Mamba-2; ``D`` (DS-attention) and ``+`` (MLA) like attention (rough; Ultra has none).
* Embedding V·h and output layer V·h (untied unless model.share_embeddings_and_output_weights), final norm h.
* MTP block: eh_proj 2h·h + enorm, hnorm, final norm 3h + the layers of model.mtp_hybrid_override_pattern
  ("*E" for Ultra: one attention + one LatentMoE layer). With model.mtp_use_repeated_layer (default true) the one
  block is shared by all mtp_num_layers depths and counted once.

"Active" parameters are the ones a token's forward pass multiplies by: every non-routed weight plus top-k/experts
of the routed experts; the input embedding (a row lookup) and the MTP block are left out.

Calibration: the Ultra dims with 48 Mamba-2, 48 LatentMoE and 12 attention layers give 560,524,603,904 parameters,
exactly the HF card's count; 549.3B of them outside the MTP block (the tech report's "550B") and 55.0B active
("A55B"). When model.hybrid_layer_pattern is unset (full Ultra: the pattern comes from the HF config at run time),
that 4:4:1 Mamba-2 : LatentMoE : attention mix is assumed and interleaved evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

from ultra3.dotted import get

from .model_math import PIPE, is_int, main_pattern, pattern, pos_int

# Ultra's layer mix (see the module docstring): 48 Mamba-2, 48 LatentMoE, 12 attention of 108.
ULTRA_MIX = (("M", 4), ("E", 4), ("*", 1))
MAMBA_CONV_KERNEL = 4


@dataclass(frozen=True)
class LayerParams:
    dense: int  # non-expert parameters (sharded by TP)
    expert: int  # routed-expert parameters (sharded by EP·ETP)
    active: int  # parameters a token uses
    linear: int  # non-expert linear weights (the ones NVFP4 primary weights would store in FP4)

    def __add__(self, other: LayerParams) -> LayerParams:
        return LayerParams(
            self.dense + other.dense,
            self.expert + other.expert,
            self.active + other.active,
            self.linear + other.linear,
        )

    def scale(self, k: int) -> LayerParams:
        return LayerParams(self.dense * k, self.expert * k, self.active * k, self.linear * k)

    @property
    def total(self) -> int:
        return self.dense + self.expert


ZERO = LayerParams(0, 0, 0, 0)


@dataclass(frozen=True)
class Dims:
    h: int
    vocab: int
    heads: int | None
    groups: int | None
    kv: int | None
    ffn: int
    m_heads: int
    m_head_dim: int
    m_state: int
    m_groups: int
    experts: int | None
    topk: int
    moe_ffn: int
    shared: int
    latent: int | None


def dims(cfg: dict) -> tuple[Dims | None, str]:
    """The model dims with Megatron defaults filled in, or (None, why) when a required one is missing."""
    h = pos_int(get(cfg, "model.hidden_size"))
    vocab = pos_int(get(cfg, "model.vocab_size"))
    if h is None or vocab is None:
        missing = "model.hidden_size" if h is None else "model.vocab_size"
        return None, f"{missing} is unset"
    heads = pos_int(get(cfg, "model.num_attention_heads"))
    groups = pos_int(get(cfg, "model.num_query_groups")) or heads
    kv = pos_int(get(cfg, "model.kv_channels")) or (h // heads if heads else None)
    ffn = pos_int(get(cfg, "model.ffn_hidden_size")) or 4 * h
    m_head_dim = pos_int(get(cfg, "model.mamba_head_dim")) or 64
    m_heads = pos_int(get(cfg, "model.mamba_num_heads")) or max(1, 2 * h // m_head_dim)  # MCore: expand 2
    experts = pos_int(get(cfg, "model.num_moe_experts"))
    return (
        Dims(
            h=h,
            vocab=vocab,
            heads=heads,
            groups=groups,
            kv=kv,
            ffn=ffn,
            m_heads=m_heads,
            m_head_dim=m_head_dim,
            m_state=pos_int(get(cfg, "model.mamba_state_dim")) or 128,
            m_groups=pos_int(get(cfg, "model.mamba_num_groups")) or 8,
            experts=experts,
            topk=min(pos_int(get(cfg, "model.moe_router_topk")) or 2, experts or 1),
            moe_ffn=pos_int(get(cfg, "model.moe_ffn_hidden_size")) or ffn,
            shared=pos_int(get(cfg, "model.moe_shared_expert_intermediate_size")) or 0,
            latent=pos_int(get(cfg, "model.moe_latent_size")),
        ),
        "",
    )


def mamba(d: Dims) -> LayerParams:
    d_inner = d.m_heads * d.m_head_dim
    bc = 2 * d.m_groups * d.m_state
    in_proj = d.h * (2 * d_inner + bc + d.m_heads)
    out_proj = d_inner * d.h
    other = d.h + (d_inner + bc) * (MAMBA_CONV_KERNEL + 1) + 3 * d.m_heads + d_inner
    total = in_proj + out_proj + other
    return LayerParams(total, 0, total, in_proj + out_proj)


def attention(d: Dims) -> LayerParams:
    if not (d.heads and d.groups and d.kv):
        return ZERO
    qkv = d.h * (d.heads + 2 * d.groups) * d.kv
    proj = d.heads * d.kv * d.h
    total = d.h + qkv + proj
    return LayerParams(total, 0, total, qkv + proj)


def mlp(d: Dims) -> LayerParams:
    linear = 2 * d.h * d.ffn
    return LayerParams(d.h + linear, 0, d.h + linear, linear)


def moe(d: Dims) -> LayerParams:
    if not d.experts:
        return mlp(d)
    width = d.latent or d.h
    latent_proj = 2 * d.h * d.latent if d.latent else 0
    shared = 2 * d.h * d.shared
    router = d.experts * d.h + d.experts  # weight + expert bias
    per_expert = 2 * width * d.moe_ffn
    dense = d.h + router + latent_proj + shared
    return LayerParams(dense, d.experts * per_expert, dense + d.topk * per_expert, latent_proj + shared)


def per_symbol(d: Dims) -> dict[str, LayerParams]:
    m, a = mamba(d), attention(d)
    return {"M": m, "G": m, "*": a, "D": a, "+": a, "E": moe(d), "-": mlp(d)}


def mtp_block(cfg: dict, d: Dims, table: dict[str, LayerParams]) -> tuple[LayerParams, int]:
    """(parameters of the MTP weights, how many depths apply them); ZERO when MTP is off."""
    depths = get(cfg, "model.mtp_num_layers")
    if not is_int(depths) or depths <= 0:
        return ZERO, 0
    mtp_pattern = get(cfg, "model.mtp_hybrid_override_pattern")
    if not isinstance(mtp_pattern, str) or not mtp_pattern:
        mtp_pattern = "*E"
    block = LayerParams(2 * d.h * d.h + 3 * d.h, 0, 2 * d.h * d.h + 3 * d.h, 2 * d.h * d.h)
    for symbol in mtp_pattern:
        block = block + table.get(symbol, ZERO)
    repeated = get(cfg, "model.mtp_use_repeated_layer")
    copies = depths if repeated is False else 1
    return block.scale(copies), depths


def layer_types(cfg: dict, num_layers: int) -> tuple[list[str], str]:
    """Layer symbols by index, and where they come from (the pattern, or the assumed Ultra mix)."""
    found = pattern(cfg)
    if found:
        symbols = [c for c in main_pattern(found[1]) if c != PIPE]
        if symbols:
            return symbols, f"layer mix from {found[0]}"
    # Spread the 4:4:1 mix evenly: at each index take the type that is furthest behind its share.
    weights = sum(w for _, w in ULTRA_MIX)
    counts = {s: 0 for s, _ in ULTRA_MIX}
    symbols = []
    for i in range(num_layers):
        symbol = max(ULTRA_MIX, key=lambda sw: (i + 1) * sw[1] / weights - counts[sw[0]])[0]
        counts[symbol] += 1
        symbols.append(symbol)
    mix = " + ".join(f"{counts[s]} {name}" for s, name in (("M", "Mamba-2"), ("E", "LatentMoE"), ("*", "attention")))
    return symbols, f"assumed Ultra layer mix ({mix}; model.hybrid_layer_pattern unset)"


def rank_layers(cfg: dict, num_layers: int, pp: int, vpp: int | None) -> list[list[int]]:
    """Layer indices each pipeline rank holds.

    A pattern with '|' splits there (PP·VPP segments); otherwise layers split evenly into PP·VPP chunks, the
    first chunks taking one more layer when it does not divide. Virtual chunk c runs on rank c % PP.
    """
    chunks = pp * (vpp or 1)
    found = pattern(cfg)
    sizes: list[int] | None = None
    if found and PIPE in main_pattern(found[1]):
        segments = main_pattern(found[1]).split(PIPE)
        if len(segments) == chunks:
            sizes = [len(s) for s in segments]
    if sizes is None:
        base, extra = divmod(num_layers, chunks)
        sizes = [base + (1 if c < extra else 0) for c in range(chunks)]
    ranks: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for c, size in enumerate(sizes):
        ranks[c % pp].extend(range(start, min(start + size, num_layers)))
        start += size
    return ranks


@dataclass(frozen=True)
class ModelCount:
    layers: LayerParams  # main decoder stack
    embedding: int
    output: int
    mtp: LayerParams
    mtp_depths: int

    @property
    def total(self) -> int:
        return self.layers.total + self.embedding + self.output + self.mtp.total

    @property
    def total_without_mtp(self) -> int:
        return self.total - self.mtp.total

    @property
    def active(self) -> int:
        return self.layers.active + self.output  # input embedding and MTP excluded

    @property
    def dense(self) -> int:
        return self.layers.dense + self.embedding + self.output + self.mtp.dense

    @property
    def expert(self) -> int:
        return self.layers.expert + self.mtp.expert


def count(cfg: dict, d: Dims, symbols: list[str]) -> ModelCount:
    table = per_symbol(d)
    layers = ZERO
    for s in symbols:
        layers = layers + table.get(s, ZERO)
    final_norm = d.h
    mtp, depths = mtp_block(cfg, d, table)
    tied = get(cfg, "model.share_embeddings_and_output_weights") is True
    return ModelCount(
        layers=layers + LayerParams(final_norm, 0, final_norm, 0),
        embedding=d.vocab * d.h,
        output=0 if tied else d.vocab * d.h,
        mtp=mtp,
        mtp_depths=depths,
    )
