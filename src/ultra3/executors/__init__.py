"""Where a job runs, behind one interface (base.Executor): this machine, Slurm (from the login node or
over SSH), or an existing Ray cluster. A module is imported when its executor is first asked for."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    from ..records import JobRecord
    from .base import Executor

_CLASSES = {"local": "local.Local", "slurm": "slurm.Slurm", "ray": "ray.Ray"}


def executor(name: str) -> Executor:
    if name not in _CLASSES:
        raise UserError(f"unknown executor '{name}'; choose one of: {', '.join(_CLASSES)}")
    module, cls = _CLASSES[name].split(".")
    return getattr(import_module(f"{__name__}.{module}"), cls)()


def for_record(record: JobRecord) -> Executor:
    return executor(record.executor)
