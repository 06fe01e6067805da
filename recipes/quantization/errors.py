"""The error a quantize run reports to its user (one line on stderr, exit contract.INPUT_ERROR_EXIT, nothing
written), as opposed to bugs and system failures (a traceback, exit 1). It is a data-prep error, so the helpers
shared with data prep (reading the config, finding input files) report the same way."""

from __future__ import annotations

from ..dataprep.errors import DataPrepError


class QuantizeError(DataPrepError):
    """A problem with the config or the inputs: a missing checkpoint, an unknown or non-matching recipe,
    unusable calibration data, an output_dir holding something else."""
