"""`ultra3 pipe` as a graph, without a cluster: the edges a plan draws (the outputs a step reads, its `after:`),
bad graphs refused in one line, the dry run's graph and critical path, the cost's wall time along that path,
and a completed step taken as done only while its outputs are still there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ultra3 import cost, pipe_graph

# three CPU steps: data-b's output is read by quantize (calibration data), data-a's is not
CPU = {"stages": {
    "data-a": {"stage": "data prep pretrain", "config": "tiny"},
    "data-b": {"stage": "data prep sft", "config": "tiny"},
    "quantize": {"stage": "quantize", "config": "tiny"},
}}
STEP = re.compile(r"^  \d\. (\S+) +ultra3 [a-z ]+ -c tiny  \[(?:runs again: (.+?); )?run as \S+?(?:, after (.+))?\]$",
                  re.M)


def pipe_file(tmp_path: Path, stages: dict, name: str = "g") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    return str(path)


def edges(out: str) -> dict[str, str]:
    """step -> the steps it waits for, as the dry run's step list says."""
    return {m[0]: m[2] for m in STEP.findall(out)}


def test_a_step_waits_only_for_what_it_reads_and_its_after(cli, home, tmp_path):
    r = cli("pipe", "-c", pipe_file(tmp_path, CPU["stages"]), "--dry-run")
    assert r.rc == 0, r.err
    assert edges(r.out) == {"data-a": "", "data-b": "", "quantize": "data-b"}  # no edge to the step before it
    with_after = {**CPU["stages"], "quantize": {**CPU["stages"]["quantize"], "after": ["data-a"]}}
    r = cli("pipe", "-c", pipe_file(tmp_path, with_after), "--dry-run")
    assert r.rc == 0, r.err
    assert edges(r.out) == {"data-a": "", "data-b": "", "quantize": "data-a, data-b"}
    graph = r.out.split("== graph (<- the steps each waits for; * on the critical path) ==\n")[1].split("\n\n")[0]
    lines = graph.splitlines()
    assert re.fullmatch(r"[ *] data-a", lines[0]) and re.fullmatch(r"[ *] data-b", lines[1]), graph
    assert re.fullmatch(r"\* quantize  <- data-a \(after:\), data-b", lines[2]), graph  # after: marked, read not
    assert re.fullmatch(r"critical path: data-\w -> quantize \(no estimate for quantize\)", lines[3]), graph


def test_a_step_may_wait_for_a_later_one_and_runs_after_it(cli, home, tmp_path):
    stages = {"quantize": {"stage": "quantize", "config": "tiny", "after": ["data-a"]},
              "data-a": CPU["stages"]["data-a"]}
    r = cli("pipe", "-c", pipe_file(tmp_path, stages), "--dry-run")
    assert r.rc == 0, r.err
    assert [m[0] for m in STEP.findall(r.out)] == ["data-a", "quantize"]  # the run order: data-a first
    assert edges(r.out)["quantize"] == "data-a"


@pytest.mark.parametrize("after, message", [
    ({"data-a": ["quantize"]}, "error: g.yaml stages.data-a.after: data-a -> quantize -> data-b -> data-a is a "
                               "cycle (data-a is after quantize (after:), quantize reads data-b's output, data-b is "
                               "after data-a (after:)); remove one of these after: entries"),
    ({"data-a": ["data-a"]}, "error: g.yaml stages.data-a.after: data-a -> data-a is a cycle (data-a is after data-a "
                             "(after:)); remove one of these after: entries"),
    ({"quantize": ["data_b"]}, "error: g.yaml stages.quantize.after: no step 'data_b'; did you mean 'data-b'?"),
    ({"data-b": ["nothing"]}, "error: g.yaml stages.data-b.after: no step 'nothing'; the steps: data-a, data-b, "
                              "quantize"),
    ({"data-b": "data-a"}, "error: g.yaml stages.data-b.after: must be a list of step ids, e.g. after: [data-a]"),
])
def test_bad_graphs_are_one_line(cli, home, tmp_path, after, message):
    stages = {k: {**v, **({"after": after[k]} if k in after else {})} for k, v in CPU["stages"].items()}
    if after.get("data-a") == ["quantize"]:
        stages["data-b"]["after"] = ["data-a"]  # and data-b after data-a: a cycle through quantize's input
    r = cli("pipe", "-c", pipe_file(tmp_path, stages), "--dry-run")
    assert r.rc == 2 and r.err_lines == [message], r.err
    assert not (home / "pipes").exists()


def test_an_after_outside_the_selection_is_dropped_and_said(cli, home, tmp_path):
    stages = {**CPU["stages"], "quantize": {**CPU["stages"]["quantize"], "after": ["data-a"]}}
    stages = {"data-b": stages["data-b"], "quantize": stages["quantize"], "data-a": stages["data-a"]}
    r = cli("pipe", "-c", pipe_file(tmp_path, stages), "--dry-run", "--to", "quantize")
    assert r.rc == 0, r.err
    assert edges(r.out) == {"data-b": "", "quantize": "data-b"}
    assert re.search(r"^\* quantize  <- data-b; after: data-a dropped \(not selected: --to quantize\)$", r.out, re.M)


def test_the_graph_functions():
    waits = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": []}
    assert pipe_graph.cycle(waits) is None
    assert pipe_graph.cycle({**waits, "a": ["d"]}) == ["a", "d", "b", "a"]
    assert pipe_graph.order(["d", "c", "b", "a", "e"], waits) == ["a", "c", "b", "d", "e"]
    assert pipe_graph.dependents("b", waits) == ["d"] and pipe_graph.dependents("a", waits) == ["b", "c", "d"]
    hours = {"a": 1, "b": 5, "c": 2, "d": 1, "e": 6}
    assert pipe_graph.critical_path(["a", "b", "c", "d", "e"], waits, hours) == ["a", "b", "d"]  # 7 h over e's 6
    del hours["c"]  # no estimate: it may take any time
    assert pipe_graph.critical_path(["a", "b", "c", "d", "e"], waits, hours) == ["a", "c", "d"]


def test_the_total_takes_the_critical_path_for_wall_time_and_the_sum_for_gpu_hours():
    parts = [cost.Estimate("a", 1.0, 8.0, None, ""), cost.Estimate("b", 5.0, 40.0, None, ""),
             cost.Estimate("c", 2.0, 16.0, None, ""), cost.Estimate("x", None, None, None, "", "no model")]
    chain = cost.total(parts)
    assert (chain.wall_hours, chain.gpu_hours) == (8.0, 64.0)
    graph = cost.total(parts, ["a", "b"])
    assert (graph.wall_hours, graph.gpu_hours) == (6.0, 64.0)
    assert graph.basis == "wall: the critical path a -> b; GPU/core-h: sum of 3 of 4 stages; unknown: x"
    assert cost.format_line(graph) == (f"{'total':<18} ~ 6 h wall, 64 GPU-h   (wall: the critical path a -> b; "
                                       "GPU/core-h: sum of 3 of 4 stages; unknown: x)")


def publish_done(tmp_path: Path, stage: str, kind: str, path: Path, metadata: dict | None = None) -> str:
    """A completed job of this stage's tiny config in the store, its output at `path`; its producer id."""
    from recipes.contract import artifact_name, publish
    from ultra3.compile import compile_job
    from ultra3.job import Options
    from ultra3.stages import find_stage

    done = compile_job(find_stage(stage), Options(config="tiny"))
    producer = f"ultra3-{stage.replace(' ', '-')}_20260101-000000-aaaaaa"
    publish(done.store.root, {"format": 1, "name": artifact_name(kind, "tiny"), "type": kind, "path": str(path),
                              "producer": producer, "profile": None, "config_digest": done.digest, "config": "tiny",
                              "stage": stage, "created_ts": 1.0, "inputs": [], "metadata": metadata or {}})
    return producer


def test_a_completed_step_whose_output_is_gone_runs_again_and_says_why(cli, home, tmp_path):
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "metadata.json").write_text('{"format": "ultra3-sft-packed-parquet/1", "pack_size": 512}')
    producer = publish_done(tmp_path, "data prep sft", "sft-data", packed, {"tokens": 100})
    pipe = pipe_file(tmp_path, CPU["stages"])
    r = cli("pipe", "-c", pipe, "--dry-run")
    assert r.rc == 0, r.err
    assert re.search(rf"^  2\. data-b +ultra3 data prep sft -c tiny  \[skip: done by {producer} ", r.out, re.M), r.out
    assert edges(r.out)["quantize"] == ""  # it reads data-b's stored output
    (packed / "metadata.json").unlink()
    r = cli("pipe", "-c", pipe, "--dry-run")
    assert edges(r.out)["data-b"] == "" and edges(r.out)["quantize"] == "data-b", r.out
    assert f"[runs again: its output {packed} recorded by {producer} is empty; run as" in r.out
    packed.rmdir()
    r = cli("pipe", "-c", pipe, "--dry-run")
    assert f"[runs again: its output {packed} recorded by {producer} is gone; run as" in r.out
    gone = cli("pipe", "-c", pipe, "--dry-run", "--from", "quantize")
    assert gone.rc == 2 and gone.err_lines == [
        f"error: data-b: --from quantize: this earlier step must run again (its output {packed} recorded by "
        f"{producer} is gone); start from it or leave --from out"], gone.err


def test_what_a_checkpoint_or_a_blend_has_lost_is_named(tmp_path):
    from ultra3.artifact_check import gone

    ckpt = tmp_path / "ckpt"
    (ckpt / "iter_0000020").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20\n")
    made = {"path": str(ckpt), "producer": "job-1", "type": "pretrain-checkpoint", "metadata": {"iterations": 20}}
    assert gone([made], None) is None
    (ckpt / "iter_0000020").rmdir()
    assert gone([made], None) == f"its output {ckpt} recorded by job-1 has lost the checkpoint its tracker names " \
                                 "(iteration 20)"
    blend = tmp_path / "blend.json"
    blend.write_text('{"train": ["%s"]}' % (tmp_path / "shard_0"))
    why = gone([{"path": str(blend), "producer": "job-2", "type": "pretrain-data", "metadata": {}}], None)
    assert why == f"its output {blend} recorded by job-2 is broken: {blend} names 1 of 1 shard(s) without " \
                  f".bin/.idx, e.g. {tmp_path / 'shard_0'}"
