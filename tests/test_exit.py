"""The CLI's exit: the interpreter's teardown does not collect what the run left (after a submission, NeMo-Run's
~170,000 objects, 2 s of exit): gc.freeze runs as the last exit handler."""

from __future__ import annotations

import subprocess
import sys

# an exit handler registered before the CLI runs, so it runs after the CLI's own: what is frozen by then
PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count()))
from ultra3.cli.app import nemotron_main
sys.argv = ["nemotron", "jobs", "list"]
nemotron_main()
"""


def test_the_exit_leaves_the_objects_of_the_run_uncollected(home):
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.rsplit("frozen ", 1)[1])
    assert frozen > 10_000, done.stdout
