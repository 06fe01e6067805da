"""`ultra3 eval`: the dry runs of the shipped configs (the Ultra serving layout against the GPUs' memory), bad input
in one line (an unknown task with lm-eval's closest name, vLLM without
GPUs or with a layout that is not the node), the runtime's bounded wait for a server that never listens,
`nemotron jobs compare` and `nemotron jobs status` on results; heavy: `ultra3 eval -c tiny` for real on CPU, and
a quantized tiny checkpoint beside its BF16 source."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

DEFAULT = ("eval", "--batch", "blackwell", "--dry-run", "checkpoint=/lustre/ckpt/sft-hf")


def one_error(r) -> str:
    lines = [line for line in r.err.splitlines() if line.startswith("error:")]
    assert r.rc == 2 and len(lines) == 1 and "Traceback" not in r.err, (r.rc, r.err)
    return lines[0]


def test_tiny_dry_run_needs_no_input_and_no_network(cli_here, home):
    r = cli_here("eval", "-c", "tiny", "--dry-run")
    assert r.rc == 0, r.err
    assert "checkpoint: not needed (make_checkpoint is set)" in r.out
    assert "produces ultra3-eval-results-tiny (eval-results)" in r.out
    assert "Hugging Face Hub" not in r.out + r.err  # the shipped tasks read their JSONL beside them
    assert not (home / "nemorun").exists()


def test_default_dry_run_shows_the_serving_layout_and_the_hub_tasks(cli_here, home):
    r = cli_here(*DEFAULT)
    assert r.rc == 0, r.err
    assert "server           vllm serve, TP8 PP1 on 8 GPUs of 1 node" in r.out
    assert "weights per GPU  140.1 GB" in r.out
    assert "warning: tasks: mmlu, hellaswag read their data from the Hugging Face Hub" in r.out + r.err
    cached = cli_here(*DEFAULT, "hf_datasets_cache=/lustre/hf-datasets")
    assert cached.rc == 0 and "Hugging Face Hub" not in cached.out + cached.err


@pytest.mark.parametrize("override, says", [
    ("tasks=[{name: hellaswg}]", "'hellaswg' is not a task of lm-eval 0.4.13 nor of recipes/evaluation/tasks "
                                 "(set in command line); did you mean 'hellaswag'?"),
    ("tasks=[{name: ultra3_tiny_choise}]", "did you mean 'ultra3_tiny_choice'?"),
    ("tasks=[{name: mmlu, num_fewshot: -1}]", "tasks[0].num_fewshot: must be an integer >= 0"),
    ("generation.top_p=1.5", "generation.top_p: 1.5 is not in (0, 1]"),
    ("backend=vllm", "the vllm backend serves the model on GPUs, and the job has none"),
])
def test_bad_tiny_input_is_one_line_exit_2(cli_here, home, override, says):
    assert says in one_error(cli_here("eval", "-c", "tiny", "--dry-run", override))


def test_a_layout_that_is_not_the_node_and_weights_over_the_memory(cli_here, home):
    assert "tensor_parallel_size 8 x pipeline_parallel_size 2 = 16 GPUs, but the node has 8" in one_error(
        cli_here(*DEFAULT, "serve.pipeline_parallel_size=2"))
    r = cli_here(*DEFAULT, "serve.tensor_parallel_size=2", "serve.pipeline_parallel_size=2", "run.gpus_per_node=4")
    assert "the weights take 280 GB per GPU, over 90% of a b200" in one_error(r)


def quantized(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "nemotron_h"}))
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    return folder


def test_a_quantized_checkpoint_on_the_hf_backend_is_emulated_and_said_so(cli_here, home, tmp_path):
    ckpt = quantized(tmp_path / "nvfp4")
    r = cli_here("eval", "-c", "tiny", "--dry-run", "make_checkpoint=false", f"checkpoint={ckpt}")
    assert r.rc == 0, r.err
    assert "note: checkpoint: a quantized checkpoint on the hf backend is emulated: its weights dequantized as " \
           "stored" in r.out
    served = cli_here(*DEFAULT[:-1], f"checkpoint={ckpt}")  # vLLM serves it: sized at NVFP4
    assert served.rc == 0 and "checkpoint kind  quantized-checkpoint" in served.out, served.err


def test_a_directory_that_is_no_checkpoint(cli_here, home, tmp_path):
    (tmp_path / "empty").mkdir()
    line = one_error(cli_here("eval", "-c", "tiny", "--dry-run", "make_checkpoint=false",
                              f"checkpoint={tmp_path / 'empty'}"))
    assert "is neither a Hugging Face checkpoint (config.json) nor a Megatron-Bridge checkpoint" in line


def test_dry_run_reads_no_lm_eval(tmp_path):
    """The task names come from the record: lm-eval (17 s to index its tasks) is never imported by the launcher."""
    code = ("import sys; from ultra3.stages.eval import task_names; ours, theirs = task_names(); "
            "print(len(ours), 'mmlu' in theirs, 'lm_eval' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "True", "False"]


def test_a_server_that_never_listens_fails_in_one_line_after_the_bounded_wait(tmp_path):
    pytest.importorskip("lm_eval")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    cfg = {"checkpoint": str(ckpt), "output_dir": str(tmp_path / "out"), "backend": "vllm",
           "tasks": [{"name": "ultra3_tiny_choice"}], "job": {"dir": str(tmp_path)},
           "serve": {"command": [sys.executable, "-c", "import time; print('loading'); time.sleep(60)"],
                     "port": 1, "start_timeout_s": 2}}
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, "-m", "recipes.eval", "--config", str(tmp_path / "config.yaml")],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "the model server did not answer at http://127.0.0.1:1/v1 within 2 s (serve.start_timeout_s); see " \
           f"{tmp_path / 'vllm-server.log'} (last line: loading)" in p.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def results(path: Path, choice: tuple[float, float], completion: tuple[float, float], kind: str) -> Path:
    path.mkdir()
    tasks = {"ultra3_tiny_choice": {"metric": "acc,none", "score": choice[0], "stderr": choice[1], "samples": 12,
                                    "num_fewshot": 0, "version": 1.0},
             "ultra3_tiny_completion": {"metric": "exact_match,first_word", "score": completion[0],
                                        "stderr": completion[1], "samples": 8, "num_fewshot": 1, "version": 1.0}}
    (path / "results.json").write_text(json.dumps({"checkpoint": {"given": f"/ckpt/{kind}", "kind": kind},
                                                   "tasks": tasks}))
    return path


def test_compare_prints_the_difference_and_whether_it_is_inside_the_stderr(cli_here, home, tmp_path):
    bf16 = results(tmp_path / "bf16", (0.60, 0.03), (0.50, 0.01), "sft-checkpoint")
    nvfp4 = results(tmp_path / "nvfp4", (0.58, 0.03), (0.40, 0.01), "quantized-checkpoint")
    r = cli_here("jobs", "compare", str(bf16), str(nvfp4 / "results.json"), prog="nemotron")
    assert r.rc == 0, r.err
    assert f"[2] {nvfp4 / 'results.json'}: /ckpt/quantized-checkpoint (quantized-checkpoint)" in r.out
    rows = {line.split()[0]: line for line in r.out.splitlines() if line.startswith("ultra3_")}
    assert "-0.0200 (inside stderr 0.0424)" in rows["ultra3_tiny_choice"]
    assert "-0.1000 (outside stderr 0.0141)" in rows["ultra3_tiny_completion"]


def test_compare_of_something_that_is_no_result(cli_here, home, tmp_path):
    (tmp_path / "x.json").write_text("[]")
    assert "holds no per-task scores" in one_error(cli_here("jobs", "compare", str(tmp_path / "x.json"),
                                                            prog="nemotron"))
    assert "no eval-results artifact of that name" in one_error(cli_here("jobs", "compare", "nope:latest",
                                                                         prog="nemotron"))


@pytest.mark.heavy
def test_tiny_eval_for_real_then_status_and_compare(cli, home):
    runs = [cli("eval", "-c", "tiny", timeout=300), cli("eval", "-c", "tiny", "tasks=[{name: ultra3_tiny_choice}]",
                                                        timeout=300)]
    for r in runs:
        assert r.rc == 0, r.out + r.err
    ids = [next(w for w in r.out.split() if w.startswith("ultra3-eval_")) for r in runs]
    assert "published ultra3-eval-results-tiny:v1" in runs[0].out
    found = json.loads(next(home.rglob(f"{ids[0]}/eval/results.json")).read_text())
    assert found["harness"] == {"name": "lm-evaluation-harness", "version": "0.4.13"}
    assert found["checkpoint"]["kind"] == "hf-checkpoint" and found["backend"] == "hf"
    choice = found["tasks"]["ultra3_tiny_choice"]
    assert choice["samples"] == 12 and choice["version"] == 1.0 and 0 <= choice["score"] <= 1
    assert found["tasks"]["ultra3_tiny_completion"]["num_fewshot"] == 1
    status = cli("jobs", "status", ids[0], prog="nemotron")
    assert status.rc == 0 and "scores:" in status.out
    assert any(line.split()[:2] == ["ultra3_tiny_choice", "acc"] for line in status.out.splitlines()), status.out
    compared = cli("jobs", "compare", ids[0], "ultra3-eval-results-tiny:latest", prog="nemotron")
    assert compared.rc == 0, compared.err
    rows = [line for line in compared.out.splitlines() if line.startswith("ultra3_")]
    assert "+0.0000 (inside stderr" in rows[0] and rows[1].split()[-1] == "-"  # the second scored one task


@pytest.mark.heavy
def test_the_nvfp4_quantization_beside_its_bf16_source_on_cpu(cli, home):
    """quantize -c tiny, then eval of its BF16 source and of its export (emulated), compared."""
    made = cli("quantize", "-c", "tiny", timeout=300)
    assert made.rc == 0, made.out + made.err
    source = next(home.rglob("ultra3-quantize_*/tiny-bf16"))
    runs = [cli("eval", "-c", "tiny", "make_checkpoint=false", f"checkpoint={source}", timeout=300),
            cli("eval", "-c", "tiny", "make_checkpoint=false", "checkpoint=ultra3-quantized-checkpoint-tiny:latest",
                timeout=300)]
    for r in runs:
        assert r.rc == 0, r.out + r.err
    assert "quantized activations: 14 module(s) hooked" in runs[1].out  # 12 FP8 layers' inputs, the K and V cache
    ids = [next(w for w in r.out.split() if w.startswith("ultra3-eval_")) for r in runs]
    results = [json.loads(next(home.rglob(f"{i}/eval/results.json")).read_text()) for i in ids]
    assert "emulation" not in results[0] and results[1]["emulation"].startswith("weights dequantized")
    assert results[1]["checkpoint"]["kind"] == "quantized-checkpoint"
    compared = cli("jobs", "compare", ids[0], ids[1], prog="nemotron")
    assert compared.rc == 0, compared.err
    assert "(quantized-checkpoint, emulated)" in compared.out.splitlines()[1]
    rows = [line for line in compared.out.splitlines() if line.startswith("ultra3_")]
    assert len(rows) == 2 and all(re.search(r"[+-]\d\.\d{4} \((inside|outside) stderr", row) for row in rows), rows


@pytest.mark.heavy
def test_a_pipe_of_two_evaluations_ends_with_them_side_by_side(cli, home, tmp_path):
    pipe = tmp_path / "two.yaml"
    pipe.write_text("stages:\n  all-tasks: {stage: eval, config: tiny}\n"
                    "  one-task: {stage: eval, config: tiny, overrides: {tasks: [{name: ultra3_tiny_choice}]}}\n")
    r = cli("pipe", "-c", str(pipe), timeout=600)
    assert r.rc == 0, r.out + r.err
    ids = re.findall(r"^== (?:all-tasks|one-task): (ultra3-eval_\S+) ==$", r.out, re.M)
    end = r.out.split("COMPLETED\n")[-1].splitlines()
    assert end[:2] == ["", "== evaluations side by side (nemotron jobs compare) =="], r.out
    assert end[2].startswith(f"[1] {ids[0]}: ") and end[3].startswith(f"[2] {ids[1]}: ")
    assert [line.split()[0] for line in end if line.startswith("ultra3_")] == ["ultra3_tiny_choice",
                                                                             "ultra3_tiny_completion"]
    again = cli("pipe", "-c", str(pipe), timeout=600)  # both skipped: compared from the outputs they made
    assert again.rc == 0 and "every step already completed" in again.out, again.out + again.err
