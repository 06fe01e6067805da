"""What validation reports: errors block a submission, warnings and notes don't."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from .dotted import get

Level = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    level: Level
    key: str  # the config key (or file) the finding is about, e.g. "model.pipeline_model_parallel_size"
    message: str  # one line: what is wrong and the fix

    def line(self) -> str:
        """One line, whatever the values it quotes hold (a newline is shown escaped)."""
        return f"{self.level}: {self.key}: {self.message}".replace("\r", "\\r").replace("\n", "\\n")


@dataclass
class Report:
    """Findings plus derived facts the dry run prints (DP size, tokens per iteration, memory table...).

    A finding about several keys names them in `quoting`: each quoted value is then followed by where it came
    from (a config file, a profile, the command line), read from `config` and `origin` once the job's layers
    are merged, e.g. `[train.global_batch_size=4 from configs/_shared/tiny.yaml; run.nodes=48 from profile ...]`."""

    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, object] = field(default_factory=dict)
    tables: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    blocks: dict[str, str] = field(default_factory=dict)  # title -> text shown as it is (a stage's own file)
    config: dict = field(default_factory=dict, repr=False)  # the resolved config the rules read
    origin: dict[str, str] = field(default_factory=dict, repr=False)  # dotted key -> the layer that set it

    def error(self, key: str, message: str, quoting: tuple[str, ...] = ()) -> None:
        self.findings.append(Finding("error", key, message + self.sources(key, quoting)))

    def warn(self, key: str, message: str, quoting: tuple[str, ...] = ()) -> None:
        self.findings.append(Finding("warning", key, message + self.sources(key, quoting)))

    def sources(self, key: str, quoting: tuple[str, ...]) -> str:
        """` [k=v, k=v from SOURCE; ...]` for `key` and the keys it quotes, grouped by source ("default" where no
        layer set the key); empty when nothing is quoted or the config is not known (a rule run on its own)."""
        if not quoting or not self.config:
            return ""
        groups: dict[str, list[str]] = {}
        for dotted in dict.fromkeys((key, *quoting)):
            value = get(self.config, dotted)
            source = self.origin.get(dotted)
            if (value is None and source is None) or isinstance(value, dict):  # a table: its leaves tell
                continue
            # an input's source is already a phrase ("from <job> completed <date>")
            groups.setdefault((source or "default").removeprefix("from "), []).append(f"{dotted}={_short(value)}")
        return " [" + "; ".join(f"{', '.join(items)} from {source}" for source, items in groups.items()) + "]"

    def note(self, key: str, message: str) -> None:
        self.findings.append(Finding("note", key, message))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]


_skipped: set[str] = set()


def skipped(path: str, what: str, why: str) -> None:
    """A damaged file that reading passes over (a job record, a manifest): one warning line on stderr, once."""
    line = Finding("warning", path, f"skipped, a damaged {what}: {why}; fix or remove it").line()
    if line not in _skipped:
        _skipped.add(line)
        print(line, file=sys.stderr)


def _short(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
