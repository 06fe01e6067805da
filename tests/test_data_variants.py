"""A data prep whose data the command line or a pipe replaces publishes a variant of its own, never the config's
`latest`; and a pretraining blend is checked against the schedule: its recorded train tokens against the tokens the
run trains on, its valid and test splits against validation. A real data prep run on this machine, the real CLI."""

from __future__ import annotations

import json
import re

from ultra3.compile import compile_job
from ultra3.config import Layer
from ultra3.job import Options
from ultra3.stages import STAGES

SMALL = "datasets=[{name: small, path: %s, weight: 1}]"


def small_corpus(tmp_path) -> str:
    path = tmp_path / "small.jsonl"
    path.write_text('{"text": "a b c d e f g"}\n{"text": "h i j"}\n')
    return str(path)


def published(r) -> str:
    return re.search(r"^published (\S+):v1 -> ", r.out, re.M).group(1)


def test_replaced_datasets_publish_a_variant_that_no_plain_run_takes(cli, home, tmp_path):
    r = cli("data", "prep", "pretrain", "-c", "tiny", SMALL % small_corpus(tmp_path), f"output_dir={tmp_path}/small")
    assert r.rc == 0, r.err
    name = published(r)
    assert re.fullmatch(r"ultra3-pretrain-data-tiny-[0-9a-f]{6}", name), name
    manifest = json.loads(next(home.rglob(f"{name}/v1/manifest.json")).read_text())
    assert manifest["config"] == "tiny" and manifest["variant"] == name.rsplit("-", 1)[1]
    plain = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false")  # the variant is not tiny's data
    assert plain.rc == 2 and "error: dataset.blend_path: no pretrain-data artifact for this machine" in plain.err
    named = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false", f"dataset.blend_path={name}:latest")
    assert named.rc == 0, named.err
    assert re.search(r"^warning: dataset.blend_path: its train split holds 13 tokens but the run trains on 81,920 "
                     r"\(81.92K\): about 6,301.5 epochs, Megatron repeats the data; prepare more data, or lower "
                     r"train.train_iters \[dataset.blend_path=\S+ from ultra3-data-prep-pretrain_\S+ completed "
                     r"[\d :-]+; train.train_iters=40, train.global_batch_size=4, model.seq_length=512 from "
                     r"configs/_shared/tiny.yaml\]$", named.out, re.M), named.out
    assert "warning: dataset.blend_path: its valid and test splits are empty but validation.eval_iters=1: nothing " \
           "to evaluate on; " in named.out, named.out
    whole = cli("data", "prep", "pretrain", "-c", "tiny", f"output_dir={tmp_path}/tiny")  # the config's own data
    assert whole.rc == 0 and published(whole) == "ultra3-pretrain-data-tiny", whole.err
    fits = cli("pretrain", "-c", "tiny", "--dry-run", "dataset.mock=false")
    assert fits.rc == 0 and f"dataset.blend_path = {tmp_path}/tiny/blend.json" in fits.out, fits.err
    assert "warning: dataset.blend_path" not in fits.out  # 272,901 train tokens, three splits


def test_what_makes_a_variant(cli_here, home, tmp_path):
    corpus = small_corpus(tmp_path)
    replaced = cli_here("data", "prep", "pretrain", "-c", "tiny", "--dry-run", "--full", SMALL % corpus, "num_shards=1")
    assert replaced.rc == 0, replaced.err
    digest = re.search(r"^  variant: '?([0-9a-f]{6})'?$", replaced.out, re.M).group(1)
    assert f"note: datasets: datasets, num_shards set in command line over what config tiny sets: this run publishes " \
           f"ultra3-pretrain-data-tiny-{digest}, never tiny's own latest; a later stage takes it only when named " \
           f"(ultra3-pretrain-data-tiny-{digest}:latest, or job:ID)" in replaced.out.splitlines(), replaced.out
    assert f"- name: ultra3-pretrain-data-tiny-{digest}-sample-5" in cli_here(
        "data", "prep", "pretrain", "-c", "tiny", "--dry-run", "--full", SMALL % corpus, "num_shards=1", "--sample",
        "5").out
    for same in ([f"output_dir={tmp_path}/o", "workers=2", "force=true"],  # where and how, not what
                 ["num_shards=4"]):  # the config's own value
        r = cli_here("data", "prep", "pretrain", "-c", "tiny", "--dry-run", "--full", *same)
        assert r.rc == 0 and "variant:" not in r.out and "produces ultra3-pretrain-data-tiny (" in r.out, r.out
    filled = cli_here("data", "prep", "pretrain", "-c", "long_context", "--dry-run", "--full",
                      SMALL % corpus)  # datasets: []
    assert filled.rc == 0 and "variant:" not in filled.out, filled.err
    # a pipe's override (the layer a pipe config's step gives its stage) makes one too
    stage = next(s for s in STAGES if s.name == "data prep pretrain")
    job = compile_job(stage, Options(config="tiny", dry_run=True,
                                     pipe_layer=Layer("p.yaml [data-pretrain]", {"num_shards": 2})))
    assert re.fullmatch(r"ultra3-pretrain-data-tiny-[0-9a-f]{6}", job.config["job"]["produces"][0]["name"])
