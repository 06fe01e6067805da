"""Jobs on the real local Slurm cluster (scripts/slurm-local/start.sh), through the real CLI: detached and
attached submission, `nemotron jobs list|status|logs|cancel` from later shells, a burst of submissions,
the job-dir fallback when accounting forgets a job, the dry run against what NeMo-Run submitted, and
shell metacharacters. No mocks: every job really runs, and on this CPU-only machine a `pretrain -c tiny`
job really fails in its preflight.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import BIN, squeue_ids, wait_for

pytestmark = pytest.mark.slurm

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}
PREFLIGHT = re.compile(r"PREFLIGHT FAILED on \S+: .*not importable: megatron\.bridge")
SUBMITTED = re.compile(r"^submitted (\S+) \(Slurm job (\d+)\)$", re.M)
JOB_DIR = re.compile(r"^job dir: (.+)$", re.M)
STATE = re.compile(r"^state:\s+(\S+)(?: \((upstream [^)]*)\))?(?: \(exit code (-?\d+)\))?(?: \[(.+)\])?$", re.M)
REASON = re.compile(r"^reason:\s+(.*)$", re.M)
DRY_SBATCH = "== sbatch script (as NeMo-Run submits it) ==\n"
DRY_END = "\nDry run: nothing was written or submitted.\n"
PLACEHOLDER = "@JOB_DIR@"

_submitted: list[str] = []  # Slurm ids submitted by the running test, cancelled if still queued at its end


@pytest.fixture(autouse=True)
def _cancel_leftovers():
    _submitted.clear()
    yield
    left = sorted(set(_submitted) & squeue_ids()) if _submitted else []
    if left:
        subprocess.run(["scancel", *left], capture_output=True)


# -- helpers -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Submitted:
    id: str
    slurm_id: str
    job_dir: Path
    out: str
    err: str
    seconds: float

    @property
    def task_dir(self) -> Path:
        return self.job_dir / "pretrain"


def toml_value(value) -> str:
    return json.dumps(value)  # strings, integers, booleans and lists of them: JSON is valid TOML here


def add_profile(name: str, base: str = "ci", env: dict[str, str] | None = None, **keys) -> str:
    """Append a profile to the env.toml of the test's working directory (the `home` fixture's cwd)."""
    lines = [f"\n[{name}]", f'extends = "{base}"']
    lines += [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    if env:
        lines.append(f"[{name}.env]")
        lines += [f"{k} = {toml_value(v)}" for k, v in env.items()]
    with open("env.toml", "a") as f:
        f.write("\n".join(lines) + "\n")
    return name


def submit(cli, *args: str, env: dict | None = None) -> Submitted:
    """`ultra3 pretrain -c tiny <args>` that must submit and return (detached)."""
    start = time.time()
    r = cli("pretrain", "-c", "tiny", *args, env=env)
    seconds = time.time() - start
    m = SUBMITTED.search(r.out)
    assert r.rc == 0 and m, f"submission failed (rc {r.rc})\nstdout:\n{r.out}\nstderr:\n{r.err}"
    _submitted.append(m.group(2))
    return Submitted(m.group(1), m.group(2), Path(JOB_DIR.search(r.out).group(1)), r.out, r.err, seconds)


def jobs(cli, *args: str, env: dict | None = None):
    return cli("jobs", *args, prog="nemotron", env=env)


def status(cli, ref: str, env: dict | None = None) -> dict:
    r = jobs(cli, "status", ref, env=env)
    assert r.rc == 0, f"jobs status {ref}: rc {r.rc}\n{r.out}{r.err}"
    m = STATE.search(r.out)
    assert m, r.out
    reason = REASON.search(r.out)
    return {"state": m.group(1), "upstream": m.group(2) or "", "exit_code": int(m.group(3)) if m.group(3) else None,
            "source": m.group(4), "reason": reason.group(1) if reason else "", "text": r.out}


def wait_state(cli, ref: str, *wanted: str, timeout: float = 120) -> dict:
    """Poll `nemotron jobs status` (a new process each time, like a later shell) until one of `wanted`."""
    seen: list[dict] = []

    def reached():
        seen.append(status(cli, ref))
        return seen[-1]["state"] in wanted

    assert wait_for(reached, timeout=timeout), f"{ref} never reached {wanted}; last status:\n{seen[-1]['text']}"
    return seen[-1]


def sacct_states(slurm_ids: list[str]) -> dict[str, str]:
    out = subprocess.run(["sacct", "--parsable2", "--noheader", "-X", "-j", ",".join(slurm_ids),
                          "--format=JobID,State"], capture_output=True, text=True).stdout
    rows = (line.split("|")[:2] for line in out.splitlines() if "|" in line)
    return {jid: st.split()[0].rstrip("+") for jid, st in rows}  # "CANCELLED by 0" -> CANCELLED


def list_rows(cli, *args: str, env: dict | None = None) -> dict[str, dict]:
    r = jobs(cli, "list", *args, env=env)
    assert r.rc == 0, r.err
    if r.out.startswith("no jobs yet"):
        return {}
    lines = r.out.splitlines()
    header = lines[0].split()
    assert header == ["JOB", "STAGE", "CONFIG", "WHERE", "SLURM", "STATE", "AGE"], r.out
    return {row[0]: dict(zip(header, row)) for row in (line.split() for line in lines[1:])}


def dry_run_script(cli, *args: str) -> str:
    r = cli("pretrain", "-c", "tiny", *args, "--dry-run", "--full")
    assert r.rc == 0, r.err
    assert DRY_SBATCH in r.out and r.out.endswith(DRY_END), r.out
    return r.out.split(DRY_SBATCH, 1)[1][: -len(DRY_END)]


def same_script(dry: str, submitted: str) -> None:
    """Exactly equal, but for one trailing newline."""
    dry, submitted = dry.removesuffix("\n"), submitted.removesuffix("\n")
    if dry != submitted:  # a readable diff
        import difflib

        diff = "\n".join(difflib.unified_diff(dry.splitlines(), submitted.splitlines(), "dry run", "submitted",
                                              lineterm=""))
        pytest.fail(f"the dry run's sbatch script differs from what NeMo-Run submitted:\n{diff}")


# -- detached, then a later shell ----------------------------------------------------------------

def test_detached_submit_then_status_logs_list_from_a_later_shell(slurm, cli, home):
    sub = submit(cli, "--batch", "ci")

    assert sub.seconds < 30, f"a detached submission took {sub.seconds:.0f}s"
    assert re.fullmatch(r"ultra3-pretrain_\d{8}-\d{6}-[0-9a-f]{6}", sub.id), sub.id
    nexts = [line.strip() for line in sub.out.split("next:", 1)[1].splitlines() if line.strip()]
    assert [re.sub(r" --follow", "", n) for n in nexts] == [f"nemotron jobs {verb} {sub.id}"
                                                          for verb in ("status", "logs", "cancel")], sub.out

    # the job dir: resolved config, the runtime recipes, the provenance manifest
    code = sub.task_dir / "code"
    config = yaml.safe_load((code / "config.yaml").read_text())
    assert "${" not in (code / "config.yaml").read_text(), "config.yaml still holds interpolations"
    assert config["job"]["id"] == sub.id and config["job"]["dir"] == str(sub.job_dir)
    assert config["checkpoint"]["save"] == f"{sub.job_dir}/checkpoints"
    assert config["run"]["account"] == "ultra3" and config["run"]["partition"] == "debug"
    recipes = {p.name for p in (code / "recipes").glob("*.py")}
    assert {"launch.py", "preflight.py", "pretrain.py"} <= recipes, recipes
    manifest = json.loads((code / "manifest.json").read_text())
    assert manifest["job_id"] == sub.id and manifest["profile"] == "ci" and manifest["mode"] == "detached"
    assert manifest["argv"][1:] == ["pretrain", "-c", "tiny", "--batch", "ci"], manifest["argv"]
    assert re.fullmatch(r"[0-9a-f]{40}", manifest["git"]["commit"]), manifest["git"]
    assert isinstance(manifest["git"]["dirty"], bool) and isinstance(manifest["git"]["diff"], str)
    assert manifest["git"]["dirty"] == bool(manifest["git"]["diff"].strip())
    assert manifest["packages"]["nemo_run"] == "0.11.1" and manifest["packages"]["ultra3-launcher"]

    # a later shell: status reaches FAILED with the preflight's reason
    st = wait_state(cli, sub.id, *TERMINAL)
    assert (st["state"], st["exit_code"]) == ("FAILED", 3), st["text"]
    assert PREFLIGHT.match(st["reason"]), st["text"]
    assert f"slurm id:  {sub.slurm_id}" in st["text"]

    logs = jobs(cli, "logs", sub.id)
    assert logs.rc == 0 and PREFLIGHT.search(logs.out), logs.out + logs.err

    rows = wait_for(lambda: (r := list_rows(cli)) and r.get(sub.id, {}).get("STATE") == "FAILED" and r, timeout=30)
    assert rows, list_rows(cli)
    assert rows[sub.id] | {"AGE": None} == {"JOB": sub.id, "STAGE": "pretrain", "CONFIG": "tiny", "WHERE": "ci",
                                          "SLURM": sub.slurm_id, "STATE": "FAILED", "AGE": None}

    # the Slurm id and unique prefixes of the job id name the same job
    for ref in (sub.slurm_id, sub.id[:-2], sub.id.split("_", 1)[1][:15]):
        by_ref = status(cli, ref)
        assert by_ref["text"].splitlines()[0] == f"job:       {sub.id}", (ref, by_ref["text"])
        assert by_ref["state"] == "FAILED"
    missing = jobs(cli, "status", "no-such-job")
    assert missing.rc == 2 and "no job 'no-such-job'" in missing.err


# -- attached ------------------------------------------------------------------------------------

def test_attached_failure_streams_the_log_and_reports_the_preflight_reason(slurm, cli, home):
    r = cli("pretrain", "-c", "tiny", "--run", "ci")

    assert r.rc == 1, f"rc {r.rc}\n{r.out}\n{r.err}"
    m = SUBMITTED.search(r.out)
    assert m, r.out
    _submitted.append(m.group(2))
    job_id = m.group(1)
    assert PREFLIGHT.search(r.out.split(JOB_DIR.search(r.out).group(0), 1)[1]), r.out  # streamed after submit
    assert re.search(rf"^error: {re.escape(job_id)} FAILED \(exit code 3\): PREFLIGHT FAILED on \S+: ", r.err,
                     re.M), r.err
    assert r.err.count("PREFLIGHT FAILED") == 1 and "--- last log lines ---" not in r.err, r.err  # said once
    assert status(cli, job_id)["state"] == "FAILED"


# -- a job that completes ------------------------------------------------------------------------

def test_a_job_that_completes(slurm, cli, home):
    """The profile's setup ends the batch script successfully: a real COMPLETED job on a CPU-only
    cluster, through the same submission and follow path as a training job."""
    add_profile("ends-in-setup", setup=["echo setup done", "exit 0"])

    r = cli("pretrain", "-c", "tiny", "--run", "ends-in-setup")

    m = SUBMITTED.search(r.out)
    assert m, r.out + r.err
    _submitted.append(m.group(2))
    assert r.rc == 0, f"rc {r.rc}\n{r.out}\n{r.err}"
    assert r.out.rstrip().splitlines()[-1] == f"{m.group(1)} COMPLETED", r.out
    st = status(cli, m.group(1))
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0), st["text"]
    assert not st["reason"], st["text"]
    # the attached run returns at the script's end line, seconds before Slurm's accounting says COMPLETED
    assert wait_for(lambda: sacct_states([m.group(2)]) == {m.group(2): "COMPLETED"}), sacct_states([m.group(2)])


# -- cancel --------------------------------------------------------------------------------------

def test_cancel_a_running_job(slurm, cli, home):
    add_profile("slow", setup=["sleep 120"])
    sub = submit(cli, "--batch", "slow")
    wait_state(cli, sub.id, "RUNNING", timeout=60)
    newest = jobs(cli, "status")  # no id: the newest job
    assert newest.rc == 0 and f"job:       {sub.id}\n" in newest.out and sub.id in newest.err, newest.out + newest.err
    quiet = jobs(cli, "logs", sub.id)  # in its setup lines: no log yet, and where to look
    assert quiet.rc == 0 and quiet.out == "" and "(no log yet: the job is RUNNING; the batch script's own output is " \
        f"{sub.task_dir}/sbatch_*_{sub.slurm_id}.out;" in quiet.err, quiet.err

    r = jobs(cli, "cancel", sub.id)
    assert r.rc == 0 and r.out.strip() == f"cancelled {sub.id} (Slurm job {sub.slurm_id})", r.out + r.err

    st = wait_state(cli, sub.id, *TERMINAL, timeout=60)
    assert st["state"] == "CANCELLED", st["text"]
    assert st["exit_code"] is None and st["reason"] == "cancelled (scancel or `nemotron jobs cancel`)", st["text"]
    assert wait_for(lambda: sub.slurm_id not in squeue_ids(), timeout=30), f"{sub.slurm_id} still in squeue"
    assert list_rows(cli)[sub.id]["STATE"] == "CANCELLED"

    again = jobs(cli, "cancel", sub.slurm_id)
    assert again.rc == 0 and again.out.strip() == f"{sub.id} already ended: CANCELLED", again.out + again.err


# -- logs --follow -------------------------------------------------------------------------------

def test_logs_follow_prints_lines_as_they_come_and_returns_when_the_job_ends(slurm, cli, home, tmp_path):
    # The job's Python prints a line a second before the preflight runs: a sitecustomize on the job's
    # PYTHONPATH, set through the profile's env. It starts ticking once the follower runs (the go file), so a
    # slow machine cannot let the ticks pile up before anyone reads them.
    site = tmp_path / "site"
    site.mkdir()
    go = tmp_path / "go"
    (site / "sitecustomize.py").write_text(
        "import os, time\n"
        f"deadline = time.time() + 90\nwhile not os.path.exists({str(go)!r}) and time.time() < deadline:\n"
        "    time.sleep(0.1)\n"
        "for i in range(1, 5):\n    print(f'tick {i}', flush=True)\n    time.sleep(1)\n")
    add_profile("ticking", env={"PYTHONPATH": str(site)}, setup=["sleep 3"])
    sub = submit(cli, "--batch", "ticking")
    wait_state(cli, sub.id, "RUNNING", timeout=60)

    proc = subprocess.Popen([str(BIN / "nemotron"), "jobs", "logs", "--follow", sub.id], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read():
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(2)  # the follower is up and polling before the first tick
    go.touch()
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.time()
    reader.join(timeout=10)

    assert proc.returncode == 0, proc.stderr.read()
    texts = [t for _, t in lines]
    assert texts[:4] == ["tick 1", "tick 2", "tick 3", "tick 4"], texts
    assert PREFLIGHT.match(texts[-1]), texts
    # streamed: the first line came while the job still ran, seconds before the command returned
    assert ended - lines[0][0] > 2.5, [(round(ended - t, 1), s) for t, s in lines]
    assert lines[3][0] - lines[0][0] > 1.5, [(round(t - lines[0][0], 1), s) for t, s in lines]
    assert status(cli, sub.id)["state"] == "FAILED"


# -- a burst of detached submissions -------------------------------------------------------------

BURST = 50


def test_burst_of_50_detached_jobs(slurm, cli, home):
    add_profile("burst", partition="multi")  # both nodes: 8 jobs at a time
    with ThreadPoolExecutor(max_workers=4) as pool:
        subs = list(pool.map(lambda _: submit(cli, "--batch", "burst"), range(BURST)))

    assert len({s.id for s in subs}) == BURST, sorted(s.id for s in subs)
    assert len({s.slurm_id for s in subs}) == BURST, sorted(s.slurm_id for s in subs)
    assert len({s.job_dir for s in subs}) == BURST

    ids = [s.slurm_id for s in subs]
    agreed: dict = {}

    def all_ended_and_agree():
        rows = list_rows(cli, "-n", str(BURST))
        acct = sacct_states(ids)
        agreed.update(rows=rows, acct=acct)
        return all(s.id in rows for s in subs) and all(acct.get(s.slurm_id) in TERMINAL for s in subs) and all(
            rows[s.id]["STATE"] == acct[s.slurm_id] and rows[s.id]["SLURM"] == s.slurm_id for s in subs)

    ok = wait_for(all_ended_and_agree, timeout=400, interval=2)
    rows, acct = agreed["rows"], agreed["acct"]
    assert all(s.id in rows for s in subs), f"missing from jobs list: {[s.id for s in subs if s.id not in rows]}"
    assert ok, "\n".join(f"{s.id} {s.slurm_id}: jobs list {rows.get(s.id, {}).get('STATE')}, "
                         f"sacct {acct.get(s.slurm_id)}" for s in subs)
    assert {acct[s.slurm_id] for s in subs} == {"FAILED"}  # every one stopped in its preflight


# -- the scheduler ends a job -------------------------------------------------------------------

def test_a_job_past_its_time_limit_shows_timeout_and_why_from_a_new_shell(slurm, cli, home):
    add_profile("slow", setup=["sleep 600"])
    sub = submit(cli, "--batch", "slow", "run.time=0:01:00")
    st = wait_state(cli, sub.id, *TERMINAL, timeout=240)
    assert st["state"] == "TIMEOUT" and st["source"] == "sacct", st["text"]
    assert st["reason"].startswith("reached its time limit (run.time)"), st["text"]
    assert sacct_states([sub.slurm_id]) == {sub.slurm_id: "TIMEOUT"}


def test_a_node_failure_requeues_the_job_and_every_shell_says_so(slurm, cli, home):
    add_profile("two", partition="multi", setup=["sleep 600"])
    sub = submit(cli, "--batch", "two", "run.nodes=2")
    wait_state(cli, sub.id, "RUNNING", timeout=120)
    down = subprocess.run(["scontrol", "update", "nodename=localhost2", "state=down", "reason=simulated failure"],
                          capture_output=True, text=True)
    try:
        assert down.returncode == 0, down.stderr
        st = wait_state(cli, sub.id, "PENDING", timeout=60)  # --requeue: Slurm puts it back in the queue
        assert st["reason"].startswith("requeued by Slurm after NODE_FAIL (attempt 2)"), st["text"]
        assert st["source"] == "sacct", st["text"]
        listed = list_rows(cli, "-n", "5")[sub.id]
        assert listed["STATE"] == "PENDING", listed
    finally:
        subprocess.run(["scontrol", "update", "nodename=localhost2", "state=resume"], capture_output=True)
    assert jobs(cli, "cancel", sub.id).rc == 0
    st = wait_state(cli, sub.id, "CANCELLED", timeout=60)
    assert "requeued by Slurm after NODE_FAIL" in st["reason"], st["text"]


def test_when_slurm_cannot_answer_the_state_says_why(slurm, cli, home):
    add_profile("slow", setup=["sleep 600"])
    sub = submit(cli, "--batch", "slow")
    wait_state(cli, sub.id, "RUNNING", timeout=120)
    # the real sacct and squeue fail on a broken slurm.conf (an empty one: a missing one makes each retry for 60 s)
    conf = Path(home) / "broken-slurm.conf"
    conf.write_text("")
    st = status(cli, sub.id, env={"SLURM_CONF": str(conf)})
    assert st["state"] == "UNKNOWN", st["text"]
    assert re.fullmatch(r"sacct failed \(exit \d+: .+\); squeue failed \(exit \d+: .+\)", st["reason"]), st["text"]
    assert "broken-slurm.conf" in st["reason"], st["text"]
    assert status(cli, sub.id)["state"] == "RUNNING"  # and with Slurm reachable again


# -- the job-dir fallback ------------------------------------------------------------------------

def test_state_from_the_job_dir_when_accounting_forgot_the_job(slurm, cli, home):
    from ultra3 import jobs, records

    sub = submit(cli, "--batch", "ci")
    wait_state(cli, sub.id, *TERMINAL)
    record = jobs.find(sub.id)
    real_out = record.task_dir + f"/sbatch_ultra3.pretrain_{sub.slurm_id}.out"
    assert "job exited with code 3" in Path(real_out).read_text()

    # the same job under a Slurm id far beyond any real one: sacct and squeue know nothing of it
    lost_id = str(int(sub.slurm_id) + 10_000_000)
    assert sacct_states([lost_id]) == {} and lost_id not in squeue_ids()
    shutil.copy(real_out, real_out.replace(f"_{sub.slurm_id}.out", f"_{lost_id}.out"))
    lost = dataclasses.replace(record, id=f"{record.id}-lost", handle={**record.handle, "slurm_id": lost_id})

    st = jobs.state(lost)
    assert (st.state, st.exit_code, st.source) == ("FAILED", 3, "job dir"), st
    assert PREFLIGHT.match(st.reason), st.reason

    records.save(lost)  # and from a later shell
    shown = status(cli, lost.id)
    assert (shown["state"], shown["exit_code"], shown["source"]) == ("FAILED", 3, "job dir"), shown["text"]
    assert PREFLIGHT.match(shown["reason"]), shown["text"]

    # no accounting and no end marker: UNKNOWN, and says why
    gone = dataclasses.replace(record, id=f"{record.id}-gone",
                               handle={**record.handle, "slurm_id": str(int(lost_id) + 1)})
    st = jobs.state(gone)
    assert st.state == "UNKNOWN" and "neither sacct nor squeue" in st.reason, st


# -- the dry run is what NeMo-Run submits --------------------------------------------------------

@pytest.mark.parametrize("profile", ["ci", "rich", "enroot"])
def test_dry_run_sbatch_script_is_what_nemo_run_submitted(slurm, cli, home, profile, tmp_path):
    if profile == "rich":  # quoting, setup lines, more #SBATCH flags
        add_profile("rich", env={"GREETING": "hello world", "QUOTED": "it's \"quoted\" $HOME"},
                    setup=["echo setting up", f"mkdir -p {tmp_path}/scratch"], cpus_per_task=1, mem="512M",
                    job_name_prefix="ci.")
    if profile == "enroot":  # the image and mounts NeMo-Run writes unquoted: an enroot URI with '#', mount flags
        add_profile("enroot", container_image="nvcr.io#nvidia/nemo:25.09", mounts=["/lustre:/lustre:ro", "/a+b:/c"])
    args = ("--batch", profile, "train.train_iters=5")
    dry = dry_run_script(cli, *args)
    assert PLACEHOLDER in dry

    sub = submit(cli, *args)
    script = (sub.job_dir / "pretrain_sbatch.sh").read_text()
    assert str(sub.job_dir) in script and PLACEHOLDER not in script
    same_script(dry, script.replace(str(sub.job_dir), PLACEHOLDER))
    st = wait_state(cli, sub.id, *TERMINAL)
    assert st["state"] == "FAILED", st["text"]  # and it really ran: to the preflight, or to srun without pyxis
    if profile == "enroot":
        assert " --container-image nvcr.io#nvidia/nemo:25.09 --container-mounts /lustre:/lustre:ro,/a+b:/c," in script
    else:
        assert PREFLIGHT.match(st["reason"]), st["text"]


def _injections(tmp_path, marker: Path) -> dict[str, tuple[list[str], str]]:
    """Where an image or a mount can come from -> (the command's arguments, the key the error names)."""
    bad = f"$(touch {marker})"
    add_profile("bad-image", container_image=f"/x.sqsh{bad}")
    add_profile("bad-mount", container_image="/x.sqsh", mounts=[f"/a:/b{bad}"])
    with open("env.toml", "a") as f:  # names no image: the stage looks up its built one in build_cache_dir
        f.write(f'\n[bad-cache]\nexecutor = "slurm"\naccount = "ultra3"\npartition = "debug"\n'
                f'build_cache_dir = "/tmp/cache{bad}"\n')
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(yaml.safe_dump({"stages": {"pre": {"stage": "pretrain", "config": "tiny",
                                                       "overrides": {"run.container_image": f"/x.sqsh{bad}"}}}}))
    return {
        "command line image": (["pretrain", "-c", "tiny", "--batch", "ci", f"run.container_image=/x.sqsh{bad}"],
                               "run.container_image"),
        "command line mount": (["pretrain", "-c", "tiny", "--batch", "ci", "run.container_image=/x.sqsh",
                                f'run.mounts=["/a:/b{bad}"]'], "run.mounts"),
        "env.toml image": (["pretrain", "-c", "tiny", "--batch", "bad-image"], "env.toml [bad-image] container_image"),
        "env.toml mount": (["pretrain", "-c", "tiny", "--batch", "bad-mount"], "env.toml [bad-mount] mounts"),
        "env.toml build_cache_dir": (["pretrain", "-c", "tiny", "--batch", "bad-cache"], "run.container_image"),
        "pipe config": (["pipe", "-c", str(pipe), "--batch", "ci"], "pre: run.container_image"),
        "pipe step override": (["pipe", "-c", "tiny", "--batch", "ci", f"pretrain.run.container_image=/x.sqsh{bad}"],
                               "pretrain: run.container_image"),
    }


def test_shell_in_container_image_or_mounts_is_refused_before_submission(slurm, cli, home, tmp_path):
    """Values that would run on the compute node through the srun line (NeMo-Run writes it unquoted): refused,
    with one line naming the key and where it was set, and nothing submitted."""
    marker = tmp_path / "pwned"
    for case, (args, key) in _injections(tmp_path, marker).items():
        r = cli(*args)
        m = SUBMITTED.search(r.out) or re.search(r"submitted \S+ \(Slurm job (\d+)", r.out)
        if m:  # a regression: let the job run, so the marker (if any) is there to see
            _submitted.append(m.group(m.lastindex))
            wait_for(lambda: not set(_submitted) & squeue_ids(), timeout=60)
        assert r.rc == 2 and len(r.err_lines) == 1, f"{case}: rc {r.rc}\n{r.out}{r.err}"
        assert r.err_lines[0].startswith(f"error: {key}: "), (case, r.err)
        assert "Traceback" not in r.err and not marker.exists(), case
        assert not list(home.rglob("*_sbatch.sh")), f"{case}: a batch script was written"


def test_a_hanging_sbatch_is_stopped_at_the_scheduler_timeout(cli, home, tmp_path):
    """sbatch that never answers (a controller that accepts and hangs): the submission ends with one line once
    $ULTRA3_SCHEDULER_TIMEOUT has passed, and the sbatch process is killed."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\necho $$ > {tmp_path}/sbatch.pid\nexec sleep 300\n")
    (fake / "sbatch").chmod(0o755)
    env = {"PATH": f"{fake}:{BIN}:{os.environ['PATH']}", "ULTRA3_SCHEDULER_TIMEOUT": "2"}
    start = time.monotonic()
    r = cli("pretrain", "-c", "tiny", "--batch", "ci", env=env, timeout=120)
    seconds = time.monotonic() - start
    assert r.rc == 1 and len(r.err_lines) == 1, f"rc {r.rc}\n{r.out}{r.err}"
    assert r.err_lines[0] == ("error: sbatch did not answer within 2s and was stopped; the job may still have been "
                              "queued: check `squeue --me` ($ULTRA3_SCHEDULER_TIMEOUT sets the bound)"), r.err
    pid = int((tmp_path / "sbatch.pid").read_text())
    assert not Path(f"/proc/{pid}").exists(), "the hanging sbatch was left running"
    print(f"hanging sbatch: the submission ended after {seconds:.1f} s")

    bad = cli("pretrain", "-c", "tiny", "--batch", "ci", "--dry-run", env={"ULTRA3_SCHEDULER_TIMEOUT": "soon"})
    assert bad.rc == 2 and bad.err_lines == ["error: $ULTRA3_SCHEDULER_TIMEOUT: must be a number of seconds from 1 "
                                             "to 86400; unset it for 60"], bad.err


# -- shell metacharacters ------------------------------------------------------------------------

def test_shell_metacharacters_in_overrides_and_profile_env_stay_literal(slurm, cli, home, tmp_path):
    marker = tmp_path / "pwned"
    seen = tmp_path / "seen"
    seen.mkdir()
    values = {
        "logger.wandb_exp_name": f"$(touch {marker}-1)",
        "logger.wandb_project": f"`touch {marker}-2`",
        "logger.wandb_entity": f"a; touch {marker}-3",
        "run.env.OVERRIDDEN": f"$(touch {marker}-4); `touch {marker}-5` && touch {marker}-6",
    }
    env = {"FOO": f"a; touch {marker}-7", "BAR": f"$(touch {marker}-8)", "BAZ": f"`touch {marker}-9`|true",
           "QUOTES": f"'\"; touch {marker}-10; echo \"'"}
    # the setup reads the variables (quoted, as a careful user would) into files, to check what the job got
    add_profile("meta", env=env, setup=[f'printf %s "${k}" > {seen}/{k}' for k in (*env, "OVERRIDDEN")])
    overrides = [f"{k}={yaml.safe_dump(v, default_style=chr(39)).strip()}" for k, v in values.items()]

    sub = submit(cli, "--batch", "meta", *overrides)
    st = wait_state(cli, sub.id, *TERMINAL)
    assert st["state"] == "FAILED" and PREFLIGHT.match(st["reason"]), st["text"]  # it ran past the exports

    assert not list(tmp_path.glob("pwned*")), sorted(p.name for p in tmp_path.glob("pwned*"))
    config = yaml.safe_load((sub.task_dir / "code" / "config.yaml").read_text())
    assert config["logger"]["wandb_exp_name"] == values["logger.wandb_exp_name"]
    assert config["logger"]["wandb_project"] == values["logger.wandb_project"]
    assert config["logger"]["wandb_entity"] == values["logger.wandb_entity"]
    assert config["run"]["env"] == {**env, "OVERRIDDEN": values["run.env.OVERRIDDEN"]}
    got = {p.name: p.read_text() for p in seen.iterdir()}
    assert got == {**env, "OVERRIDDEN": values["run.env.OVERRIDDEN"]}


# -- what a submission imports of NeMo-Run -------------------------------------------------------

OTHER_EXECUTORS = ("lepton", "dgxcloud", "kubeflow", "docker", "skypilot", "skypilot_jobs")


def test_a_batch_submission_imports_only_nemo_runs_slurm_parts(slurm, cli, home):
    sub = submit(cli, "--batch", "ci", env={"PYTHONPROFILEIMPORTTIME": "1"})  # every import, on stderr
    imported = set(re.findall(r"^import time:.*\| *(\S+)$", sub.err, re.M))
    assert {"nemo_run.core.execution.slurm", "nemo_run.core.tunnel.client", "nemo_run.run.experiment"} <= imported
    unwanted = {f"nemo_run.core.execution.{name}" for name in OTHER_EXECUTORS} | {"nemo_run.cli", "leptonai"}
    assert not imported & unwanted, sorted(imported & unwanted)


def test_import_nemo_run_after_a_submission_in_the_same_process(slurm, home):
    script = """
import sys
from ultra3.cli.app import ultra3_main
sys.argv = ["ultra3", "pretrain", "-c", "tiny", "--batch", "ci"]
try:
    ultra3_main()
except SystemExit as e:
    assert not e.code, e.code
import nemo_run
assert nemo_run.LeptonExecutor in nemo_run.Experiment._DETACH_SUPPORTED_EXECUTORS
with nemo_run.Experiment("after", executor=nemo_run.LocalExecutor(), clean_mode=True) as exp:
    exp.add(nemo_run.Script(inline="true"), name="noop")
    exp.dryrun(log=False)
"""
    p = subprocess.run([str(BIN / "python"), "-c", script], capture_output=True, text=True, timeout=300)
    m = SUBMITTED.search(p.stdout)
    if m:
        _submitted.append(m.group(2))
    assert p.returncode == 0 and m, f"rc {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"


# -- the local executor --------------------------------------------------------------------------

@pytest.mark.parametrize("home_name", ["state", "a home with spaces and a quote's"])
def test_local_executor_runs_here_and_fails_in_the_preflight(cli, home, home_name):
    env = {"NEMOTRON_HOME": str(home.parent / home_name)}
    r = cli("pretrain", "-c", "tiny", env=env)

    assert r.rc == 1, f"rc {r.rc}\n{r.out}\n{r.err}"
    m = re.search(r"^submitted (\S+) \(pid \d+\)$", r.out, re.M)
    assert m, r.out
    job_id = m.group(1)
    assert PREFLIGHT.search(r.out), r.out  # the log, streamed
    assert re.search(rf"^error: {re.escape(job_id)} FAILED \(exit code 3\): PREFLIGHT FAILED on \S+: ", r.err,
                     re.M), r.err
    row = list_rows(cli, env=env)[job_id]
    assert (row["WHERE"], row["SLURM"], row["STATE"]) == ("local", "-", "FAILED"), row
    st = status(cli, job_id, env=env)
    assert (st["state"], st["exit_code"]) == ("FAILED", 3) and PREFLIGHT.match(st["reason"]), st["text"]
    logs = jobs(cli, "logs", job_id, env=env)
    assert PREFLIGHT.match(logs.out), logs.out + logs.err


def test_local_job_that_completes(cli, home):
    r = cli("pretrain", "-c", "tiny", 'run.setup=["echo setup done", "exit 0"]')

    assert r.rc == 0, f"rc {r.rc}\n{r.out}\n{r.err}"
    job_id = re.search(r"^submitted (\S+) \(pid \d+\)$", r.out, re.M).group(1)
    assert r.out.rstrip().splitlines()[-1] == f"{job_id} COMPLETED", r.out
    st = status(cli, job_id)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0), st["text"]


def test_cancel_a_running_local_job_from_another_shell(cli, home):
    attached = subprocess.Popen([str(BIN / "ultra3"), "pretrain", "-c", "tiny", 'run.setup=["sleep 120"]'],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rows = wait_for(lambda: [r for r in list_rows(cli).values() if r["STATE"] == "RUNNING"], timeout=60)
        assert rows, list_rows(cli)
        job_id = rows[0]["JOB"]

        r = jobs(cli, "cancel", job_id)
        assert r.rc == 0 and r.out.strip() == f"cancelled {job_id}", r.out + r.err
        out, err = attached.communicate(timeout=60)  # the attached command sees the end too
    finally:
        if attached.poll() is None:
            attached.kill()
            for row in list_rows(cli).values():  # the job has its own session: stop it too
                if row["STATE"] == "RUNNING":
                    jobs(cli, "cancel", row["JOB"])
    st = status(cli, job_id)
    assert st["state"] == "CANCELLED", st["text"]
    assert attached.returncode == 1 and f"error: {job_id} CANCELLED" in err, out + err
    again = jobs(cli, "cancel", job_id)
    assert again.out.strip() == f"{job_id} already ended: CANCELLED", again.out + again.err


def test_a_local_job_that_holds_back_sigterm_is_still_cancelled(cli, home):
    """As a Ray start can: the job ignores SIGTERM; cancel kills it after its grace period and records it."""
    sub = cli("pretrain", "-c", "tiny", "--batch", "workstation", "run.setup=[\"trap '' TERM\", \"sleep 120\"]")
    job_id = re.search(r"^submitted (\S+) ", sub.out, re.M).group(1)
    wait_for(lambda: list_rows(cli).get(job_id, {}).get("STATE") == "RUNNING", timeout=30)
    start = time.time()
    r = jobs(cli, "cancel", job_id)
    assert r.rc == 0 and time.time() - start < 30, r.out + r.err
    st = status(cli, job_id)
    assert st["state"] == "CANCELLED" and st["reason"] == "cancelled (scancel or `nemotron jobs cancel`)", st["text"]


def test_a_job_ended_by_a_signal_says_so(slurm, cli, home):
    add_profile("killed", setup=["kill -9 $$"])
    sub = submit(cli, "--batch", "killed")
    st = wait_state(cli, sub.id, *TERMINAL, timeout=60)
    assert st["state"] == "FAILED" and st["exit_code"] is None and st["reason"] == "ended by signal 9", st["text"]
