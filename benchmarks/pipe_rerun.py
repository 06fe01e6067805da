"""Re-running a completed pipe: a 3-step chain on this machine (tiny data prep pretrain, tiny data prep sft,
tiny quantize calibrated on the sft packs), run once, then run again, side by side with what the re-run
costs a launcher that re-submits every stage (NVIDIA's nano3/super3 `pipe`; its ultra3 has no pipe): the
first run's time again. Target: the re-run under 2 s.

    python benchmarks/pipe_rerun.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHAIN = """stages:
  data-pretrain: {stage: data prep pretrain, config: tiny}
  data-sft: {stage: data prep sft, config: tiny}
  quantize: {stage: quantize, config: tiny}
"""
TARGET_S = 2.0


def run(ultra3: str, pipe: Path, env: dict) -> tuple[float, str]:
    start = time.monotonic()
    p = subprocess.run([ultra3, "pipe", "-c", str(pipe)], capture_output=True, text=True, env=env)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"ultra3 pipe failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr}")
    return seconds, p.stdout


def main() -> None:
    ultra3 = shutil.which("ultra3") or str(Path(sys.executable).parent / "ultra3")
    with tempfile.TemporaryDirectory(prefix="ultra3-bench-") as tmp:
        pipe = Path(tmp) / "chain.yaml"
        pipe.write_text(CHAIN)
        env = {**os.environ, "NEMOTRON_HOME": f"{tmp}/state"}
        env.pop("NEMORUN_HOME", None)
        first, _ = run(ultra3, pipe, env)
        again, out = run(ultra3, pipe, env)
    skipped = out.count(": skipped, done by ")
    print(f"{'':38}{'wall':>10}")
    print(f"{'first run (3 steps, this machine)':38}{first:>9.1f}s")
    print(f"{'re-run, every stage re-submitted':38}{first:>9.1f}s   (a launcher without skips: the same work again)")
    print(f"{'re-run, ultra3 pipe':38}{again:>9.2f}s   ({skipped} of 3 steps skipped; target < {TARGET_S:.0f} s: "
          f"{'met' if again < TARGET_S and skipped == 3 else 'MISSED'})")


if __name__ == "__main__":
    main()
