"""The stages, one module a family: what `ultra3 <stage>` runs. The CLI, pipes and artifact hints read them
from here; a new stage is its module's entry in STAGES, a config dir and a runtime module."""

from __future__ import annotations

from ..stage import Stage
from . import container, convert, data_prep, eval, quantize, rl, training

STAGES: tuple[Stage, ...] = (
    training.PRETRAIN, training.SFT, data_prep.PRETRAIN, data_prep.SFT, data_prep.RL, quantize.QUANTIZE,
    rl.RLVR, rl.TEACHER, rl.MOPD, container.BUILD, convert.HF_TO_MEGATRON, convert.MEGATRON_TO_HF,
    eval.EVAL,
)


def producers(kind: str) -> list[Stage]:
    """The stages whose outputs include `kind`."""
    return [s for s in STAGES if any(o.kind == kind for o in s.outputs)]


def find_stage(name: str) -> Stage | None:
    """A stage by its name (`data prep sft`) or its slug's tail (`data-prep-sft`)."""
    return next((s for s in STAGES if name in (s.name, "-".join(s.words), s.slug)), None)
