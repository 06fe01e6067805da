"""What validation reports: errors block a submission, warnings and notes don't."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Level = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    level: Level
    key: str  # the config key (or file) the finding is about, e.g. "model.pipeline_model_parallel_size"
    message: str  # one line: what is wrong and the fix

    def line(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


@dataclass
class Report:
    """Findings plus derived facts the dry run prints (DP size, tokens per iteration, memory table...)."""

    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, object] = field(default_factory=dict)
    tables: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    blocks: dict[str, str] = field(default_factory=dict)  # title -> text shown as it is (a stage's own file)

    def error(self, key: str, message: str) -> None:
        self.findings.append(Finding("error", key, message))

    def warn(self, key: str, message: str) -> None:
        self.findings.append(Finding("warning", key, message))

    def note(self, key: str, message: str) -> None:
        self.findings.append(Finding("note", key, message))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]
