"""What an eval run reports in one line: an input problem (EvalError: exit contract.INPUT_ERROR_EXIT, nothing
written) or the machine's failure (EvalFailed: exit 1, e.g. a model server that never came up). EvalError is a
data-prep error, so the helpers shared with data prep and quantize (reading the config, the Megatron export) report
the same way."""

from __future__ import annotations

from ..dataprep.errors import DataPrepError


class EvalError(DataPrepError):
    """A problem with the config or the inputs."""


class EvalFailed(Exception):
    """The machine's failure: one line on stderr, exit 1."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
