"""NVIDIA's Nemotron CLI names for stage-config keys where ours differ, read as ours with a note: the overrides
its docs teach (`run.data=...`, `data.per_split_data_args_path=...`, `dataset.ultra3_packed_sft_dir=...`) work
here as they are, on the command line, in a pipe or in a config file given with -c PATH.

Each names the stage's data input (a path or an artifact ref, NAME:latest), found through the registry by the
input's artifact kind, so no stage is named here."""

from __future__ import annotations

from .config import Layer
from .findings import Report
from .stage import Stage

# NVIDIA's key -> the artifact kind of the input it sets (same file layout: blend.json's per-split lists, the
# packed Parquet's train/ and valid/)
BY_KIND = {"data.per_split_data_args_path": "pretrain-data", "dataset.ultra3_packed_sft_dir": "sft-data"}
RUN_DATA = "run.data"  # the artifact ref of the stage's data input


def read_as_ours(stage: Stage, layer: Layer, report: Report) -> None:
    """NVIDIA's keys of one layer renamed in place, a note each; a key naming an input this stage lacks is an
    error."""
    for old in [k for k in layer.values if k in BY_KIND or k == RUN_DATA]:
        value = layer.values.pop(old)
        inp = next((i for i in stage.inputs if i.name == "data" and (old == RUN_DATA or BY_KIND[old] in i.kinds)), None)
        if inp is None:
            what = f"{BY_KIND[old]} as its data input" if old in BY_KIND else "a data input"
            report.error(old, f"NVIDIA's CLI key for a stage that takes {what}; ultra3 {stage.name} does not (set in "
                              f"{layer.source}); remove it")
        elif old == RUN_DATA and value is None:
            report.note(old, f"null (set in {layer.source}): NVIDIA's way to skip the artifact lookup; here {inp.key} "
                             "given as a path does that")
        elif inp.key in layer.values:
            report.error(old, f"and {inp.key} both set in {layer.source}; keep {inp.key}")
        else:
            layer.values[inp.key] = value
            report.note(old, f"read as {inp.key} (NVIDIA's CLI name; set in {layer.source})")
