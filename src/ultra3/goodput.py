"""`nemotron jobs goodput RUN|PIPE`: where a run's allocated time went. Each attempt's time is Slurm's (start to
end of the allocation: time queued is not counted), split from its log:
- start-up: to its first iteration's end (the job's start, the checkpoint's load, kernel autotuning in that step);
- productive: from there to the iteration of its last checkpoint save (the work the next attempt goes on from), or
  to its end when the run finished in it;
- lost: the rest: the work after that save, redone by the next attempt; a hang (no iteration for more than HANG_STEPS
  steps before a failed end) is counted in it and said.
An attempt with no iteration (a data prep, a failure before training) is productive when what it did was kept
(outcome done or continue), else lost. Times are GPU-hours (node-hours for CPU-only jobs)."""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Attempt as Run
from .progress import Attempt as Log

HANG_STEPS = 3


@dataclass
class Split:
    startup: float = 0.0  # seconds
    productive: float = 0.0
    lost: float = 0.0
    hang: float = 0.0  # part of lost

    def add(self, other: Split) -> None:
        for name in ("startup", "productive", "lost", "hang"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def total(self) -> float:
        return self.startup + self.productive + self.lost


def split(run: Run, log: Log | None, step_s: float | None) -> Split:
    """One attempt's seconds, by kind."""
    wall = run.seconds
    its = [it for it in (log.iterations if log else []) if it.get("at")]
    if not its or not run.start:
        return Split(productive=wall) if run.outcome in ("done", "continue", "running") else Split(lost=wall)
    first = min(max(its[0]["at"] - run.start, 0.0), wall)
    if run.outcome in ("done", "running"):
        return Split(startup=first, productive=wall - first)
    saved = [it["at"] for it in its if log and it["iteration"] in log.saved]
    kept = min(max((saved[-1] if saved else its[0]["at"]) - run.start, first), wall)
    hang = 0.0
    if run.outcome in ("failed", "lost") and step_s and run.end:
        quiet = run.end - its[-1]["at"]
        hang = quiet if quiet > HANG_STEPS * step_s else 0.0
    return Split(startup=first, productive=kept - first, lost=wall - kept, hang=min(hang, wall - kept))


def lines(name: str, runs: list[Run], logs: list[Log], step_s: float | None, per_node: int) -> list[str]:
    """The split of every attempt of one run, and its total, in hours of the resource it holds."""
    by_number = {log.number: log for log in logs}
    unit = "GPU-h" if per_node else "node-h"
    total, rows = Split(), []
    for run in runs:
        part = split(run, by_number.get(run.number), step_s)
        total.add(part)
        scale = run.nodes * (per_node or 1) / 3600
        rows.append(f"  attempt {run.number:>3}  {run.outcome:<8}  {_row(part, scale, unit)}")
    scale = (runs[0].nodes if runs else 1) * (per_node or 1) / 3600
    share = f"goodput {100 * total.productive / total.total:.1f}%" if total.total else "goodput -"
    return [f"{name}: {len(runs)} attempt(s), {share}", *rows, f"  {'total':<21}  {_row(total, scale, unit)}"]


def _row(part: Split, scale: float, unit: str) -> str:
    hang = f" (hang {_hours(part.hang * scale)})" if part.hang else ""
    return (f"productive {_hours(part.productive * scale)}, start-up {_hours(part.startup * scale)}, "
            f"lost {_hours(part.lost * scale)}{hang} {unit}")


def _hours(x: float) -> str:
    return f"{x:,.1f}" if x >= 100 else f"{x:.3g}"
