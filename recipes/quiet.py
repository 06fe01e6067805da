"""Third-party noise out of a job's log, unless the job was submitted with `ultra3 -v` (contract.VERBOSE_VAR=1 in
its environment): the warnings, INFO lines and progress bars of the libraries the runtimes use. Our own lines,
and every library's errors and tracebacks, always show. Read once, as each runtime process starts."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import threading
import warnings
from typing import IO, Iterator

from .contract import VERBOSE_VAR

VERBOSE = os.environ.get(VERBOSE_VAR) == "1"

# the libraries whose warnings and log records below ERROR stay out of the log
LIBRARIES = ("megatron", "transformer_engine", "apex", "transformers", "huggingface_hub", "datasets", "modelopt",
             "torch", "ray", "nemo_rl", "nvidia_resiliency_ext", "lm_eval", "evaluate")
# what their progress bars and log levels obey, for this process and every process it starts (the recipe, its
# ranks, Ray's nodes); a value the job's environment already has (run.env) is kept
ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
       "TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
RAY_LEVEL = "INFO" if VERBOSE else "ERROR"  # ray.init's logging_level
# `ray`'s own option for its loggers; its start-up lines (`Ray runtime started.`, next steps) print at any level
RAY_CLI_OPTIONS = () if VERBOSE else ("--logging-level=warning",)
RAY_CLI_INFO = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|SUCC|VINFO|VVINFO|DEBUG) ")


def install() -> None:
    if VERBOSE:
        return
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", module=rf"({'|'.join(LIBRARIES)})(\.|$)")
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)
    _bars_off()


def _bars_off() -> None:
    """tqdm bars off even where a library passes disable=False itself (lm-eval's), which TQDM_DISABLE cannot do."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    init = tqdm.__init__

    def quiet_init(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "disable": True})

    tqdm.__init__ = quiet_init


@contextlib.contextmanager
def prints() -> Iterator[None]:
    """What a library print()s to stdout while it runs (ModelOpt's `Inserted 187 quantizers`, ...), dropped."""
    if VERBOSE:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class RayCli(subprocess.Popen):
    """A `ray` command whose stdout reaches ours without its INFO lines; its warnings and errors pass."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(argv, **({} if VERBOSE else {"stdout": subprocess.PIPE, "text": True}))
        self.passing = None
        if self.stdout:
            self.passing = threading.Thread(target=_pass_on, args=(self.stdout,), daemon=True)
            self.passing.start()

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        if self.passing:  # what it printed last; a process it started and left holding the pipe is not waited for
            self.passing.join(timeout=2)
        return code


def _pass_on(stream: IO[str]) -> None:
    for line in stream:
        if not RAY_CLI_INFO.match(line):
            sys.stdout.write(line)
            sys.stdout.flush()
