"""Typed errors that say whose fault it is. The CLI prints them as single lines, never tracebacks."""

from __future__ import annotations

from .findings import Finding


class LauncherError(Exception):
    exit_code = 1
    whose = "launcher"

    def lines(self) -> list[str]:
        return [f"error: {self}".replace("\r", "\\r").replace("\n", "\\n")]  # one line whatever it quotes


class UserError(LauncherError):
    """Bad input: a config, an override, a profile, a flag. Nothing was written or submitted."""

    exit_code = 2
    whose = "input"


class InvalidConfig(UserError):
    """Every error validation found, one line each."""

    def __init__(self, findings: list[Finding]):
        super().__init__(f"{len(findings)} error(s) in the configuration")
        self.findings = findings

    def lines(self) -> list[str]:
        return [f.line() for f in self.findings]


class JobInputError(UserError):
    """The job stopped on bad input that only its runtime could see (a record, a file's content), exit code 2."""


class ClusterError(LauncherError):
    """The cluster or the machine refused: sbatch failed, SSH unreachable, accounting unavailable."""

    whose = "cluster"


class JobFailed(LauncherError):
    """The job ran and failed; the message carries the reason (its first line) and the log tail, as it is."""

    whose = "job"

    def lines(self) -> list[str]:
        return [f"error: {self}"]
