"""lm-evaluation-harness's task, group and tag names, recorded in task_names.txt.gz for the launcher's dry run:
indexing them through lm-eval's TaskManager takes ~17 s (14,683 YAML files), reading the record a few ms. The
launcher reads the file (it never imports lm-eval); the job loads its tasks through lm-eval itself. Regenerate after
changing the pinned lm-eval (pyproject.toml's `eval` extra):

    python -m recipes.evaluation.task_names
"""

from __future__ import annotations

import gzip
import os

RECORD = os.path.join(os.path.dirname(__file__), "task_names.txt.gz")


def write(path: str = RECORD) -> int:
    import lm_eval
    from lm_eval.tasks import TaskManager

    names = sorted(set(TaskManager().all_tasks))
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: the same names, the same bytes
        f.write((f"# lm-eval {lm_eval.__version__}\n" + "\n".join(names) + "\n").encode())
    return len(names)


if __name__ == "__main__":
    print(f"recorded {write()} names in {RECORD}")
