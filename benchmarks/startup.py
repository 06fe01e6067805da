"""Start-up time of the CLI: median wall time of `ultra3 --help` and of
`ultra3 pretrain -c tiny --dry-run --batch <slurm profile>` (targets: <= 0.2 s and <= 0.3 s).

    python benchmarks/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROFILE = """
[bench]
executor = "slurm"
account = "bench"
partition = "batch"
gpu = "b200"
gpus_per_node = 8
"""

COMMANDS = {
    "ultra3 --help": ["--help"],
    "ultra3 pretrain -c tiny --dry-run --batch bench": ["pretrain", "-c", "tiny", "--dry-run", "--batch", "bench"],
    "ultra3 pretrain --dry-run --batch bench (full Ultra)": ["pretrain", "--dry-run", "--batch", "bench",
                                                              "dataset.blend_path=/data/blend.json"],
}
TARGETS = {"ultra3 --help": 0.2, "ultra3 pretrain -c tiny --dry-run --batch bench": 0.3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    exe = shutil.which("ultra3") or str(Path(sys.executable).parent / "ultra3")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "env.toml").write_text(PROFILE)
        env = {**os.environ, "NEMOTRON_HOME": str(Path(tmp, "state"))}
        print(f"{'command':<55} {'median':>8} {'min':>8} {'target':>8}  ({args.runs} runs, {os.cpu_count()} CPUs)")
        for label, argv in COMMANDS.items():
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                p = subprocess.run([exe, *argv], cwd=tmp, env=env, capture_output=True)
                times.append(time.perf_counter() - t0)
                if p.returncode != 0:
                    sys.exit(f"{label} failed: {p.stderr.decode()}")
            target = TARGETS.get(label)
            print(f"{label:<55} {statistics.median(times):>7.3f}s {min(times):>7.3f}s "
                  f"{f'{target:.1f}s' if target else '-':>8}")


if __name__ == "__main__":
    main()
