"""Everyday speed, side by side with an older launcher (a git worktree of --old, run by the same Python): a detached
Slurm submission (`ultra3 data prep pretrain -c tiny --batch bench`: to its `submitted` line and to the prompt), an
attached run's return after its Slurm job ended (after the batch script's last line), and `nemotron jobs status`
/ `jobs list` with --records generated job records. Alternating runs, medians; the local Slurm cluster
(scripts/slurm-local/start.sh) and the `data` extra for the job's Python (this venv, on PATH).

    python benchmarks/jobs_speed.py [--old REV] [--runs 3] [--records 100000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROFILE = """[bench]
executor = "slurm"
account = "ultra3"
partition = "debug"
gpus_per_node = 0
time = "00:05:00"
container_image = ""
"""
PREP = ["data", "prep", "pretrain", "-c", "tiny"]
IMPORTS = {  # NeMo-Run whole, as submissions imported it before, and what one imports now (nemo_run_lite)
    "import nemo_run (whole)": "import nemo_run",
    "what a submission imports of it (nemo_run_lite)": """
from ultra3.executors.nemo_run_lite import submission
with submission():
    pass""",
}


def timed(argv: list[str], env: dict, cwd: Path) -> tuple[float, float, str]:
    """Seconds to the `submitted` line, seconds to exit, and the output."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    out, submitted = "", None
    for line in proc.stdout:
        out += line
        if submitted is None and line.startswith("submitted "):
            submitted = time.monotonic() - start
    proc.wait()
    return submitted or float("nan"), time.monotonic() - start, out


def cancel(out: str) -> None:
    if m := re.search(r"\(Slurm job (\d+)\)", out):
        subprocess.run(["scancel", m.group(1)], capture_output=True)


def after_end(out: str, ended_at: float) -> float:
    """Seconds from the batch script's last line (its output's mtime) to the command's return."""
    job_dir = Path(re.search(r"^job dir: (.+)$", out, re.M).group(1))
    return ended_at - max(p.stat().st_mtime for p in job_dir.glob("*/sbatch_*.out"))


def side_by_side(label: str, old: list[float], new: list[float]) -> None:
    o, n = statistics.median(old), statistics.median(new)
    print(f"{label:<52}{o:>9.2f}s{n:>9.2f}s{o / n:>8.1f}x   (min {min(old):.2f} / {min(new):.2f})")


def write_records(home: Path, count: int) -> str:
    """`count` local job records as a launcher writes them (no index: the first look builds it); the newest id."""
    sys.path.insert(0, str(REPO / "src"))
    from ultra3.records import JobRecord

    folder = home / "jobs"
    folder.mkdir(parents=True)
    base = time.time() - count
    for n in range(count):
        job_id = f"ultra3-sft_20261128-{n:06d}-{n:06x}"
        record = JobRecord(id=job_id, stage="sft", config="tiny", executor="local", mode="local", submitted=base + n,
                           job_dir=str(home / "jobs-dirs" / job_id), task="sft", log_glob="sft/log-local.out")
        (folder / f"{job_id}.json").write_text(json.dumps(dataclasses.asdict(record), indent=2))
    return job_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default="5527a0f", help="the older launcher's commit (default: before these changes)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ultra3-bench-") as tmp:
        work = Path(tmp)
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", f"{tmp}/old", args.old], check=True,
                       capture_output=True)
        try:
            bench(work, args)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", f"{tmp}/old"], capture_output=True)


def bench(work: Path, args) -> None:
    (work / "env.toml").write_text(PROFILE)
    base = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "NEMOTRON_HOME": str(work / "state")}
    base.pop("NEMORUN_HOME", None)
    envs = {"old": {**base, "PYTHONPATH": str(work / "old" / "src")}, "new": base}
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; old = {args.old}, new = this tree; "
          f"medians of {args.runs} alternating runs")
    print(f"{'':<52}{'old':>10}{'new':>10}{'speedup':>9}")
    took: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in ("sub", "exit", "attached")}
    for _ in range(args.runs):
        for which, env in envs.items():
            submitted, done, out = timed([str(BIN / "ultra3"), *PREP, "--batch", "bench"], env, work)
            cancel(out)
            took["sub"][which].append(submitted)
            took["exit"][which].append(done)
    side_by_side("--batch: command to `submitted`", took["sub"]["old"], took["sub"]["new"])
    side_by_side("--batch: command to the prompt", took["exit"]["old"], took["exit"]["new"])
    for _ in range(args.runs):
        for which, env in envs.items():
            _, _, out = timed([str(BIN / "ultra3"), *PREP, "--run", "bench"], env, work)
            took["attached"][which].append(after_end(out, time.time()))
    side_by_side("--run: return after the job's script ended", took["attached"]["old"], took["attached"]["new"])
    for label, code in IMPORTS.items():  # torch hidden, as the launcher hides it from NeMo-Run
        script = f"import sys, time; sys.modules['torch'] = None; t = time.perf_counter()\n{code}\n" \
                 "print(time.perf_counter() - t)"
        runs = [float(timed([sys.executable, "-c", script], base, work)[2]) for _ in range(args.runs)]
        print(f"{label:<52}{statistics.median(runs):>9.2f}s   (the import alone)")
    registry(work, args, envs)


def registry(work: Path, args, envs: dict) -> None:
    home = work / "registry"
    newest = write_records(home, args.records)
    envs = {k: {**env, "NEMOTRON_HOME": str(home)} for k, env in envs.items()}
    nemotron = str(BIN / "nemotron")
    first = timed([nemotron, "jobs", "list"], envs["new"], work)[1]
    print(f"{args.records:,} records: the first look builds the index: {first:.1f}s (once)")
    for label, argv in {"jobs status (the newest)": ["status"], "jobs status <id prefix>": ["status", newest[11:26]],
                        "jobs list": ["list"]}.items():
        old = [timed([nemotron, "jobs", *argv], envs["old"], work)[1]]  # every record read: one run is enough
        new = [timed([nemotron, "jobs", *argv], envs["new"], work)[1] for _ in range(args.runs)]
        side_by_side(f"{label}, {args.records:,} records", old, new)


if __name__ == "__main__":
    main()
