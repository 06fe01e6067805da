"""Record the command-line flags of nvidia-resiliency-ext's ft_launcher from its released source (launcher.py, and
cli_args.py for the rendezvous flags), for the tests that check the command line recipes/ft_launcher.py builds:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64 \\
        nvidia-resiliency-ext==0.6.0 -d /tmp/nvrx && unzip -q /tmp/nvrx/*.whl -d /tmp/nvrx/src
    python scripts/nvrx_launcher_record.py /tmp/nvrx/src > tests/data/nvrx_ft_launcher.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main(root: str) -> None:
    package = Path(root, "nvidia_resiliency_ext", "fault_tolerance")
    source = "".join((package / name).read_text() for name in ("launcher.py", "cli_args.py"))
    version = next(Path(root).glob("nvidia_resiliency_ext-*.dist-info")).name.split("-")[1].removesuffix(".dist")
    flags = sorted(set(re.findall(r'"(--[a-z][a-z0-9_-]*)"', source)))
    print(json.dumps({"nvidia-resiliency-ext": version, "flags": flags}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
