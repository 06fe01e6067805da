"""Secrets kept out of everything the launcher writes (the job dir's config, the batch script, logs): a secret
reaches a job through its environment only. Checked on the merged values and again on the resolved ones, so no
spelling of a reference (`${oc.env:'HF_TOKEN'}`, nested ones) gets a secret's value in."""

from __future__ import annotations

import os
import re
from typing import Any, Iterator

from .config import flatten
from .findings import Report
from .profiles import SECRET_FIX, SECRET_NAME

_ENV_REF = re.compile(r"\$\{\s*oc\.env\s*:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
# NAME=value in a shell line, the value not a reference to the environment ($NAME, ${NAME})
_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(?!\$)(\S+)")
MIN_SECRET = 6  # shorter environment values are not looked for (they would match by chance)


def check_merged(flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """run.env values named like secrets, references to secret variables, secrets assigned in setup lines."""
    for key, value in flat.items():
        name = key.removeprefix("run.env.")
        if name != key and SECRET_NAME.search(name) and value not in (None, ""):
            report.error(key, f"a secret would be written to the job dir (set in {origin[key]}); remove it and "
                              + SECRET_FIX.format(name=name))
        for text in _strings(value):
            for var in _ENV_REF.findall(text):
                if SECRET_NAME.search(var):
                    report.error(key, f"references the secret {var} (set in {origin.get(key)}); secrets reach the job "
                                      "through its environment only, so read it there instead of from the config")
            for var, _ in _ASSIGNMENT.findall(text) if key == "run.setup" else ():
                if SECRET_NAME.search(var):
                    report.error(key, f"a setup line assigns the secret {var} a literal value (set in "
                                      f"{origin.get(key)}), which the batch script and its log would show; remove "
                                      "it and " + SECRET_FIX.format(name=var))


def check_resolved(config: dict[str, Any], report: Report) -> None:
    """A resolved value holding the value of a secret-named variable of this environment."""
    secrets = {name: value for name, value in os.environ.items() if SECRET_NAME.search(name) and len(value) >= MIN_SECRET}
    if not secrets:
        return
    for key, value in flatten(config).items():
        for name, secret in secrets.items():
            if any(secret in text for text in _strings(value)):
                report.error(key, f"holds the value of the secret {name}, which would be written to the job dir; "
                                  "remove it: " + SECRET_FIX.format(name=name))
                break


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)

