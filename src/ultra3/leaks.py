"""Secrets kept out of everything the launcher writes (the job dir's config and manifest, the batch script, logs)
and prints (the dry run): a secret reaches a job through its environment only. A key named like a secret holding
a value is refused at any depth of any section, and masked wherever the dry run shows one. Checked on the merged
values and again on the resolved ones, so no spelling of a reference (`${oc.env:'HF_TOKEN'}`, nested ones) gets
a secret's value in."""

from __future__ import annotations

import os
import re
from typing import Any, Iterator

from .config import flatten
from .findings import Report
from .forms import ENV_NAME
from .profiles import SECRET_FIX, SECRET_NAME
from .setup_secrets import literal_secrets

_ENV_REF = re.compile(r"\$\{\s*oc\.env\s*:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
MIN_SECRET = 6  # shorter environment values are not looked for (they would match by chance)
MASK = "******"
SETUP_LINE = {"variable": "assigns the secret {} a literal value",  # what a setup line does, by setup_secrets' kind
              "option": "passes the secret option {} a literal value",
              "file": "writes a literal value to the secret file {}"}


def secret_name(key: str) -> str | None:
    """The last part of a dotted key named like a secret (nemo_rl_add.env.HF_TOKEN: HF_TOKEN), None if none is."""
    return next((part for part in reversed(key.split(".")) if SECRET_NAME.search(part)), None)


def check_merged(flat: dict[str, Any], origin: dict[str, str], report: Report) -> None:
    """Secret-named keys with a value, at any depth (refused and dropped, so no later check quotes them),
    references to secret variables, secrets given a literal value in setup lines."""
    for key, value in list(flat.items()):
        if name := next(filter(None, map(secret_name, _set_paths(key, value))), None):
            report.error(key, f"a secret would be written to the job dir (set in {origin.get(key)}); remove it and "
                              + _fix(name))
            del flat[key]
            continue
        for text in _strings(value):
            for var in _ENV_REF.findall(text):
                if SECRET_NAME.search(var):
                    report.error(key, f"references the secret {var} (set in {origin.get(key)}); secrets reach the job "
                                      "through its environment only, so read it there instead of from the config")
    setup = flat.get("run.setup")
    if isinstance(setup, list) and all(isinstance(line, str) for line in setup):
        env = {k.removeprefix("run.env.") for k in flat if k.startswith("run.env.")}
        for what, kind in literal_secrets(setup, env).items():
            report.error("run.setup", f"a setup line {SETUP_LINE[kind].format(what)} (set in "
                                      f"{origin.get('run.setup')}), which the batch script and its log would show; "
                                      "remove it and " + _fix(what, True))


def check_resolved(config: dict[str, Any], report: Report) -> None:
    """A resolved value holding the value of a secret-named variable of this environment."""
    secrets = {name: value for name, value in os.environ.items()
               if SECRET_NAME.search(name) and len(value) >= MIN_SECRET}
    if not secrets:
        return
    for key, value in flatten(config).items():
        for name, secret in secrets.items():
            if any(secret in text for text in _strings(value)):
                report.error(key, f"holds the value of the secret {name}, which would be written to the job dir; "
                                  "remove it: " + SECRET_FIX.format(name=name))
                break


def masked(tree: Any, key: str = "") -> Any:
    """A config with the values of its secret-named keys shown as ******."""
    if isinstance(tree, dict):
        return {k: masked(v, f"{key}.{k}") for k, v in tree.items()}
    if isinstance(tree, list):
        return [masked(v, key) for v in tree]
    return MASK if secret_name(key) and tree not in (None, "") else tree


def _fix(name: str, in_line: bool = False) -> str:
    """How to pass the secret `name` (a variable, a config key, an option, a file) instead."""
    if ENV_NAME.fullmatch(name) and name.isupper():
        return SECRET_FIX.format(name=name)
    return "keep the secret in the environment instead: " + SECRET_FIX.format(name="it") + \
        (", and have the line read it there (\"$HF_TOKEN\")" if in_line else "")


def _set_paths(key: str, value: Any) -> Iterator[str]:
    """The dotted keys of the values set under `key` (tables and lists searched, empty values and booleans not)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _set_paths(f"{key}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _set_paths(key, v)
    elif value not in (None, "") and not isinstance(value, bool):
        yield key


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)

