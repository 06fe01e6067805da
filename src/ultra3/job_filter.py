"""Which jobs `nemotron jobs list` shows: by stage, state, profile and pipe."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UserError
from .records import TERMINAL, JobRecord, State
from .schema import suggest

STATES = sorted({"PENDING", "RUNNING", "UNKNOWN", *TERMINAL})


@dataclass
class JobFilter:
    stage: str | None = None  # `data prep sft` or `data-prep-sft`, as the STAGE column writes it
    state: str | None = None
    profile: str | None = None  # `local`: a job on this machine without one
    pipe: str | None = None  # a pipe id or a prefix of one

    def __post_init__(self) -> None:
        from .stages import STAGES

        if self.stage is not None:
            self.stage = self.stage.replace("-", " ").strip()
            names = [s.name for s in STAGES]
            if self.stage not in names:
                hint = suggest(self.stage, names).replace("known keys", "the stages are")
                raise UserError(f"--stage {self.stage}: no such stage; {hint}")
        if self.state is not None:
            self.state = self.state.upper()
            if self.state not in STATES:
                hint = suggest(self.state, STATES).replace("known keys", "the states are")
                raise UserError(f"--state {self.state}: no such state; {hint}")

    def any(self) -> bool:
        return any(v is not None for v in (self.stage, self.state, self.profile, self.pipe))

    def said(self) -> str:
        given = [("--stage", self.stage), ("--state", self.state), ("--profile", self.profile), ("--pipe", self.pipe)]
        return "".join(f"{flag} {value} " for flag, value in given if value is not None).replace("--", "with --", 1)

    def pick(self, found: list[JobRecord]) -> list[JobRecord]:
        """The records that match all but the state, which needs asking the executors."""
        return [r for r in found if (self.stage is None or r.stage == self.stage)
                and (self.profile is None or (r.profile or "local") == self.profile)
                and (self.pipe is None or (r.pipe or "").startswith(self.pipe))]

    def states(self, found: list[JobRecord], limit: int) -> tuple[list[JobRecord], dict[str, State]]:
        """The newest `limit` of `found` in the state asked for, and their states."""
        from . import jobs

        if self.state is None:
            return found[:limit], jobs.states(found[:limit])
        states = jobs.states(found)
        return [r for r in found if states.get(r.id, State("UNKNOWN")).state == self.state][:limit], states

