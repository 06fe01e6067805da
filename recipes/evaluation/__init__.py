"""Helpers of `ultra3 eval` (recipes/eval.py): the shipped sample tasks (tasks/), lm-evaluation-harness's task
names as recorded for the launcher's dry run (task_names.py), the in-job vLLM server (serve.py), the checkpoint's
lineage from the artifact store (lineage.py) and results.json (results.py)."""
