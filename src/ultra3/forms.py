"""The forms a config value may take where a plain type is not enough: strings that reach a shell or a file
name unquoted, bounded counts, tables of environment variables. The schema (schema.py) and the places that
check a derived value (the built image's path, the Slurm request) use them."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Text:
    """A string of a restricted form: what reaches a shell unquoted (a job name, a path NeMo-Run's packager
    passes to tar) may hold only what is safe there."""

    pattern: str
    what: str  # "a job name (letters, digits, '.', '_', '-')"

    def __call__(self, value: object) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None


# The Slurm job name is the prefix + the task name (18 characters at most, `data-prep-pretrain`), and the batch script
# names its logs after it: `log-<job name>_<job id>_<restart>.out`, one file name of at most 255 bytes, which a job
# id of 10 digits and a restart count of 4 leave 231 of; a longer one fails the job before it writes a line.
# (Slurm's own limit on a job name is 1024 characters.)
JOB_NAME_PREFIX_MAX = 200
JOB_NAME = Text(rf"[A-Za-z0-9._-]{{0,{JOB_NAME_PREFIX_MAX}}}",
                f"letters, digits, '.', '_' and '-' only, {JOB_NAME_PREFIX_MAX} characters at most (it becomes part of "
                "the Slurm job name and of log file names in the batch script, 255 bytes each at most)")
SAFE_PATH = Text(r"[A-Za-z0-9._/~+-]+", "a path of letters, digits and '._/~+-' only (NeMo-Run's packager and the "
                                         "batch script use it unquoted)")
# NeMo-Run writes the srun line's arguments unquoted (its `noquote` is an alias of str): an image and a mount are
# one shell word that needs no quoting, so the submitted script runs the same whether NeMo-Run quotes them or not
IMAGE = Text(r"([A-Za-z0-9_./:@+=][A-Za-z0-9_./:@#+=-]*)?",
             "a .sqsh path or an image reference of letters, digits and '_./:@#+=-' (not starting with '-' or '#'), "
             "or \"\" for none (the batch script's srun line holds it unquoted)")
MOUNT = Text(r"[A-Za-z0-9_./@+=][A-Za-z0-9_./:@+=-]*",
             "SRC:DST[:FLAGS] of letters, digits and '_./:@+=-' (no ',' or space; not starting with '-'), as the "
             "batch script's srun line holds it unquoted")
SLURM_TIME = Text(r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE",
                  "a Slurm time limit: MM, HH:MM:SS or D-HH:MM:SS (e.g. 04:00:00)")
SLURM_MEM = Text(r"\d+[KMGT]?", "a Slurm memory size: a number with K, M, G or T (0: all of the node's memory)")
# ssh's argv holds them: an option-like value (-oProxyCommand=...) would run a command on this machine
HOST = Text(r"([A-Za-z0-9_:][A-Za-z0-9._:-]*)?", "a host name, an address or a ~/.ssh/config alias of letters, "
                                                "digits and '._:-', not starting with '-' or '.'")
USER = Text(r"([A-Za-z0-9_][A-Za-z0-9._-]*)?", "a user name of letters, digits and '._-', not starting with '-' or '.'")
PORT_NUMBER = r"(6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3})"  # 1-65535
RAY_ADDRESS = Text(rf"(https?://)?[A-Za-z0-9._-]+(:{PORT_NUMBER})?/?",
                   "a Ray dashboard address such as http://head:8265 (a port from 1 to 65535)")
INT64 = 2**63 - 1


@dataclass(frozen=True)
class Count:
    """An integer within [low, high]."""

    low: int
    high: int = INT64

    def __call__(self, value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high

    @property
    def what(self) -> str:
        return f"an integer from {self.low} to {self.high}" if self.high < INT64 else f"an integer >= {self.low}"


PORT = Count(1, 65535)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvTable:
    """Environment variables for the job: names that are names (they are exported by the batch script)."""

    def __call__(self, value: object) -> bool:
        return isinstance(value, dict) and all(isinstance(v, (str, int, float, bool)) for v in value.values()) \
            and not self.bad_names(value)

    @staticmethod
    def bad_names(value: dict) -> list[str]:
        return [k for k in value if not ENV_NAME.fullmatch(str(k))]


ENV = EnvTable()
