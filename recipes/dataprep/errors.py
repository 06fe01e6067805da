"""The two errors a data-prep run reports to its user (one line on stderr, exit contract.INPUT_ERROR_EXIT),
as opposed to bugs and system failures (a traceback, exit 1), of which a full disk is reported the same way."""

from __future__ import annotations

import errno

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a write refused for want of space (or of quota)


class DataPrepError(Exception):
    """A problem with the config or the inputs: missing files, an unreadable tokenizer, an empty corpus."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))  # always one line


class BadRecordError(DataPrepError):
    """A bad input record under `strict: true`."""


class HubUnreachable(Exception):
    """The Hugging Face Hub could not be reached (no network, offline mode, a timeout, the Hub's own 5xx or 429): the
    machine's failure, not the input's; one line on stderr, exit 1."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
