"""`nemotron jobs list | status | logs | cancel`."""

from __future__ import annotations

import sys
import time

from . import jobs


def _age(ts: float) -> str:
    s = int(time.time() - ts)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


def list_jobs(limit: int) -> None:
    records = jobs.all_records()[:limit]
    if not records:
        print(f"no jobs yet (registry: {jobs.registry_dir()})")
        return
    states = jobs.states(records)
    rows = [("JOB", "STAGE", "CONFIG", "WHERE", "SLURM", "STATE", "AGE")]
    for r in records:
        st = states.get(r.id, jobs.State("UNKNOWN"))
        where = r.profile or "local"
        stage = r.stage.replace(" ", "-")  # one word per column
        rows.append((r.id, stage, r.config, where, r.slurm_id or "-", st.state, _age(r.submitted)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def show_status(ref: str) -> None:
    r = jobs.find(ref)
    st = jobs.state(r)
    print(f"job:       {r.id}")
    print(f"stage:     {r.stage} (config {r.config}, {r.profile or 'local'}, {r.mode})")
    print(f"state:     {st.state}{f' (exit code {st.exit_code})' if st.exit_code is not None else ''}"
          f"{f' [{st.source}]' if st.source else ''}")
    if st.reason:
        print(f"reason:    {st.reason}")
    if r.slurm_id:
        print(f"slurm id:  {r.slurm_id}")
    host = f" on {r.ssh['host']}" if r.ssh else ""
    print(f"job dir:   {r.job_dir}{host}")
    print(f"log:       {'the Ray Jobs API (nemotron jobs logs)' if r.ray_address else f'{r.job_dir}/{r.log_glob}'}")


def show_logs(ref: str, follow: bool) -> None:
    r = jobs.find(ref)
    if follow:
        jobs.follow(r, sys.stdout)
    else:
        sys.stdout.write(jobs.log_text(r))


def cancel_job(ref: str) -> None:
    r = jobs.find(ref)
    before = jobs.state(r)
    if before.done:
        print(f"{r.id} already ended: {before.state}")
        return
    jobs.cancel(r)
    print(f"cancelled {r.id}{f' (Slurm job {r.slurm_id})' if r.slurm_id else ''}")
