"""A training stage's ranks under nvidia-resiliency-ext's ft_launcher (run.fault_tolerance.enabled), one per node:
`python -m recipes.ft_launcher --module recipes.pretrain --config config.yaml` runs contract.ft_launcher_argv's
command and ends with the exit code the ranks meant.

ft_launcher restarts every rank after any non-zero exit and itself ends 0 or 1, so the exits the attempt supervisor
tells apart (the time-limit stop CONTINUE_EXIT, an input error, Megatron's failed validation 17) would be restarted
in the job and then read as failures. A rank that ends so writes its code to a file of this attempt and exits 0
(`rank_exit`): ft_launcher ends 0 without a restart, and the code is read back here. Stdlib (plus PyYAML) only."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from .contract import CONTINUE_EXIT, HEAD_NODE_VAR, INPUT_ERROR_EXIT, VALIDATION_EXIT, ft_launcher_argv, write_atomic
from .nodes import job_file, read, run_child

EXIT_FILE_VAR = "ULTRA3_FT_EXIT_FILE"  # set for the ranks: where a rank's decided exit code goes
DECIDED = (CONTINUE_EXIT, INPUT_ERROR_EXIT, VALIDATION_EXIT)  # exits that an in-job restart must not repeat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--module", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--round", default="", help="a later start in the same allocation: its own rendezvous")
    args = parser.parse_args()
    import yaml

    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    exit_file = job_file(cfg, "ft-exit")
    with contextlib.suppress(FileNotFoundError):
        os.remove(exit_file)
    head = os.environ.get(HEAD_NODE_VAR) or os.environ.get("MASTER_ADDR", "localhost")
    argv = ft_launcher_argv(cfg["run"], sys.executable, head, "-".join(filter(None, (cfg["job"]["id"], args.round))),
                            args.module, args.config)
    return run_child(argv, env={**os.environ, EXIT_FILE_VAR: exit_file}) or decided(exit_file)


def decided(path: str) -> int:
    """The decided exit code a rank wrote, else 0 (the ranks finished)."""
    text = read(path)
    return int(text) if text.isdigit() and int(text) in DECIDED else 0


@contextlib.contextmanager
def rank_exit():
    """Around a rank's work: under ft_launcher (EXIT_FILE_VAR set), a decided exit is written down and becomes exit 0.
    Rank 0 first clears what a rank of an earlier in-job restart wrote."""
    path = os.environ.get(EXIT_FILE_VAR)
    if path and os.environ.get("RANK") == "0":
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    try:
        yield
    except SystemExit as e:
        if not path or e.code not in DECIDED:
            raise
        write_atomic(path, str(e.code))
        raise SystemExit(0) from None


if __name__ == "__main__":
    raise SystemExit(main())
