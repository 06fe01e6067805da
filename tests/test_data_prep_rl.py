"""The RL data-prep runtime (recipes.data_prep_rl) for real: the row checks, the placeholder format and its
restoration, and a blend task in process (fast tier); then the entry module as a subprocess on the shipped
tiny blends on the embedded Ray (output contract, determinism across worker counts, strict and lenient bad
rows, dropped placeholders, sample, up to date, force, kill -9 and resume) and `ultra3 data prep rl -c tiny`
through the CLI (heavy)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import stage_config
from recipes.dataprep import inputs
from recipes.dataprep import rl_records as records
from recipes.dataprep.errors import BadRecordError
from recipes.dataprep.rl_blend import BlendTask, finished, prepare_blend

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny" / "rl"
SOURCES = {"dapo": TINY / "sources" / "dapo-math-17k.jsonl", "skywork": TINY / "sources" / "skywork-or1-math.jsonl"}
PROG = "ultra3 data prep rl"
AGENT = {"type": "responses_api_agents", "name": "math_with_judge_simple_agent"}


def lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in lines(path)]


def file_hashes(out: Path) -> dict:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def task(blend: Path, staging: Path, sources=("dapo", "skywork"), **over) -> BlendTask:
    described = {s: [{"path": str(SOURCES[s]), "format": "jsonl", "fingerprint": inputs.fingerprint(str(SOURCES[s]))}]
                 for s in sources}
    fields = {"name": blend.stem, "path": str(blend), "fmt": inputs.detect_format(str(blend)),
              "fingerprint": inputs.fingerprint(str(blend)), "staging": str(staging), "limit": None, "val_rows": 5,
              "strict": False, "sources": described, "max_bytes": inputs.MAX_RECORD_BYTES}
    return BlendTask(**{**fields, **over})


# ---- the rows (fast) ------------------------------------------------------------------------------------

GOOD = {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]}, "agent_ref": AGENT}


@pytest.mark.parametrize("row, problem", [
    (GOOD, None),
    ({**GOOD, "responses_create_params": {"input": "2+2?"}}, None),  # a string input is a user message to Gym
    ({"agent_ref": AGENT}, "responses_create_params is null, not an object; give the request for the policy"),
    ({**GOOD, "responses_create_params": []}, "responses_create_params is list, not an object"),
    ({**GOOD, "responses_create_params": {"input": []}}, "responses_create_params.input is empty; give the prompt"),
    ({**GOOD, "responses_create_params": {"tools": []}}, "responses_create_params.input is null; give the prompt"),
    ({**GOOD, "responses_create_params": {"input": [{"role": "user", "content": "x"}, "y"]}},
     "responses_create_params.input[1] is str, not an object; each item is a message {role, content}"),
    ({"responses_create_params": GOOD["responses_create_params"]}, "no agent_ref; name the Gym agent that runs"),
    ({**GOOD, "agent_ref": {"type": "responses_api_agents"}}, "agent_ref.name is not a non-empty string"),
    ({**GOOD, "agent_ref": {"name": " "}}, "agent_ref.name is not a non-empty string"),
    ({**GOOD, "agent_ref": "math"}, "agent_ref is str, not an object; name the Gym agent"),
])
def test_what_nemo_gym_needs_of_a_row(row, problem):
    found = records.check(row)
    assert (found is None) if problem is None else found.startswith(problem), found


@pytest.mark.parametrize("line, kind, problem", [
    (b'{"a": 1', "invalid_json", "invalid JSON (Expecting ',' delimiter: line 1 column 8 (char 7)); each line must"),
    (b"[1, 2]", "invalid_json", "a JSON list, not an object; each line must be one JSON object"),
    (b'{"a": "caf\xe9"}', "bad_utf8", "invalid UTF-8 at byte 10; re-encode the file as UTF-8"),
])
def test_lines_that_are_not_rows(line, kind, problem):
    row, k, p = records.parse(line)
    assert row is None and k == kind and p.startswith(problem), p


def test_placeholders_name_their_source_by_dataset_else_by_template():
    dapo_t, sky_t = {"prefix": "P ", "suffix": " S"}, "Q: {question}"
    assert records.placeholder({"dataset": "ultra_dapo17k", "_hf_placeholder": {"row": 3}}) == ("dapo", 3)
    assert records.placeholder({"dataset": "Skywork_OR1", "_hf_placeholder": {"row": 0, "question_template": sky_t}}) \
        == ("skywork", 0)
    assert records.placeholder({"dataset": "masked", "_hf_placeholder": {"row": 1, "question_template": dapo_t}}) \
        == ("dapo", 1)
    assert records.placeholder({"_hf_placeholder": {"row": 2, "question_template": sky_t}}) == ("skywork", 2)
    bad = [({"_hf_placeholder": [1]}, "_hf_placeholder is list, not an object"),
           ({"dataset": "x_dapo", "_hf_placeholder": {"row": -1}}, "_hf_placeholder.row is -1, not a row number"),
           ({"dataset": "x_dapo", "_hf_placeholder": {"row": True}}, "_hf_placeholder.row is True, not a row number"),
           ({"dataset": "other", "_hf_placeholder": {"row": 1}}, "the placeholder names no source (dataset 'other'"),
           ({"dataset": "x_dapo", "_hf_placeholder": {"row": 1, "question_template": sky_t}},
            "_hf_placeholder.question_template is not a dapo template ({prefix, suffix})"),
           ({"dataset": "x_dapo", "_hf_placeholder": {"row": 1, "question_template": {"prefix": 3}}},
            "_hf_placeholder.question_template is not a dapo template")]
    for row, problem in bad:
        found = records.placeholder(row)
        assert isinstance(found, str) and found.startswith(problem) and "restore the row from the published" in found


def test_restoration_of_each_source():
    masked = {"responses_create_params": {"input": [{"role": "user", "content": ""}, {"role": "user", "content": "b"}],
                                          "temperature": 1.0},
              "question": "", "expected_answer": "", "agent_ref": AGENT, "dataset": "x_dapo17k",
              "_hf_placeholder": {"row": 0, "question_template": {"prefix": "Solve.\n\n", "suffix": "\n\nBox it.\n"}}}
    dapo_q = "Wrapper line.\n\nPart one.\n\nPart two?\n\nLast wrapper line."
    got = records.restore(masked, "dapo", dapo_q, "34")
    full = "Solve.\n\nPart one.\n\nPart two?\n\nBox it."
    assert list(got) == ["responses_create_params", "question", "expected_answer", "agent_ref", "dataset"]
    assert got["question"] == full and got["expected_answer"] == "34"
    assert got["responses_create_params"] == {"input": [{"role": "user", "content": full},
                                                        {"role": "user", "content": "b"}], "temperature": 1.0}
    assert masked["responses_create_params"]["input"][0]["content"] == ""  # the input row is not changed
    sky = {"agent_ref": AGENT, "dataset": "x_skywork",
           "_hf_placeholder": {"row": 0, "question_template": "{question} Go."}}
    got = records.restore(sky, "skywork", "What is 6*7?", "42")
    assert got == {"agent_ref": AGENT, "dataset": "x_skywork", "question": "What is 6*7?", "expected_answer": "42",
                   "responses_create_params": {"input": [{"role": "user", "content": "What is 6*7? Go."}]}}
    no_template = {"dataset": "x_dapo", "_hf_placeholder": {"row": 0}}
    assert records.restore(no_template, "dapo", dapo_q, "1")["question"] == dapo_q  # as the source has it


def test_source_rows_from_jsonl_and_parquet_agree(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = rows(SOURCES["skywork"])
    pq.write_table(pa.Table.from_pylist(src[:7]), tmp_path / "a.parquet", row_group_size=3)
    pq.write_table(pa.Table.from_pylist(src[7:]), tmp_path / "b.parquet", row_group_size=4)
    wanted = {0, 4, 6, 7, 11, 15, 99}
    from_jsonl = records.fetch([(str(SOURCES["skywork"]), "jsonl")], wanted, inputs.MAX_RECORD_BYTES)
    from_parquet = records.fetch([(str(tmp_path / "a.parquet"), "parquet"), (str(tmp_path / "b.parquet"), "parquet")],
                                 wanted, inputs.MAX_RECORD_BYTES)
    assert from_jsonl == from_parquet and from_jsonl[1] == len(src) == 16 and 99 not in from_jsonl[0]
    assert from_jsonl[0][4] == (src[4]["prompt"][0]["content"], json.loads(src[4]["reward_model"]["ground_truth"])[0])
    pq.write_table(pa.table({"x": [1]}), tmp_path / "c.parquet")
    with pytest.raises(records.DataPrepError, match="has no column prompt or reward_model"):
        records.fetch([(str(tmp_path / "c.parquet"), "parquet")], {0}, inputs.MAX_RECORD_BYTES)


# ---- a blend task in process (fast) ---------------------------------------------------------------------

def expected_split(blend: Path, val_rows: int) -> tuple[list[bytes], list[bytes]]:
    """The rows kept as published (their own bytes) in each split, computed here from the input file."""
    recs = lines(blend)
    keep = [(i, line) for i, line in enumerate(recs) if b"_hf_placeholder" not in line]
    cut = len(recs) - val_rows
    return [line for i, line in keep if i < cut], [line for i, line in keep if i >= cut]


def test_blend_task_restores_drops_and_splits(tmp_path):
    blend = TINY / "rlvr1.jsonl"
    placeholders = [json.loads(line) for line in lines(blend) if b"_hf_placeholder" in line]
    per_source = {s: sum(s in p["dataset"] for p in placeholders) for s in ("dapo", "skywork")}
    assert per_source == {"dapo": 6, "skywork": 4}

    r = prepare_blend(task(blend, tmp_path / "a"))
    assert r["rows_in"] == 40 and r["train"]["rows"] == 35 and r["val"]["rows"] == 5 and r["bad_rows"] == 0
    assert r["placeholders"] == {"found": per_source, "restored": per_source, "dropped": {}}
    out = tmp_path / "a" / "rlvr1"
    for split in ("train", "val"):
        data = (out / f"{split}.jsonl").read_bytes()
        assert r[split]["sha256"] == hashlib.sha256(data).hexdigest() and r[split]["bytes"] == len(data)
        assert data.endswith(b"\n") and b"\n\n" not in data and b"_hf_placeholder" not in data
        for row in rows(out / f"{split}.jsonl"):
            assert records.check(row) is None and isinstance(row.get("expected_answer", ""), str)
    # the restored rows: the source's question and answer, in the input's places
    dapo, sky = rows(SOURCES["dapo"]), rows(SOURCES["skywork"])
    by_uuid = {row["uuid"]: row for s in ("train", "val") for row in rows(out / f"{s}.jsonl")}
    for p in placeholders:
        got, index = by_uuid[p["uuid"]], p["_hf_placeholder"]["row"]
        if "dapo" in p["dataset"]:
            inner = dapo[index]["prompt"][0]["content"].split("\n\n")[1:-1]
            assert got["question"] == got["responses_create_params"]["input"][0]["content"]
            assert "\n\n".join(inner) in got["question"]
            assert got["expected_answer"] == dapo[index]["reward_model"]["ground_truth"]
        else:
            assert got["question"] == sky[index]["prompt"][0]["content"]
            assert got["expected_answer"] == json.loads(sky[index]["reward_model"]["ground_truth"])[0]
    assert [row["uuid"] for row in rows(out / "val.jsonl")] == [f"rlvr1-{i:04d}" for i in range(35, 40)]

    # no sources given: the placeholders are dropped, the rows kept as published keep their bytes and split
    r = prepare_blend(task(blend, tmp_path / "b", sources=()))
    assert r["placeholders"] == {"found": per_source, "restored": {}, "dropped": per_source}
    train, val = expected_split(blend, 5)
    assert lines(tmp_path / "b" / "rlvr1" / "train.jsonl") == train
    assert lines(tmp_path / "b" / "rlvr1" / "val.jsonl") == val and len(val) == 3  # 2 of the last 5 dropped
    # one source only
    r = prepare_blend(task(blend, tmp_path / "c", sources=("skywork",)))
    assert r["placeholders"]["restored"] == {"skywork": 4} and r["placeholders"]["dropped"] == {"dapo": 6}


def test_receipts_key_everything_the_files_depend_on(tmp_path):
    blend = TINY / "mopd.jsonl"
    t = task(blend, tmp_path)
    assert finished(t) is None
    r = prepare_blend(t)
    assert finished(t) == r and json.loads((tmp_path / "mopd.json").read_text()) == r
    others = (task(blend, tmp_path, val_rows=6), task(blend, tmp_path, limit=20), task(blend, tmp_path, strict=True),
              task(blend, tmp_path, sources=("dapo",)))
    for other in others:
        assert other.key != t.key and finished(other) is None
    with open(tmp_path / "mopd" / "val.jsonl", "ab") as f:  # a file changed since: done again
        f.write(b"{}\n")
    assert finished(t) is None


def test_sample_and_validation_limits(tmp_path):
    r = prepare_blend(task(TINY / "rlvr1.jsonl", tmp_path, limit=12, val_rows=4))
    assert r["rows_in"] == 12 and r["train"]["rows"] + r["val"]["rows"] == 12
    assert [row["uuid"] for row in rows(tmp_path / "rlvr1" / "val.jsonl")] == [f"rlvr1-{i:04d}" for i in range(8, 12)]
    with pytest.raises(records.DataPrepError, match=r"has 12 record\(s\), not more than val_rows=12: nothing left"):
        prepare_blend(task(TINY / "rlvr1.jsonl", tmp_path, limit=12, val_rows=12))


MESSY = [  # (line, kind of bad record or None); blank lines are not records
    (json.dumps({**GOOD, "uuid": "m0"}), None),
    ("", None),
    ("{not json", "invalid_json"),
    (json.dumps({"responses_create_params": {"input": []}, "agent_ref": AGENT}), "bad_fields"),
    (json.dumps({"responses_create_params": {"input": "hi"}}), "bad_fields"),
    ("   ", None),
    (json.dumps({**GOOD, "uuid": "m1"}), None),
    (json.dumps({"dataset": "x_dapo17k", "agent_ref": AGENT, "_hf_placeholder": {"row": 500}}), "bad_placeholder"),
    (json.dumps({"dataset": "x", "agent_ref": AGENT, "_hf_placeholder": {"row": 1}}), "bad_placeholder"),
    (json.dumps({"dataset": "x_skywork", "_hf_placeholder": {"row": 1, "question_template": "{question}"}}),
     "bad_fields"),  # restored, but no agent_ref
    ('{"a": "caf\\ud800", ' + json.dumps(GOOD)[1:], None),  # a lone surrogate escape is JSON all the same
    (json.dumps({**GOOD, "uuid": "m2"}), None),
]


def write_messy(path: Path) -> None:
    path.write_bytes(b"".join(line.encode() + b"\n" for line, _ in MESSY))


def test_bad_rows_counted_with_their_place_or_stopping_under_strict(tmp_path):
    blend = tmp_path / "messy.jsonl"
    write_messy(blend)
    r = prepare_blend(task(blend, tmp_path / "s", val_rows=1))
    assert r["rows_in"] == 10 and r["bad_rows"] == 6
    assert r["bad"]["counts"] == {"bad_fields": 3, "bad_placeholder": 2, "invalid_json": 1}
    assert r["bad"]["examples"]["bad_placeholder"] == [
        f"{blend}:8: _hf_placeholder.row 500 is beyond the 24 rows of dapo; set placeholders.dapo to the dataset "
        "the blend was made from",
        f"{blend}:9: the placeholder names no source (dataset 'x', no question_template); restore the row from the "
        "published blend"]
    assert r["train"]["rows"] == 3 and r["val"]["rows"] == 1 and r["placeholders"]["restored"] == {}
    with pytest.raises(BadRecordError) as e:
        prepare_blend(task(blend, tmp_path / "strict", val_rows=1, strict=True))
    assert str(e.value) == f"{blend}:3: invalid JSON (Expecting property name enclosed in double quotes: line 1 " \
                           "column 2 (char 1)); each line must be one JSON object"
    assert sorted(os.listdir(tmp_path / "strict" / "messy")) == []  # nothing half-written left


def test_the_tiny_sample_is_generated_reproducibly(tmp_path):
    p = subprocess.run([sys.executable, "-m", "recipes.samples.make_tiny_rl", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    shipped = sorted(str(f.relative_to(TINY)) for f in TINY.rglob("*") if f.is_file())
    assert shipped == sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file()) == [
        "mopd.jsonl", "rlvr1.jsonl", "sources/dapo-math-17k.jsonl", "sources/skywork-or1-math.jsonl"]
    assert all((TINY / f).read_bytes() == (tmp_path / f).read_bytes() for f in shipped)
    assert sum((TINY / f).stat().st_size for f in shipped) < 100_000


# ---- the runtime: config and input errors before Ray (fast) ----------------------------------------------

def base_config(out: Path, **over) -> dict:
    shipped = stage_config("data_prep/rl")  # the keys of the compiled tiny config under those the test sets
    cfg = {**shipped, "source": str(TINY), "blends": ["rlvr1", "mopd"], "val_rows": 5,
           "placeholders": {s: {**shipped["placeholders"][s], "path": str(p)} for s, p in SOURCES.items()},
           "output_dir": str(out),
           "progress_interval": 1, "run": {"nodes": 1}, "job": {"stage": "data prep rl"}}  # run, job: ignored
    return {**cfg, **over}


def _env(extra: dict | None = None) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **(extra or {})}


def start(config: dict, path: Path, env: dict | None = None, **kw) -> subprocess.Popen:
    path.write_text(json.dumps(config))  # JSON is YAML
    return subprocess.Popen([sys.executable, "-m", "recipes.data_prep_rl", "--config", str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(env), **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_script(config: dict, path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return finish(start(config, path, env))


@pytest.mark.parametrize("change, message", [
    ({"source": "/nonexistent/rl"}, "source /nonexistent/rl is not a directory (nor hf://org/name)"),
    ({"blends": ["rlvr1", "rlhf"]}, f"{TINY} has no file for blend 'rlhf' (rlhf.jsonl); its JSONL files: "
                                    "dapo-math-17k, mopd, rlvr1, skywork-or1-math"),
    ({"blends": ["rlvr1", "rlvr1"]}, "blends[1] 'rlvr1' is listed twice"),
    ({"blends": []}, "blends is empty"),
    ({"placeholders": {"numina": {"path": "x"}}}, "placeholders must map dapo and skywork to {path, split, revision}"),
    ({"placeholders": {"dapo": {"path": "/nonexistent/dapo*.parquet", "split": "train", "revision": None}}},
     "placeholders.dapo: /nonexistent/dapo*.parquet matches no file"),
    ({"source": "hf://nvidia/Nemotron-RL-Ultra-Training-Blends/data"}, "name the dataset repo alone"),
    ({"val_rows": "5"}, "val_rows must be an integer, not '5'"),  # its range: the launcher's
    ({"placeholders": {"dapo": {"path": "x"}}}, "placeholders.dapo.split is not set; set it"),
])
def test_config_and_input_errors_are_one_line_exit_2(change, message, tmp_path):
    out = tmp_path / "out"
    p = run_script(base_config(out, **change), tmp_path / "config.yaml", env={"RAY_TMPDIR": str(tmp_path / "ray")})
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip()
    assert "\n" not in err and err.startswith(f"{PROG}: error: ") and message in err, err
    assert not out.exists() and not (tmp_path / "ray").exists()  # found before Ray starts


def test_dry_run_validates_and_estimates(cli):
    r = cli("data", "prep", "rl", "-c", "tiny", "--dry-run")
    assert r.rc == 0, r.err
    assert "produces ultra3-rl-data-tiny (rl-data)" in r.out and "(2 blends, local bytes) at 60 MB/s per core" in r.out
    r = cli("data", "prep", "rl", "-c", "tiny", "--dry-run", "--sample", "5", "source=/nonexistent", "blends=[a, a]")
    assert r.rc != 0
    assert "sample: 5 rows per blend leave nothing to train on after the last val_rows=5" in r.err
    assert "source: /nonexistent does not exist on this machine" in r.err and "'a' is listed 2 times" in r.err
    r = cli("data", "prep", "rl", "--dry-run", "tokenizer=x")
    assert r.rc != 0 and "tokenizer" in r.err  # not a key of this stage


# ---- the runtime on Ray (heavy) -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The runs that need Ray, started together (most of each is Ray starting up): the tiny blends with 1 and
    with 2 workers, a messy blend under strict and leniently with no placeholder source, and a sample run."""
    d = tmp_path_factory.mktemp("rl-runs")
    src = d / "src"
    shutil.copytree(TINY, src)
    write_messy(src / "messy.jsonl")
    configs = {
        1: base_config(d / "w1", workers=1),
        2: base_config(d / "w2", workers=2),
        "strict": base_config(d / "strict", source=str(src), blends=["rlvr1", "messy"], val_rows=1, strict=True),
        "lenient": base_config(d / "lenient", source=str(src), blends=["rlvr1", "messy"], val_rows=1,
                               max_bad_fraction=0.6,  # the messy blend: 5 bad of 10, counted
                               placeholders={"dapo": {"path": None, "split": "train", "revision": None},
                                             "skywork": {"path": str(SOURCES["skywork"]), "split": "math",
                                                         "revision": None}}),
        "sample": base_config(d / "sample", sample=20),
    }
    procs = {k: start(cfg, d / f"config-{k}.yaml") for k, cfg in configs.items()}
    res = {}
    for k, proc in procs.items():
        p = finish(proc)
        res[k] = {"out": Path(configs[k]["output_dir"]), "proc": p, "config": configs[k], "src": src}
        if k != "strict":
            assert p.returncode == 0, p.stdout + p.stderr
    return res


@pytest.mark.heavy
def test_output_contract(runs):
    out = runs[1]["out"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "metadata.json", "mopd", "mopd/train.jsonl", "mopd/val.jsonl", "rlvr1", "rlvr1/train.jsonl", "rlvr1/val.jsonl"]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["format"] == "ultra3-rl-jsonl/1" and meta["val_rows"] == 5 and meta["sample"] is None
    assert meta["source"] == {"path": str(TINY), "revision": None}
    shown = meta["placeholder_sources"]["dapo"]["files"][0]["path"]  # inside the job's directory: relative to it
    assert not shown.startswith("/") and str(SOURCES["dapo"]).endswith("/" + shown), shown
    assert meta["totals"] == {"rows_in": 80, "rows_out": 80, "train": 70, "val": 10, "placeholders": 16,
                              "restored": 16, "dropped": 0, "bad_rows": 0}
    for name in ("rlvr1", "mopd"):
        b = meta["blends"][name]
        assert b["source"]["file"] == f"{name}.jsonl" and b["source"]["revision"] is None
        assert b["rows_in"] == 40 and b["rows_out"] == 40 and b["bad_rows"] == 0
        for split in ("train", "val"):
            data = (out / name / f"{split}.jsonl").read_bytes()
            assert b[split] == {"file": f"{split}.jsonl", "rows": data.count(b"\n"), "bytes": len(data),
                                "sha256": hashlib.sha256(data).hexdigest()}
        # NeMo RL's NemoGymDataset keeps every line and json-decodes it: each must be a whole Gym row
        for line in (out / name / "train.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert records.check(row) is None and "_hf_placeholder" not in row
    assert meta["blends"]["mopd"]["placeholders"]["found"] == {"dapo": 3, "skywork": 3}
    stdout = runs[1]["proc"].stdout
    assert "placeholders: 16 found, 16 restored, 0 dropped" in stdout and "2 to prepare, 0 kept" in stdout


@pytest.mark.heavy
def test_output_is_byte_identical_whatever_the_worker_count(runs):
    assert file_hashes(runs[1]["out"]) == file_hashes(runs[2]["out"])


@pytest.mark.heavy
def test_strict_stops_at_the_first_bad_row_with_one_line(runs):
    p = runs["strict"]["proc"]
    assert p.returncode == 2, p.stdout + p.stderr
    messy = runs["strict"]["src"] / "messy.jsonl"
    assert p.stderr.strip() == (f"{PROG}: error: {messy}:3: invalid JSON (Expecting property name enclosed in "
                                "double quotes: line 1 column 2 (char 1)); each line must be one JSON object")
    assert not runs["strict"]["out"].exists()  # nothing written, not even the directory


@pytest.mark.heavy
def test_lenient_run_counts_bad_rows_and_dropped_placeholders(runs):
    out, stdout = runs["lenient"]["out"], runs["lenient"]["proc"].stdout
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["placeholder_sources"] == {"dapo": None, "skywork": meta["placeholder_sources"]["skywork"]}
    rl = meta["blends"]["rlvr1"]["placeholders"]
    assert rl == {"found": {"dapo": 6, "skywork": 4}, "restored": {"skywork": 4}, "dropped": {"dapo": 6}}
    messy = meta["blends"]["messy"]
    assert messy["bad_rows"] == 5 and messy["bad"]["counts"] == {"bad_fields": 3, "bad_placeholder": 1,
                                                                 "invalid_json": 1}
    assert messy["bad"]["examples"]["invalid_json"][0].startswith(f"{runs['lenient']['src'] / 'messy.jsonl'}:3: ")
    assert messy["placeholders"]["dropped"] == {"dapo": 1}  # row 500 of an absent source: dropped, not bad
    assert messy["rows_in"] == 10 and messy["train"]["rows"] == 3 and messy["val"]["rows"] == 1
    assert meta["totals"]["dropped"] == 7 and meta["totals"]["restored"] == 4
    assert "placeholders: 12 found, 4 restored, 7 dropped (dapo 7: set placeholders.dapo.path to restore them)" \
        in stdout
    assert f"bad rows: 5 skipped (the first: {runs['lenient']['src'] / 'messy.jsonl'}:3:" in stdout


@pytest.mark.heavy
def test_sample_run_has_its_own_directory(runs):
    out = runs["sample"]["out"]
    assert sorted(os.listdir(out)) == ["sample-20"]
    meta = json.loads((out / "sample-20" / "metadata.json").read_text())
    assert meta["sample"] == 20 and meta["totals"]["rows_in"] == 40
    assert [r["uuid"] for r in rows(out / "sample-20" / "rlvr1" / "val.jsonl")] == [f"rlvr1-{i:04d}"
                                                                                 for i in range(15, 20)]


@pytest.mark.heavy
def test_rerun_is_a_no_op_and_force_redoes(runs, tmp_path):
    out = tmp_path / "out"  # a copy: the same output, which the config's fingerprint does not place
    shutil.copytree(runs[1]["out"], out)
    cfg = {**runs[1]["config"], "output_dir": str(out)}
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    want = file_hashes(out)
    p = run_script(cfg, tmp_path / "again.yaml", env={"RAY_TMPDIR": str(tmp_path / "ray")})
    assert p.returncode == 0 and f"{out} is up to date" in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "ray").exists() and {q: q.stat().st_mtime_ns for q in out.rglob("*")} == before
    p = run_script({**cfg, "force": True}, tmp_path / "force.yaml")
    assert p.returncode == 0 and "2 to prepare" in p.stdout, p.stdout + p.stderr
    assert file_hashes(out) == want and (out / "metadata.json").stat().st_mtime_ns != before[out / "metadata.json"]
    p = run_script({**cfg, "blends": ["mopd"]}, tmp_path / "fewer.yaml")  # another output: rebuilt, rlvr1 gone
    assert p.returncode == 0 and "rebuilding it" in p.stdout, p.stdout + p.stderr
    assert sorted(os.listdir(out)) == ["metadata.json", "mopd"]


@pytest.mark.heavy
def test_kill_9_mid_run_then_resume_gives_the_same_bytes(tmp_path):
    from conftest import kill_session  # the run and the embedded Ray it started, as a node failure

    # three ~25 MB blends prepared one at a time: long enough to be killed inside the second
    src = tmp_path / "src"
    src.mkdir()
    pad = "x" * 2000
    tiny = rows(TINY / "rlvr1.jsonl")
    for b in ("a", "b", "c"):
        with open(src / f"{b}.jsonl", "w") as f:
            for i in range(12_000):
                f.write(json.dumps({**tiny[i % 40], "uuid": f"{b}-{i}", "context": pad}) + "\n")
    cfg = base_config(tmp_path / "out", source=str(src), blends=["a", "b", "c"], val_rows=100, workers=1)
    reference = run_script({**cfg, "output_dir": str(tmp_path / "reference"), "workers": 2}, tmp_path / "r.yaml")
    assert reference.returncode == 0, reference.stderr
    want = file_hashes(tmp_path / "reference")

    staging = tmp_path / "out" / ".staging-rl"
    proc = start(cfg, tmp_path / "k.yaml", start_new_session=True)
    deadline = time.time() + 120
    while not ((staging / "a.json").exists() and any(".tmp-" in p.name for p in staging.glob("b/*"))):
        assert proc.poll() is None, finish(proc).stdout
        assert time.time() < deadline, "the run never reached the second blend"
        time.sleep(0.01)
    kill_session(proc.pid)
    proc.communicate()
    # nothing under a final name; the killed run's lock stays, and the next run takes it over (its pid is gone)
    assert sorted(os.listdir(tmp_path / "out")) == [".staging-rl", ".ultra3-lock"]
    kept = {f: os.stat(staging / "a" / f) for f in ("train.jsonl", "val.jsonl")}

    p = run_script(cfg, tmp_path / "k.yaml")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 to prepare, 1 kept from an interrupted run" in p.stdout
    assert file_hashes(tmp_path / "out") == want
    for f, st in kept.items():  # the blend finished before the kill was moved into place, not written again
        assert os.stat(tmp_path / "out" / "a" / f).st_ino == st.st_ino
    assert sorted(os.listdir(tmp_path / "out")) == ["a", "b", "c", "metadata.json"]


@pytest.mark.heavy
def test_tiny_through_the_cli(cli):
    r = cli("data", "prep", "rl", "-c", "tiny")
    assert r.rc == 0, r.out + r.err
    published = next(line for line in r.out.splitlines() if line.startswith("published ultra3-rl-data-tiny:v1 -> "))
    out = Path(published.split(" -> ", 1)[1])
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["totals"]["rows_out"] == 80 and meta["totals"]["restored"] == 16
    assert all((out / b / f"{s}.jsonl").is_file() for b in ("rlvr1", "mopd") for s in ("train", "val"))
    r = cli("data", "prep", "rl", "-c", "tiny", "--sample", "10")
    assert r.rc == 0, r.out + r.err
    assert "published ultra3-rl-data-tiny-sample-10:v1 -> " in r.out
