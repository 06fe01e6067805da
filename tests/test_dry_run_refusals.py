"""What a job would refuse, the dry run refuses first, through the CLI's own entry point: a dataset name that is
no directory name, a tokenizer that is no tokenizer, an output_dir that is a file or not writable, a quantize
checkpoint missing on this machine, an empty config file, `pipe --batch` on a profile that cannot chain jobs, a
job name prefix that would make the job's log file names too long. Each is exit 2 and one line naming the key,
where its value came from and the fix, with --dry-run and without it: no job dir, no job record, no submission."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import our_jobs, wait_for

from ultra3.forms import JOB_NAME_PREFIX_MAX
from ultra3.stages import STAGES

CORPUS = "recipes/samples/tiny/corpus.jsonl.gz"
DATA_PREP = ("data", "prep", "pretrain", "-c", "tiny")


def refused(r, key: str, *parts: str) -> None:
    """Exit 2, no traceback, and one error line: `error: <key>: ...` holding each of `parts`, in order."""
    assert r.rc == 2, f"rc {r.rc}\n{r.out}\n{r.err}"
    errors = [line for line in r.err_lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}: "), r.err
    assert re.search(".*".join(map(re.escape, parts)), errors[0]), errors[0]
    assert "Traceback" not in r.out + r.err


def nothing_written(home: Path) -> None:
    assert not home.exists() or not any(home.iterdir()), f"written under NEMOTRON_HOME: {list(home.rglob('*'))}"


FIX_TOKENIZER = "give a tokenizer.json, a directory holding one, or a hub model id org/name"
# id -> (arguments, key, parts of the line in order); {tmp}: the test's own dir, {ro}: a read-only one
CASES = {
    "dataset-name": ((*DATA_PREP, f"datasets=[{{{{name: '../', path: {CORPUS}}}}}]"), "datasets[0].name",
                     "'../' (set in command line) names the dataset's output directory", "e.g. name: "),
    "tokenizer-a-file": ((*DATA_PREP, "tokenizer=/etc/passwd"), "tokenizer",
                         "/etc/passwd is not a tokenizer.json", "(set in command line)", FIX_TOKENIZER),
    "tokenizer-a-dir": ((*DATA_PREP, "tokenizer={tmp}/no-tokenizer"), "tokenizer",
                        "is a directory without a tokenizer.json", "(set in command line)", FIX_TOKENIZER),
    "tokenizer-no-such": ((*DATA_PREP, "tokenizer=no such tokenizer"), "tokenizer",
                          "does not exist and is not a hub model id", "(set in command line)", FIX_TOKENIZER),
    "output_dir-a-file": ((*DATA_PREP, "output_dir={tmp}/a-file/out"), "output_dir",
                          "{tmp}/a-file is a file, not a directory", "(set in command line)",
                          "choose a directory the job can write"),
    "output_dir-read-only": ((*DATA_PREP, "output_dir={ro}/out"), "output_dir",
                             "{ro} is not writable on this machine", "(set in command line)"),
    "sft-output_dir-a-file": (("data", "prep", "sft", "-c", "tiny", "output_dir={tmp}/a-file"), "output_dir",
                              "is a file, not a directory", "(set in command line)"),
    "quantize-output_dir-a-file": (("quantize", "-c", "tiny", "output_dir={tmp}/a-file"), "output_dir",
                                   "is a file, not a directory", "(set in command line)"),
    "quantize-checkpoint": (("quantize", "-c", "tiny", "make_checkpoint=false", "bf16_checkpoint=./no/such/ckpt"),
                            "bf16_checkpoint", "./no/such/ckpt does not exist on this machine",
                            "(set in command line)", "fix the path"),
    "empty-config": (("pretrain", "-c", "{tmp}/empty.yaml"), "--config {tmp}/empty.yaml",
                     "{tmp}/empty.yaml is empty", "`defaults: [default]`"),
    "pipe-batch-local": (("pipe", "-c", "tiny", "--batch", "workstation"), "--batch workstation",
                         "the local executor cannot chain jobs", "run the pipe with --run workstation"),
}


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("case", CASES)
def test_a_local_job_the_runtime_would_refuse_is_refused_before_anything_is_written(cli_here, home, tmp_path, case,
                                                                                    dry_run, request):
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "no-tokenizer").mkdir()
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    ro = request.getfixturevalue("read_only") if case == "output_dir-read-only" else None
    args, key, *parts = (tuple(a.format(tmp=tmp_path, ro=ro) for a in part) if isinstance(part, tuple)
                         else part.format(tmp=tmp_path, ro=ro) for part in CASES[case])
    r = cli_here(*args, *(["--dry-run"] if dry_run else []))
    refused(r, key, *parts)
    nothing_written(home)


def test_a_slurm_profile_is_warned_of_a_path_this_machine_lacks_and_refused_a_bad_name(cli_here, home, tmp_path):
    """What another machine may hold is a warning for a cluster; a dataset name is wrong anywhere."""
    r = cli_here(*DATA_PREP, "--batch", "ci", "--dry-run", "tokenizer=/lustre/tokenizers/ultra")
    assert r.rc == 0 and "warning: tokenizer: /lustre/tokenizers/ultra does not exist and is not a hub model id " \
                         "org/name on this machine (set in command line); fine if the cluster mounts it" in r.out, r.out
    r = cli_here(*DATA_PREP, "--batch", "ci", "--dry-run", f"datasets=[{{name: 'a b', path: {CORPUS}}}]")
    refused(r, "datasets[0].name", "'a b' (set in command line)", "e.g. name: a-b")


def test_good_tokenizers_pass(cli_here, home):
    for tokenizer in ("recipes/samples/tiny", "recipes/samples/tiny/tokenizer.json", "nvidia/some-model@main"):
        r = cli_here(*DATA_PREP, "--dry-run", f"tokenizer={tokenizer}")
        assert r.rc == 0 and "tokenizer" not in "".join(r.err_lines), r.err


LONGEST_TASK = max(len("-".join(s.words)) for s in STAGES)


def test_a_job_name_prefix_past_the_bound_is_refused_by_the_dry_run(cli_here, home):
    # log-<prefix><task>_<job id, 10 digits>_<restart count, 4>.out fits the 255 bytes of a file name
    assert len(f"log-{'x' * JOB_NAME_PREFIX_MAX}{'t' * LONGEST_TASK}_{'9' * 10}_{'9' * 4}.out") <= 255
    prefix = "p" * (JOB_NAME_PREFIX_MAX + 1)
    r = cli_here(*DATA_PREP, "--batch", "ci", "--dry-run", f"run.job_name_prefix={prefix}")
    refused(r, "run.job_name_prefix", f"{JOB_NAME_PREFIX_MAX} characters at most", "(set in command line)")
    nothing_written(home)


@pytest.mark.slurm
def test_the_longest_job_name_prefix_runs_with_its_log_and_one_more_is_not_submitted(slurm, cli, home, tmp_path):
    """On the real cluster: a 300-character prefix made a job that failed without a log (Slurm could not open a
    log file named after it); one of the bound on the longest task name completes, with its logs."""
    prefix = "p" * JOB_NAME_PREFIX_MAX
    r = cli(*DATA_PREP, "--run", "ci-cpu", f"run.job_name_prefix={prefix}")
    assert r.rc == 0 and r.out.rstrip().endswith("COMPLETED"), f"{r.out}\n{r.err}"
    job_dir = Path(re.search(r"^job dir: (.+)$", r.err + r.out, re.M).group(1))
    name = f"{prefix}data-prep-pretrain"
    logs = {re.sub(r"_\d+(_\d+)?\.out$", "", p.name) for p in (job_dir / "data-prep-pretrain").glob("*.out")}
    assert logs == {f"log-{name}", f"sbatch_{name}"}, logs
    assert wait_for(lambda: not our_jobs(tmp_path))  # the attached run returns at the script's end, Slurm ends it after
    written = sorted(home.rglob("*"))
    r = cli(*DATA_PREP, "--batch", "ci-cpu", f"run.job_name_prefix={prefix}p")
    refused(r, "run.job_name_prefix", f"{JOB_NAME_PREFIX_MAX} characters at most")
    assert sorted(home.rglob("*")) == written and not our_jobs(tmp_path)
