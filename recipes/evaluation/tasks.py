"""The tasks an eval runs: our shipped sample tasks (tasks/*.yaml, each with its JSONL beside it: no network) as
lm-eval task configs, else lm-eval's own tasks by name (its TaskManager indexes them: ~17 s, done only when one is
asked for). An unknown name is one line with lm-eval's closest name."""

from __future__ import annotations

import difflib
import glob
import os

from .errors import EvalError

SHIPPED_DIR = os.path.join(os.path.dirname(__file__), "tasks")


def shipped() -> dict[str, str]:
    """Our task names -> their YAML files."""
    import yaml

    found = {}
    for path in sorted(glob.glob(os.path.join(SHIPPED_DIR, "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            found[yaml.safe_load(f)["task"]] = path
    return found


def spec(path: str) -> dict:
    """A shipped task's config with its data files made absolute (lm-eval reads them relative to the cwd)."""
    import yaml

    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {split: os.path.join(SHIPPED_DIR, name) for split, name in files.items()}
    return config


def resolve(names: list[str]):
    """(TaskManager, {name: what lm-eval loads}): a shipped task's config, or lm-eval's name once it is known."""
    from lm_eval.tasks import TaskManager

    ours = shipped()
    theirs = [n for n in names if n not in ours]
    manager = TaskManager(include_defaults=bool(theirs))
    if theirs:
        known = set(manager.all_tasks)
        for name in theirs:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known | set(ours)), n=1, cutoff=0.6)
                raise EvalError(f"tasks: {name!r} is not a task of lm-eval or of recipes/evaluation/tasks"
                                + (f"; did you mean {close[0]!r}?" if close else "; see `lm-eval ls tasks`"))
    return manager, {n: spec(ours[n]) if n in ours else n for n in names}
