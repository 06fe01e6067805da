"""A profile as a job carries it: the type the compiler, the job and the executors pass around, below all
of them; ultra3.profiles reads env.toml into it and checks its `run.*` keys against its executor."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .findings import Finding


@dataclass
class Profile:
    name: str
    executor: str
    values: dict[str, Any]  # run.* keys, without `executor` and `extends`
    file: Path
    artifacts_root: str | None = None  # [artifacts] manifest.root of its env.toml
    stage_values: dict[str, Any] = field(default_factory=dict)  # stage keys it sets (RL's sandbox, [wandb]), dotted
    notes: list[Finding] = field(default_factory=list)  # NVIDIA's CLI keys read under our names, warnings
    errors: list[Finding] = field(default_factory=list)  # its bad keys (left out of values), reported with the
    # stage config's errors in one round

    @property
    def source(self) -> str:
        return f"profile '{self.name}' ({self.file.name})"

