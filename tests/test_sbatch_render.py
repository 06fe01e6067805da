"""Our dry-run rendering of the sbatch script equals NeMo-Run's own, for the shapes our profiles produce
(container or not, env, setup lines, Slurm extras, multi-node, dependencies). Real NeMo-Run, no cluster needed."""

from __future__ import annotations

import os

import pytest

from ultra3.compile import compile_job
from ultra3.job import Options
from ultra3.paths import JOB_DIR_PLACEHOLDER
from ultra3.jobprep.plan import slurm_spec
from ultra3.executors.sbatch import render_sbatch
from ultra3.executors.nemo_run_slurm import nemo_run_script
from ultra3.stages import STAGES

pytestmark = pytest.mark.heavy  # Ray, torch, NeMo-Run or real jobs: not in the fast tier

EXTRA_PROFILES = """
[extras]
extends = "blackwell"
qos = "high"
reservation = "res1"
constraint = "gpu180g"
cpus_per_task = 64
mem = "0"
setup = ["module load cuda", "echo 'setup done'"]
[extras.env]
ODD = "a b$c;d"

[plain]
extends = "ci"
container_image = ""
"""

STAGE = {s.name: s for s in STAGES}
CASES = [  # stage, config, profile, overrides, the Slurm ids the job waits for
    ("pretrain", "tiny", "ci", [], ()),
    ("pretrain", "default", "blackwell", ["dataset.blend_path=/lustre/data/blend.json",
                                          "phase2.blend_path=/lustre/data/phase2/blend.json"], ()),
    ("sft", "tiny", "extras", ["run.time=01:00:00", "recipe.pretrained_checkpoint=/lustre/ckpt"], ()),
    ("data prep pretrain", "tiny", "ci-cpu", [], ()),
    ("sft", "default", "extras", ["run.nodes=48", "model.pipeline_model_parallel_size=6", "dataset.mock=true",
                                  "recipe.pretrained_checkpoint=/lustre/ckpt"], ()),
    ("pretrain", "tiny", "ci", [], ("101",)),
    ("pretrain", "default", "blackwell", ["dataset.blend_path=/lustre/data/blend.json",
                                          "phase2.blend_path=/lustre/data/phase2/blend.json"], ("101", "102")),
]


@pytest.mark.parametrize("stage,config,profile,overrides,after", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}{'-after' if c[4] else ''}" for c in CASES])
def test_dry_run_script_is_what_nemo_run_renders(home, stage, config, profile, overrides, after, tmp_path,
                                                 monkeypatch):
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # NeMo-Run's packager (invoke) reads stdin
    env_file = tmp_path / "work" / "env.toml"
    env_file.write_text(env_file.read_text() + EXTRA_PROFILES)
    job = compile_job(STAGE[stage], Options(config=config, batch=profile, overrides=overrides))
    job_id = f"{job.stage.slug}_test-{profile}"
    ours = render_sbatch(slurm_spec(job, job_dir=JOB_DIR_PLACEHOLDER), after)
    theirs = nemo_run_script(job, job_id, after)
    from nemo_run.config import get_nemorun_home

    theirs = theirs.replace(f"{get_nemorun_home()}/experiments/{job.stage.slug}/{job_id}", JOB_DIR_PLACEHOLDER)
    assert JOB_DIR_PLACEHOLDER in theirs
    assert ours.rstrip("\n") == theirs.rstrip("\n")
    assert f"--job-name=ultra3.{'-'.join(stage.split())}" in ours
    assert ("#SBATCH --kill-on-invalid-dep=yes" in ours) == bool(after)
