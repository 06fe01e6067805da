"""The job registry's index ($NEMOTRON_HOME/jobs.index): `nemotron jobs list` and `status` show through it what a
read of every record shows, whether the index is up to date, missing, garbled or stale (a record written without
it, as an older launcher or a hand does); they read only the records they show; a damaged record is named at
every look."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import pytest

from ultra3 import jobs, record_index, records

BASE = time.time() - 86400


def local_job(home: Path, n: int, submitted: float) -> records.JobRecord:
    """A completed local job: its record and its exit code."""
    job_id = f"ultra3-{'sft' if n % 3 else 'pretrain'}_20261128-{n:06d}-{n:06x}"
    task = home / "experiments" / job_id / "t"
    task.mkdir(parents=True)
    (task / "exit_code").write_text(f"{n % 2}\n")
    return records.JobRecord(id=job_id, stage="sft", config="tiny", executor="local", mode="local",
                             submitted=submitted, job_dir=str(task.parent), task="t", log_glob="t/log-local.out")


def by_hand(record: records.JobRecord) -> None:
    """Written as an older launcher wrote it: the record only."""
    (records.registry_dir() / f"{record.id}.json").write_text(json.dumps(dataclasses.asdict(record)))


@pytest.fixture
def registry(home) -> list[records.JobRecord]:
    """25 jobs saved out of order, 3 of them written by hand; newest first."""
    made = [local_job(home, n, BASE + n * 60) for n in range(25)]
    for r in random.Random(3).sample(made, len(made)):
        (by_hand if r in made[:3] else jobs.save)(r)
    return made[::-1]


def looks(cli_here, newest: records.JobRecord) -> list[str]:
    """What a person sees: the lists, the newest job's status, a job's status by a prefix of its time."""
    commands = (["list"], ["list", "--limit", "7"], ["status"], ["status", newest.id.split("_")[1][:15]])
    results = [cli_here("jobs", *args, prog="nemotron") for args in commands]
    assert all(r.rc == 0 for r in results), [r.out + r.err for r in results]
    return [r.out + r.err for r in results]


def listed(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:]]


def garble(index: Path) -> None:
    index.write_bytes(b"\x00garbage\tline\n" + index.read_bytes()[:-9])


def older_record_added(home: Path, index: Path) -> None:
    by_hand(local_job(home, 99, BASE - 3600))


@pytest.mark.parametrize("change", [None, Path.unlink, garble, "older_record_added"])
def test_list_and_status_show_through_the_index_what_every_record_shows(registry, cli_here, home, change):
    first = looks(cli_here, registry[0])  # the first look builds the index
    index = record_index.path(records.registry_dir())
    assert listed(first[0]) == [r.id for r in registry[:20]] and listed(first[1]) == [r.id for r in registry[:7]]
    assert f"(the newest job: {registry[0].id})" in first[2] and f"job:       {registry[0].id}" in first[3]

    if change == "older_record_added":
        older_record_added(home, index)
    elif change:
        change(index)

    assert looks(cli_here, registry[0]) == first
    assert record_index.read(records.registry_dir()) is not None  # rebuilt where it was missing, garbled or stale


def test_a_saved_job_is_appended_and_found_by_its_scheduler_id(registry, home):
    jobs.newest(1)  # builds the index
    index = record_index.path(records.registry_dir())
    before = index.read_bytes()
    slurm = dataclasses.replace(local_job(home, 50, time.time()), executor="slurm", handle={"slurm_id": "4242"})

    jobs.save(slurm)

    assert index.read_bytes().startswith(before) and index.read_bytes().count(b"\n") == before.count(b"\n") + 1
    assert jobs.find("4242").id == slurm.id and jobs.newest(2) == [slurm, registry[0]]
    with pytest.raises(records.UserError, match="matches 26 jobs"):
        jobs.find("20261128-0000")


def test_a_record_damaged_in_place_is_read_only_when_shown(registry, cli_here):
    jobs.newest(1)
    old = records.registry_dir() / f"{registry[-1].id}.json"
    with open(old, "r+") as f:  # in place: the folder does not change
        f.write("x")

    listed_now, found = cli_here("jobs", "list", prog="nemotron"), cli_here("jobs", "status", registry[-1].id,
                                                                            prog="nemotron")

    assert listed_now.rc == 0 and listed_now.err == "" and listed(listed_now.out) == [r.id for r in registry[:20]]
    assert found.rc == 2 and found.err_lines[0].startswith(f"warning: {old}: skipped, a damaged job record: not JSON")


def test_a_damaged_record_is_named_at_every_look_and_taken_once_repaired(registry, cli_here):
    newest = records.registry_dir() / f"{registry[0].id}.json"
    good = newest.read_text()
    newest.write_text("[]")

    looks_ = [cli_here("jobs", "list", prog="nemotron") for _ in range(2)]
    with open(newest, "r+") as f:  # repaired in place
        f.write(good)
    repaired = cli_here("jobs", "list", prog="nemotron")

    warning = f"warning: {newest}: skipped, a damaged job record: a JSON list, not an object; fix or remove it"
    assert all(r.err_lines == [warning] and listed(r.out)[0] == registry[1].id for r in looks_)
    assert repaired.err == "" and listed(repaired.out)[0] == registry[0].id
