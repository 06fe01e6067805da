"""Validation rules run over a resolved training config before every submission (and by --dry-run).

One module per concern, each with ``check(cfg, report)``; they read the config with missing/None-tolerant helpers,
collect every finding (none stops at the first) and add derived facts and printable tables to the report:

* values       sizes and counts that must be positive, a known mixed-precision preset
* cluster      nodes, GPUs per node, GPU type: ONE warning per unknown, the other checks skip quietly
* parallelism  world vs TP·PP·CP and the expert mesh, layers/experts/heads per rank, hybrid layer pattern
* sequence     seq_length vs CP and SP, packed-SFT pack size
* batch        GBS vs MBS·DP, microbatches and the pipeline bubble
* precision    NVFP4/MXFP8 vs the GPU, NVFP4 pitfalls, FP32 gradient reduction with MTP, the BF16 layer set
* topology     TP inside a node, the expert group inside the NVLink domain (HybridEP)
* schedule     token budget, warmup/decay in iterations and tokens, LR schedule sanity
* phases       a pretraining run's phase-2 switch inside the run, per-phase tokens and LR; a mixed-in blend's share
* blend_size   each pretraining blend's recorded train tokens against the tokens it feeds, its valid/test splits
* memory       parameter counts and a per-GPU memory estimate against the GPU's HBM
* long_run     on Slurm: run.grace_s against the time limit and the stop time, a checkpoint dir, checkpoints kept
* fault_tolerance  ft_launcher and the FT package, in-process restart, async save, the straggler detectors

Then our model keys are checked against a local HF config.json when `recipe.hf_model` names one.

Stdlib only; I/O only for files the config names (and a blend's summary beside it): the whole validation runs in a
few milliseconds.
"""

from __future__ import annotations

from ultra3.findings import Report
from ultra3.training_inputs import check_hf_config

from . import (batch, blend_size, cluster, fault_tolerance, long_run, memory, parallelism, phases, precision, schedule,
               sequence, topology, values)

RULES = (values, cluster, parallelism, sequence, batch, precision, topology, schedule, phases, blend_size, memory,
         long_run, fault_tolerance)

__all__ = ["RULES", "validate_training"]


def validate_training(cfg: dict, report: Report) -> None:
    """Run every rule module over the merged, resolved config; findings, facts and tables go into `report`."""
    if not isinstance(cfg, dict):
        report.error("config", f"the training config is a {type(cfg).__name__}, not a mapping")
        return
    for rules in RULES:
        try:
            rules.check(cfg, report)
        except Exception as exc:  # a rule that crashes checked nothing: nothing is submitted unchecked
            name = rules.__name__.rsplit(".", 1)[-1]
            report.error(
                f"validation.{name}",
                f"internal error in the {name} rules ({type(exc).__name__}: {exc}); nothing was submitted; please "
                "report this with the command line",
            )
    check_hf_config(cfg, report)
