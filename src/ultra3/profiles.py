"""env.toml profiles: discovery, `extends` inheritance and a per-executor schema.

Every top-level table is a profile, except the settings tables NVIDIA's CLI reserves: [artifacts]
(`manifest.root`: the artifact store of every profile in the file), [wandb], [cli] and [cache]. A profile names its
`executor`, describes the machines (`gpu`, `gpus_per_node`, `nvlink_domain_size`: the `cluster.*` keys) and sets
`run.*` keys of the stage config
(account, partition, container_image, mounts, env, time, setup, ...).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from .config import flatten
from .limits import MAX_DEPTH, MAX_DIGITS, TOO_DEEP, TOO_LONG
from .errors import UserError
from .findings import Finding, Report
from .nvidia_profile import translate
from .profile import Profile
from .schema import CLUSTER, check, suggest

ENV_FILE_VAR = "NEMOTRON_ENV_FILE"
# TOKEN but not TOKENIZER(S_PARALLELISM): the tokenizer is a model name, not a secret
SECRET_FIX = ("export {name} where you submit from (for SSH profiles: in the login node's environment); "
              "the job inherits it from the environment")
RESERVED = ("artifacts", "wandb", "cli", "cache")  # settings tables, not profiles
UNUSED_TABLES = {"cli": "NVIDIA's CLI colours its dry run with it; ultra3 prints plain text, so it is not read",
                 "cache": "NVIDIA's CLI keeps its git clones there; ultra3 clones nothing, so it is not read"}
# a name that ends in a secret's word (HF_TOKEN, WANDB_API_KEY, logger.comet_api_key), not one that only holds it
# (model.moe_token_dispatcher_type, TOKENIZERS_PARALLELISM) nor a tokenizer's special token (pad_token, eos_token)
SECRET_NAME = re.compile(r"((?<!(?:PAD|EOS|BOS|UNK|SEP|CLS)_)(?<!MASK_)TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY"
                         r"|CREDENTIALS?)$", re.I)


def find_env_file(explicit: str | None = None) -> Path | None:
    """--env-file, else $NEMOTRON_ENV_FILE, else the first env.toml walking up from the cwd."""
    given = explicit or os.environ.get(ENV_FILE_VAR)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            origin = "--env-file" if explicit else ENV_FILE_VAR
            raise UserError(f"{origin}: no such file '{given}'")
        return path
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "env.toml").is_file():
            return folder / "env.toml"
    return None


def read_env_file(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8 TOML") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: invalid TOML: {e}") from None
    except ValueError:  # Python's own limit on the digits of an integer
        raise UserError(f"{path}: {TOO_LONG}") from None
    except RecursionError:
        raise UserError(f"{path}: {TOO_DEEP}") from None
    for name, table in data.items():
        if not isinstance(table, dict):
            raise UserError(f"{path}: top-level key '{name}' must be a [profile] table")
        if bad := _unbounded(table):
            raise UserError(f"{path} [{name}] {bad[0]}: {bad[1]}")
    return data


def _unbounded(table: dict[str, Any]) -> tuple[str, str] | None:
    """(the key, why) of the first value of a profile past the bounds a config file has: nested deeper than
    MAX_DEPTH, an integer longer than MAX_DIGITS."""
    todo: list[tuple[str, Any, int]] = [(str(k), v, 2) for k, v in table.items()]
    while todo:
        key, value, depth = todo.pop()
        if depth > MAX_DEPTH:
            return key, TOO_DEEP
        if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
            return key, TOO_LONG
        if isinstance(value, dict):
            todo += [(f"{key}.{k}", v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):  # its items are named by the key that holds it
            todo += [(key, v, depth + 1) for v in value]
    return None


def profile_names(explicit: str | None = None) -> tuple[Path | None, list[str]]:
    """For --help: never raises."""
    try:
        path = find_env_file(explicit)
        return path, sorted(n for n in read_env_file(path) if n not in RESERVED) if path else []
    except UserError:
        return None, []


def load_profile(name: str, env_file: str | None = None, flag: str = "--run") -> Profile:
    path = find_env_file(env_file)
    if path is None:
        raise UserError(f"{flag} {name}: no env.toml found (looked in --env-file, ${ENV_FILE_VAR}, and from the "
                        "current directory upwards); copy env.toml.example to ./env.toml")
    profiles = read_env_file(path)
    if name in RESERVED:
        raise UserError(f"{flag} {name}: [{name}] in {path} is a settings table, not a profile; name a profile "
                        f"(profiles: {', '.join(sorted(n for n in profiles if n not in RESERVED)) or 'none'})")
    values = _inherit(name, profiles, path, flag, ())
    executor = values.pop("executor", None)
    from .executors import NAMES  # not for --help, which lists the profiles only

    if executor not in NAMES:
        got = f"'{executor}'" if executor else "none"
        choices = " or ".join(f'"{e}"' for e in NAMES)
        raise UserError(f"{path} [{name}]: executor is {got}; set executor = {choices}")
    report = Report()
    values = _env_placeholders(values, path, name)
    stage_values = translate(values, flag, report)
    stage_values.update(wandb_values(profiles.get("wandb"), report))
    for table, why in UNUSED_TABLES.items():
        if profiles.get(table):
            report.note(f"[{table}]", why)
    check_run_keys(values, executor, report, {}, extra=CLUSTER)
    for var in values.get("env") or {}:
        if SECRET_NAME.search(var):
            report.error(f"env.{var}", "secrets don't belong in env.toml: " + SECRET_FIX.format(name=var))
    where = f"{path.name} [{name}]"
    for finding in report.errors:
        _drop(values, finding.key)
    found = [Finding(f.level, f"{where} {f.key}", f.message) for f in report.findings]
    return Profile(name, executor, values, path, artifacts_root(profiles, path), stage_values,
                   [f for f in found if f.level != "error"], [f for f in found if f.level == "error"])


def _drop(values: dict[str, Any], dotted: str) -> None:
    """A bad key out of the profile's values (env.X out of the env table)."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        values = values.get(part) if isinstance(values.get(part), dict) else {}
    values.pop(leaf, None)


def wandb_values(table: Any, report: Report) -> dict[str, Any]:
    """[wandb] for the stages that log to W&B: project and entity (training's logger.*, RL's wandb.*), the run
    name (training's logger.wandb_exp_name; RL names its runs by experiment); any other key gets a note."""
    if not isinstance(table, dict):
        return {}
    out = {}
    for key, value in table.items():
        if key in ("project", "entity"):
            out[f"logger.wandb_{key}"] = out[f"wandb.{key}"] = value
        elif key in ("run_name", "name"):
            out["logger.wandb_exp_name"] = value
        else:
            report.note(f"[wandb] {key}", "not read: the stages' W&B loggers take project, entity and a run name only")
    return out


def _env_placeholders(values: dict[str, Any], path: Path, name: str) -> dict[str, Any]:
    """`${oc.env:VAR,default}` placeholders resolved from the submitting shell, as NVIDIA's CLI does."""
    if "${" not in repr(values):
        return values
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .interpolations import bound

    bound(values, dict.fromkeys(flatten(values), f"{path} [{name}]"))
    try:
        return OmegaConf.to_container(OmegaConf.create(values), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise UserError(f"{path} [{name}] {getattr(e, 'full_key', '')}: {str(e).splitlines()[0]}") from None


def artifacts_root(tables: dict[str, Any], path: Path) -> str | None:
    """[artifacts] manifest.root (`[artifacts.manifest] root = ...`, or a dotted `manifest.root` key)."""
    table = tables.get("artifacts") or {}
    manifest = table.get("manifest")
    root = manifest.get("root") if isinstance(manifest, dict) else table.get("manifest.root")
    if root is not None and (not isinstance(root, str) or not root.startswith("/") or "://" in root):
        raise UserError(f"{path} [artifacts] manifest.root: {root!r} is not a directory path; give an absolute "
                        "path on the cluster's shared file system")
    return root or None


def check_run_keys(values: dict[str, Any], executor: str, report: Report, origin: dict[str, str],
                   prefix: str = "", extra: dict[str, Any] | None = None) -> None:
    """Unknown keys, wrong types, and keys of another executor (run.account on the local executor), against the
    keys the executor declares."""
    from .executors import executor as named, readers

    schema = {**named(executor).keys, **(extra or {})}
    misplaced = {k for k in values if k in CLUSTER and k not in schema}
    others = {k: users for k in values if k not in schema and k not in misplaced and (users := readers(k))}
    check({k: v for k, v in values.items() if k not in others and k not in misplaced}, schema, report, origin, prefix)
    for key in misplaced:  # run.gpu on the command line: the cluster facts live in cluster.*
        report.error(f"{prefix}{key}", f"unknown key; the machines are described by cluster.{key}")
    for key, users in others.items():
        report.error(f"{prefix}{key}", f"is only used by the {' and '.join(users)} executor, not {executor}; remove "
                                       "it or pick a profile with --run/--batch")


def _inherit(name: str, profiles: dict, path: Path, flag: str, chain: tuple[str, ...]) -> dict[str, Any]:
    if name in chain:
        raise UserError(f"{path}: circular extends: {' -> '.join((*chain, name))}")
    if name not in profiles:
        where = f"[{chain[-1]}] extends" if chain else flag
        known = ", ".join(sorted(n for n in profiles if n not in RESERVED)) or "none"
        hint = suggest(name, list(profiles))
        hint = f"; {hint}" if hint.startswith("did you mean") else ""
        raise UserError(f"{where} '{name}': no such profile in {path} (profiles: {known}){hint}")
    table = dict(profiles[name])
    parent = table.pop("extends", None)
    if parent is None:
        return table
    if not isinstance(parent, str):
        raise UserError(f"{path} [{name}]: extends must be a profile name, got {parent!r}")
    merged = _inherit(parent, profiles, path, flag, (*chain, name))
    for key, value in table.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged
