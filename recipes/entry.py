"""A one-process runtime's `main` (quantize, eval): `--config config.yaml`, the quiet filters, then the job's
one-line contract: an input error (a DataPrepError) is `<prog>: error: ...` and exit contract.INPUT_ERROR_EXIT, the
machine's failure (the runtime's own kinds) the same line and exit 1; anything else its traceback."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from . import quiet
from .contract import INPUT_ERROR_EXIT
from .dataprep.errors import DataPrepError


def main(doc: str, run: Callable[[str], int], prog: str, machine: tuple[type[Exception], ...],
         argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the resolved stage config (YAML)")
    args = parser.parse_args(argv)
    quiet.install()
    try:
        return run(args.config)
    except DataPrepError as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return INPUT_ERROR_EXIT
    except machine as e:
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return 1
