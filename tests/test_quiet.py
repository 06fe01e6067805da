"""Third-party noise stays out of a job's log unless `ultra3 -v` asks for it (recipes/quiet.py): the real commands
with and without -v (Megatron-Core's and ModelOpt's warnings, transformers' log lines, tqdm's bars and
ModelOpt's prints on `quantize -c tiny`; Ray's start-up INFO on a two-node Slurm job), the option's way into
the job's environment, and the filters themselves: our own warnings and every library's errors still show."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from test_data_prep_slurm import finish, submit

# what each library writes into `ultra3 quantize -c tiny`'s log, one line of each kind
QUANTIZE_NOISE = {
    "Megatron-Core's warnings": "UserWarning: Transformer Engine and Apex are not installed",
    "transformers' log lines": "[transformers] `causal_conv1d_fn` is falling back",
    "tqdm's progress bars": "MSE weight calibration: 0it",
    "transformers' progress bars (huggingface_hub's tqdm)": "Loading weights:   0%",
    "ModelOpt's prints": "Inserted 187 quantizers",
    "ModelOpt's recipe loader": "[load_recipe] loading:",
}
RAY_NOISE = ("SUCC scripts.py", "Ray runtime started.", "INFO scripts.py", "INFO node.py")
TWO_NODES = '\n[two-nodes]\nextends = "ci-cpu"\npartition = "multi"\n'


def noise_in(text: str, kinds: dict[str, str]) -> list[str]:
    return [kind for kind, line in kinds.items() if line in text]


# -- the option ------------------------------------------------------------------------------------------------
def test_help_names_the_option(cli):
    for argv in (["--help"], ["quantize", "--help"], ["pipe", "--help"]):
        r = cli(*argv)
        assert r.rc == 0 and "-v, --verbose" in r.out, r.out


@pytest.mark.parametrize("where", ["before", "after"])
def test_v_reaches_the_jobs_environment(cli, where):
    """Before or after the stage name, -v sets the job's VERBOSE_VAR (in its sbatch script); without it, nothing."""
    stage = ["data", "prep", "pretrain", "-c", "tiny", "--batch", "ci-cpu", "--dry-run", "--full"]
    verbose = cli(*(["-v", *stage] if where == "before" else [*stage, "-v"]))
    quiet = cli(*stage)
    assert verbose.rc == quiet.rc == 0, verbose.err + quiet.err
    assert "export ULTRA3_VERBOSE=1" in verbose.out and "run.env.ULTRA3_VERBOSE = '1'  <- -v" in verbose.out
    assert "ULTRA3_VERBOSE" not in quiet.out


def test_v_reaches_every_step_of_a_pipe(cli):
    pipe = ["pipe", "-c", "tiny", "--batch", "ci", "--dry-run", "--full"]
    verbose, quiet = cli("-v", *pipe), cli(*pipe)
    assert verbose.rc == quiet.rc == 0, verbose.err + quiet.err
    assert verbose.out.count("export ULTRA3_VERBOSE=1") == 7 and "ULTRA3_VERBOSE" not in quiet.out


# -- the filters, in a real runtime process ------------------------------------------------------------------------
FILTERED = """
import logging, sys, warnings
from recipes import quiet
quiet.install()
logging.basicConfig(format="%(name)s %(levelname)s %(message)s")
logging.getLogger("transformers.modeling_utils").warning("library warning record")
logging.getLogger("transformers.modeling_utils").error("library error record")
exec(compile("import warnings; warnings.warn('library UserWarning')", "megatron/core/x.py", "exec"),
     {"__name__": "megatron.core.x"})
warnings.warn("our own UserWarning")
logging.getLogger("recipes.quantize").warning("our own warning record")
with quiet.prints():
    print("library print")
print("our own print")
import os
print("TQDM_DISABLE", os.environ.get("TQDM_DISABLE"))
with quiet.prints():
    raise RuntimeError("library error")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_filters_leave_our_lines_and_their_errors(verbose):
    env = {**os.environ, "ULTRA3_VERBOSE": "1" if verbose else "0", "PYTHONWARNINGS": ""}
    env.pop("TQDM_DISABLE", None)
    p = subprocess.run([sys.executable, "-c", FILTERED], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=60)
    out = p.stdout + p.stderr
    for line in ("library error record", "our own UserWarning", "our own warning record", "our own print",
                 "RuntimeError: library error"):
        assert line in out, out
    assert p.returncode == 1, out
    noise = ("library warning record", "library UserWarning", "library print")
    assert all((line in out) == verbose for line in noise), out
    assert f"TQDM_DISABLE {None if verbose else 1}" in out, out


# -- the real commands -----------------------------------------------------------------------------------------
@pytest.mark.heavy
def test_quantize_log_holds_no_third_party_noise_unless_v(cli):
    pytest.importorskip("modelopt.torch.quantization")
    quiet, verbose = cli("quantize", "-c", "tiny", timeout=600), cli("-v", "quantize", "-c", "tiny", timeout=600)
    assert quiet.rc == verbose.rc == 0, quiet.err[-3000:] + verbose.err[-3000:]
    assert noise_in(quiet.out + quiet.err, QUANTIZE_NOISE) == [], quiet.out[-6000:]
    assert "\r" not in quiet.out + quiet.err
    assert noise_in(verbose.out + verbose.err, QUANTIZE_NOISE) == list(QUANTIZE_NOISE), verbose.out[-6000:]
    job = verbose.out.split()[1]
    log = cli("jobs", "logs", job, prog="nemotron").out  # the job's log file says the same
    assert noise_in(log, QUANTIZE_NOISE) == list(QUANTIZE_NOISE), log[-6000:]
    # our own lines, the same either way
    ours = [line for line in quiet.out.splitlines() if line.startswith("ultra3 quantize: accuracy")]
    assert ours and ours[0] in verbose.out


@pytest.mark.slurm
def test_two_node_ray_log_holds_no_ray_start_up_info_unless_v(slurm, cli):
    with open("env.toml", "a") as f:
        f.write(TWO_NODES)
    stage = ("data", "prep", "pretrain", "-c", "tiny", "--batch", "two-nodes", "run.nodes=2")
    quiet, verbose = submit(cli, *stage), submit(cli, "-v", *stage)
    _, quiet_log = finish(cli, quiet[0])
    _, verbose_log = finish(cli, verbose[0])
    assert "ray cluster up: 2 nodes" in quiet_log and "ray cluster up: 2 nodes" in verbose_log
    assert [n for n in RAY_NOISE if n in quiet_log] == [], quiet_log[-6000:]
    assert [n for n in RAY_NOISE if n in verbose_log] == list(RAY_NOISE), verbose_log[-6000:]
