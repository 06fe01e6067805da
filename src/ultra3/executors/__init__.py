"""Where a job runs, behind one interface (base.Executor): this machine, Slurm (from the login node or
over SSH), or an existing Ray cluster. A module is imported when its executor is first asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from ..records import JobRecord
    from .base import Executor

NAMES = ("local", "slurm", "ray")


def executor(name: str) -> Executor:
    if name == "local":
        from .local import Local

        return Local()
    if name == "slurm":
        from .slurm import Slurm

        return Slurm()
    if name == "ray":
        from .ray import Ray

        return Ray()
    raise UserError(f"unknown executor '{name}'; choose one of: {', '.join(NAMES)}")


def readers(key: str) -> list[str]:
    """The executors that read `run.<key>` (this imports every executor's module)."""
    return [name for name in NAMES if key in executor(name).keys]


def for_record(record: JobRecord) -> Executor:
    return executor(record.executor)
