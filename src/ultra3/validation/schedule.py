"""Token budget and learning-rate schedule, in iterations and tokens.

tokens/iteration = seq_length·GBS; total = tokens/iteration·train_iters. Warmup runs for lr_warmup_iters, the decay
ends at lr_decay_iters (train_iters when unset); WSD holds the peak LR until lr_decay_iters − lr_wsd_decay_iters and
anneals over the last lr_wsd_decay_iters. Megatron's OptimizerParamScheduler asserts warmup < decay, min_lr ≤ lr,
min_lr ≥ 0 and, for WSD, a set lr_wsd_decay_iters; these rules catch them (and the ones that only waste a run) first.
"""

from __future__ import annotations

from ultra3.dotted import get

from ..model_math import GBS, SEQ, fmt_count, is_int, number, pos_int

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
WARMUP = "scheduler.lr_warmup_iters"
DECAY = "scheduler.lr_decay_iters"
WSD = "scheduler.lr_wsd_decay_iters"
ITERS = "train.train_iters"
SAMPLES = "train.train_samples"
FRACTION = "scheduler.lr_warmup_fraction"
STYLE = "scheduler.lr_decay_style"


def check(cfg: dict, report) -> None:
    learning_rates(report, "optimizer", get(cfg, "optimizer.lr"), get(cfg, "optimizer.min_lr"))
    seq, gbs = pos_int(get(cfg, SEQ)), pos_int(get(cfg, GBS))
    raw_iters = get(cfg, ITERS)
    iters = pos_int(raw_iters)
    if raw_iters is not None and iters is None:
        report.error(ITERS, f"{ITERS}={raw_iters!r} is not a positive integer")
    samples = pos_int(get(cfg, SAMPLES))
    iters_keys: tuple[str, ...] = (ITERS,)  # what each count derives from, for the findings' quoting
    if iters is None and samples is not None and gbs is not None:
        iters, iters_keys = samples // gbs, (SAMPLES, GBS)

    style = get(cfg, STYLE)
    if style is not None and style not in DECAY_STYLES:
        report.error(STYLE, f"unknown lr_decay_style {style!r}; use one of {', '.join(DECAY_STYLES)}")
    wsd_style = get(cfg, "scheduler.lr_wsd_decay_style")
    if style == "WSD" and wsd_style is not None and wsd_style not in WSD_DECAY_STYLES:
        report.error(
            "scheduler.lr_wsd_decay_style",
            f"unknown lr_wsd_decay_style {wsd_style!r}; use one of {', '.join(WSD_DECAY_STYLES)}",
        )

    warmup = _iters(cfg, WARMUP, report)
    fraction = number(get(cfg, FRACTION))
    decay = _iters(cfg, DECAY, report)
    decay_keys = (DECAY,) if decay else iters_keys
    decay = decay or iters
    warmup_keys: tuple[str, ...] = (WARMUP,)
    if warmup is None:
        warmup = int(fraction * decay) if fraction is not None and decay else 0
        warmup_keys = (FRACTION, *decay_keys) if fraction is not None and decay else ()
    wsd = _iters(cfg, WSD, report) if style == "WSD" else None

    if iters is not None and warmup >= iters:
        report.error(
            WARMUP,
            f"warmup {warmup:,} iterations ≥ train_iters {iters:,}: the run never reaches the peak LR; "
            f"use a warmup well below {iters:,} (e.g. 1% = {max(1, iters // 100):,})",
            quoting=(*warmup_keys, *iters_keys),
        )
    elif decay is not None and warmup >= decay:
        report.error(
            WARMUP,
            f"warmup {warmup:,} iterations ≥ lr_decay_iters {decay:,} (Megatron asserts warmup < decay); "
            f"lower the warmup or raise {DECAY}",
            quoting=(*warmup_keys, *decay_keys),
        )
    if iters is not None and decay is not None and decay > iters:
        what = "the WSD anneal is cut short" if style == "WSD" else "the LR never reaches min_lr"
        report.warn(
            DECAY,
            f"lr_decay_iters {decay:,} > train_iters {iters:,}: training stops {decay - iters:,} iterations "
            f"before the schedule ends and {what}; set {DECAY}={iters:,}",
            quoting=(*iters_keys, STYLE),
        )
    if style == "WSD":
        if wsd is None:
            report.error(
                WSD,
                f"lr_decay_style=WSD needs {WSD} (the anneal length); set it (e.g. 25% of {decay or '?'})",
                quoting=(STYLE, *(decay_keys if decay else ())),
            )
        elif decay is not None and wsd > decay:
            report.error(
                WSD,
                f"WSD anneal {wsd:,} iterations > lr_decay_iters {decay:,}; use lr_wsd_decay_iters ≤ {decay:,}",
                quoting=decay_keys,
            )
        elif decay is not None and warmup + wsd > decay:
            report.warn(
                WSD,
                f"warmup {warmup:,} + WSD anneal {wsd:,} > lr_decay_iters {decay:,}: the anneal starts before the "
                f"warmup ends; shorten one of them",
                quoting=(*warmup_keys, *decay_keys),
            )

    if seq is None or gbs is None or iters is None:
        return
    _table(cfg, report, seq, gbs, iters, warmup, decay, wsd, style)


def _iters(cfg: dict, key: str, report) -> int | None:
    value = get(cfg, key)
    if value is None:
        return None
    if not is_int(value) or value < 0:
        report.error(key, f"{key}={value!r} is not a non-negative integer")
        return None
    return value


def learning_rates(report, optimizer: str, lr: object, min_lr: object) -> None:
    """Megatron's optimizer (`optimizer`: its table, training's or RL's under nemo_rl) takes 0 ≤ min_lr ≤ lr, lr > 0."""
    lr, min_lr = number(lr), number(min_lr)
    if lr is not None and lr <= 0:
        report.error(f"{optimizer}.lr", f"lr={lr:g} must be positive")
    if min_lr is not None and min_lr < 0:
        report.error(f"{optimizer}.min_lr", f"min_lr={min_lr:g} must be ≥ 0")
    elif lr is not None and min_lr is not None and 0 < lr < min_lr:  # an lr <= 0 is refused above
        report.error(
            f"{optimizer}.min_lr",
            f"min_lr={min_lr:g} > lr={lr:g}; the LR would rise while decaying: set min_lr ≤ lr",
            quoting=(f"{optimizer}.lr",),
        )


def _table(cfg, report, seq, gbs, iters, warmup, decay, wsd, style) -> None:
    per_iter = seq * gbs
    total = per_iter * iters
    decay = min(decay or iters, iters)

    def tokens(n: int) -> str:
        return f"{n:,} iterations, {fmt_count(n * per_iter)} tokens"

    rows = [
        ("tokens per iteration", f"{per_iter:,} ({seq:,} seq_length x {gbs:,} global batch)"),
        ("train iterations", f"{iters:,}"),
        ("total tokens", f"{fmt_count(total)} ({total:,})"),
        ("warmup", tokens(warmup)),
    ]
    facts = {
        "tokens_per_iteration": per_iter,
        "total_tokens": total,
        "train_iters": iters,
        "warmup_iterations": warmup,
        "warmup_tokens": warmup * per_iter,
    }
    if style == "WSD" and wsd is not None:
        anneal_start = max(warmup, decay - wsd)
        rows.append(("stable (peak LR)", f"{tokens(anneal_start - warmup)} (iterations {warmup:,}-{anneal_start:,})"))
        rows.append(
            (
                f"WSD anneal ({get(cfg, 'scheduler.lr_wsd_decay_style') or 'default'})",
                f"{tokens(decay - anneal_start)} (iterations {anneal_start:,}-{decay:,})",
            )
        )
        facts.update(decay_iterations=decay - anneal_start, decay_tokens=(decay - anneal_start) * per_iter)
    elif style != "constant":
        rows.append((f"decay ({style or 'default'})", f"{tokens(decay - warmup)} (iterations {warmup:,}-{decay:,})"))
        facts.update(decay_iterations=decay - warmup, decay_tokens=(decay - warmup) * per_iter)
    if decay < iters and style != "constant":
        rows.append(("after decay", f"{tokens(iters - decay)} at min_lr"))
    lr, min_lr = number(get(cfg, "optimizer.lr")), number(get(cfg, "optimizer.min_lr"))
    if lr is not None:
        rows.append(("learning rate", f"{lr:g} peak" + (f" -> {min_lr:g} min" if min_lr is not None else "")))
    report.tables["schedule"] = rows
    report.facts.update(facts)
