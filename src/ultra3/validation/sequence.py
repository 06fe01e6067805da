"""Sequence length vs context and sequence parallelism, and packed-SFT data.

* the sequence must split into 2·CP chunks when CP>1 (load-balanced causal CP), and each CP rank's share over TP
  when sequence parallelism is on: seq_length % lcm(2·CP if CP>1, CP·TP if SP and TP>1) == 0
  (the same multiple MB's packed-sequence docs give for pad_seq_to_mult)
* sequence_parallel with TP=1 does nothing (warning); EP>1 and TP>1 without it is a Megatron-Core error
* packed SFT (dataset.pack_size set): MBS 1, pack_size == seq_length, pack_size a multiple of that lcm
"""

from __future__ import annotations

from ultra3.contract import pad_seq_to_mult
from ultra3.dotted import get

from ..model_math import CP, EP, MBS, SEQ, SP, TP, flag, mesh, pos_int

PACK = "dataset.pack_size"
PAD_KEYS = (TP, CP, SP)  # what pad_seq_to_mult derives from


def check(cfg: dict, report) -> None:
    raw = get(cfg, SEQ)
    seq = pos_int(raw)
    if raw is not None and seq is None:
        report.error(SEQ, f"{SEQ}={raw!r} is not a positive integer")
    data_seq = get(cfg, "dataset.seq_length")
    if seq is not None and data_seq is not None and data_seq != seq:
        report.error("dataset.seq_length", f"dataset.seq_length={data_seq} differs from {SEQ}={seq}; make them equal",
                     quoting=(SEQ,))

    m = mesh(cfg)
    if m is None:
        return
    sp = flag(cfg, SP) is True
    if sp and m.tp == 1:
        report.warn(SP, "sequence_parallel=true has no effect with TP=1; set it false (or raise TP)", quoting=(TP,))
    if not sp and m.tp > 1 and m.ep > 1:
        report.error(
            SP,
            f"EP={m.ep} with TP={m.tp} needs sequence parallelism (Megatron-Core refuses otherwise); "
            "set model.sequence_parallel=true",
            quoting=(EP, TP),
        )

    multiple = pad_seq_to_mult(m.tp, m.cp, sp)
    report.facts["pad_seq_to_mult"] = multiple
    why = " and ".join(
        part
        for part in (
            f"2·CP = {2 * m.cp} for CP={m.cp}" if m.cp > 1 else "",
            f"CP·TP = {m.cp * m.tp} for sequence parallelism over TP={m.tp}" if sp and m.tp > 1 else "",
        )
        if part
    )
    if seq is not None and seq % multiple:
        report.error(
            SEQ,
            f"seq_length {seq:,} is not a multiple of {multiple} ({why}); use {_round_up(seq, multiple):,} "
            f"or {max(multiple, seq - seq % multiple):,}",
            quoting=PAD_KEYS,
        )

    pack_raw = get(cfg, PACK)
    if pack_raw is None:
        return
    pack = pos_int(pack_raw)
    if pack is None:
        report.error(PACK, f"{PACK}={pack_raw!r} is not a positive integer")
        return
    mbs = get(cfg, MBS)
    if mbs is not None and mbs != 1:
        report.error(MBS, f"packed sequences need micro_batch_size 1 (got {mbs}); set {MBS}=1 and raise GBS instead",
                     quoting=(PACK,))
    if seq is not None and pack != seq:
        report.error(
            PACK,
            f"pack_size {pack:,} differs from {SEQ}={seq:,}; pack to the model's sequence length "
            f"(set dataset.pack_size={seq:,} and re-run data prep) or change seq_length",
            quoting=(SEQ,),
        )
    if pack % multiple and pack != seq:  # when equal, the seq_length error above already says it
        report.error(
            PACK,
            f"pack_size {pack:,} is not a multiple of pad_seq_to_mult={multiple} ({why}); "
            f"use {_round_up(pack, multiple):,}",
            quoting=PAD_KEYS,
        )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
