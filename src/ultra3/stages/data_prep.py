"""`ultra3 data prep pretrain|sft|rl`: CPUs only, in a pool of processes on one machine, or on Ray (over a Slurm
allocation, or an existing cluster)."""

from __future__ import annotations

from typing import Callable

from ..stage import Flag, Output, Parts, Stage

FLAGS = (
    Flag("sample", int, "Process only the first N records of each dataset, into <output_dir>/sample-N."),
    Flag("force", bool, "Redo everything, even finished shards."),
)
CHECKS = ("python_version", "image", "data_prep_packages", "data_prep_inputs")
# where and how a run works, not what it makes: replacing any other key of the config makes a variant, published
# under a name of its own (artifacts.variant)
SAME_OUTPUT = ("run", "cluster", "output_dir", "sample", "force", "workers", "backend", "hf_cache_dir",
               "progress_interval", "object_store_mb", "cpus_per_task", "encoder", "verify", "strict",
               "max_bad_fraction")


def parts(kind: str) -> Callable[[], Parts]:
    def of_kind() -> Parts:
        from .. import schema
        from ..cost_data_prep import data_prep, data_prep_stop
        from ..validation.data_prep import validate_data_prep
        from ..validation.long_run import check_grace

        kinds = {"pretrain": schema.DATA_PREP_PRETRAIN, "sft": schema.DATA_PREP_SFT, "rl": schema.DATA_PREP_RL}

        def validate(cfg: dict, report) -> None:
            validate_data_prep(cfg, report)
            check_grace(cfg, report, *data_prep_stop(cfg))  # run.grace_s against the time limit and the stop time

        # every kind keeps its finished tasks (receipts) and stops at the time-limit signal (recipes/dataprep/stop.py)
        return Parts(kinds[kind], validate, data_prep, stop_time=data_prep_stop)

    return of_kind


def _data_prep(kind: str, summary: str, output: Output, examples: tuple[str, ...]) -> Stage:
    return Stage(("data", "prep", kind), summary, f"data_prep/{kind}", f"data_prep_{kind}", "ray", CHECKS,
                 parts(kind), examples=examples, flags=FLAGS, outputs=(output,), image="data",
                 same_output=SAME_OUTPUT)


PRETRAIN = _data_prep("pretrain", "Tokenize pretraining corpora into Megatron bin/idx shards (processes; Ray "
                      "across nodes).",
                      Output("pretrain-data", "output_dir", "blend.json"),
                      ("ultra3 data prep pretrain -c tiny", "ultra3 data prep pretrain -c tiny --sample 100",
                       "ultra3 data prep pretrain --batch mycluster output_dir=/lustre/data/phase1"))
SFT = _data_prep("sft", "Render, mask and pack SFT conversations into Parquet (processes; Ray across "
                 "nodes).",
                 Output("sft-data", "output_dir"),
                 ("ultra3 data prep sft -c tiny", "ultra3 data prep sft -c tiny --sample 100 --force",
                  "ultra3 data prep sft --batch mycluster output_dir=/lustre/data/sft"))
RL = _data_prep("rl", "Check the RL blends, restore their placeholders and split them (processes; "
                "Ray across nodes).",
                Output("rl-data", "output_dir"),
                ("ultra3 data prep rl -c tiny", "ultra3 data prep rl --sample 1000",
                 "ultra3 data prep rl --batch mycluster output_dir=/lustre/data/rl "
                 "placeholders.dapo.path=hf://BytedTsinghua-SIA/DAPO-Math-17k"))
