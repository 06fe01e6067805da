"""The rows of an RL blend: what NeMo RL's NeMo Gym path needs of each, and the placeholder rows NVIDIA ships
in place of rows taken from DAPO-Math-17k and Skywork-OR1 (whose licenses keep them out of the blend).

A row is one JSON object on one line: NeMo RL's NemoGymDataset keeps each line of the file and json-decodes it
in `nemo_gym_data_processor` (a blank line would be a row, and fail), and the whole row goes to the Gym agent's
`/run`. What a row must hold:
- `responses_create_params`, an object (the Responses API request for the policy: NeMo Gym's BaseRunRequest),
  whose `input` is a non-empty string or a non-empty list of objects (messages and items);
- `agent_ref.name`, a non-empty string: the Gym agent the row is routed to (NeMo RL's rollouts index
  `row["agent_ref"]["name"]`; MOPD maps it to a teacher).

Placeholder rows: the format of NVIDIA's resolver for the Nano 3 and Super 3 blends (NVIDIA-NeMo/Nemotron,
src/nemotron/data_prep/utils/hf_placeholder.py). The Ultra blends' own fill_placeholders.py lives in the dataset
repo only; the cards of NVIDIA's Ultra-era RL datasets (nvidia/Nemotron-RL-Math-v2) describe the same restoration,
filling `question`, `expected_answer` and `responses_create_params.input[0].content`:

    {"dataset": "..._dapo17k", "_hf_placeholder": {"row": 42, "question_template": {"prefix": P, "suffix": S}}, ...}
    {"dataset": "..._skywork...", "_hf_placeholder": {"row": 7, "question_template": "... {question} ..."}, ...}

`row` is the row number in the source dataset's split (its files in order): DAPO-Math-17k `train`,
Skywork-OR1-RL-Data `math`, from which the question is `prompt[0].content` and the answer
`reward_model.ground_truth`. The source is the one the row's `dataset` names (`dapo` or `skywork` in it), else
the one its template's shape belongs to (prefix/suffix: DAPO; a string: Skywork). Restored:
- DAPO: the source question without DAPO's own instruction wrapper (its first and last paragraphs), between
  the template's prefix and suffix, trailing newlines removed; `question` is that full text.
- Skywork: the template with `{question}` replaced by the source question; `question` is the source question.
- `expected_answer`: the ground truth as a string (Skywork stores a JSON list: its first element); a string
  because Gym's math verifiers declare `expected_answer: str`.
- `responses_create_params.input[0].content` is the full question (an input made of it where there is none);
  `_hf_placeholder` goes, every other field stays where it was.
"""

from __future__ import annotations

import bisect
import json

from .errors import DataPrepError
from .inputs import PARQUET, open_binary
from .line_reader import lines, over

PLACEHOLDER = "_hf_placeholder"
MARK = PLACEHOLDER.encode()
OBJECT = "each line must be one JSON object"


def parse(line: bytes) -> tuple[dict | None, str, str]:
    """(the row, "", "") or (None, kind of bad record, what is wrong; the fix)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, "bad_utf8", f"invalid UTF-8 at byte {e.start}; re-encode the file as UTF-8"
    try:
        row = json.loads(text)
    except ValueError as e:
        return None, "invalid_json", f"invalid JSON ({e}); {OBJECT}"
    if not isinstance(row, dict):
        return None, "invalid_json", f"a JSON {type(row).__name__}, not an object; {OBJECT}"
    return row, "", ""


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def check(row: dict) -> str | None:
    """What a row lacks for NeMo Gym (what is wrong; the fix), or None."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return (f"responses_create_params is {_kind(params)}, not an object; give the request for the policy: "
                '{"input": [{"role": "user", "content": ...}]}')
    prompt = params.get("input")
    if not prompt or not isinstance(prompt, (str, list)):
        return (f"responses_create_params.input is {'empty' if prompt in ('', []) else _kind(prompt)}; give the "
                "prompt as a non-empty string or list of messages")
    if isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if not isinstance(item, dict):
                return (f"responses_create_params.input[{i}] is {_kind(item)}, not an object; each item is a "
                        "message {role, content}")
    ref = row.get("agent_ref")
    if not isinstance(ref, dict):
        what = "no agent_ref" if ref is None else f"agent_ref is {_kind(ref)}, not an object"
    elif not isinstance(ref.get("name"), str) or not ref["name"].strip():
        what = "agent_ref.name is not a non-empty string"
    else:
        return None
    return f'{what}; name the Gym agent that runs the row: "agent_ref": {{"name": ...}}'


def placeholder(row: dict) -> tuple[str, int] | str:
    """(source, row number in it) of a placeholder row, or what is wrong with it; the fix."""
    spec = row[PLACEHOLDER]
    if not isinstance(spec, dict):
        return f"{PLACEHOLDER} is {_kind(spec)}, not an object; restore the row from the published blend"
    index, template = spec.get("row"), spec.get("question_template")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        return f"{PLACEHOLDER}.row is {index!r}, not a row number; restore the row from the published blend"
    dataset = str(row.get("dataset") or "").lower()
    source = next((s for s in ("dapo", "skywork") if s in dataset), None)
    if source is None:
        source = "dapo" if isinstance(template, dict) else "skywork" if isinstance(template, str) else None
    if source is None:
        return (f"the placeholder names no source (dataset {row.get('dataset')!r}, no question_template); "
                "restore the row from the published blend")
    if source == "dapo":
        fits = isinstance(template, dict) and all(isinstance(template.get(k, ""), str) for k in ("prefix", "suffix"))
    else:
        fits = isinstance(template, str)
    if template is not None and not fits:
        return (f"{PLACEHOLDER}.question_template is not a {source} template "
                f"({'{prefix, suffix}' if source == 'dapo' else 'a string'}); restore the row from the published blend")
    return source, index


def restore(row: dict, source: str, question: str, answer: str) -> dict:
    """The placeholder row with the source's question and answer in place (see the module doc)."""
    template = row[PLACEHOLDER].get("question_template")
    if source == "dapo":
        full = question
        if template is not None:
            paragraphs = question.split("\n\n")
            body = "\n\n".join(paragraphs[1:-1]) if len(paragraphs) >= 3 else question
            full = (template.get("prefix", "") + body + template.get("suffix", "")).rstrip("\n")
        shown = full
    else:
        full = template.replace("{question}", question) if template and "{question}" in template else question
        shown = question
    restored = {k: v for k, v in row.items() if k != PLACEHOLDER}
    restored["question"], restored["expected_answer"] = shown, answer
    params = restored.get("responses_create_params")
    params = dict(params) if isinstance(params, dict) else {}
    prompt = params.get("input")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        params["input"] = [{**prompt[0], "content": full}, *prompt[1:]]
    else:
        params["input"] = [{"role": "user", "content": full}]
    restored["responses_create_params"] = params
    return restored


def _answer(truth) -> str | None:
    if isinstance(truth, str):
        try:
            value = json.loads(truth)
        except ValueError:
            return truth
        truth = value[0] if isinstance(value, list) and value else truth
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        return None
    return str(truth)


def _question_answer(record, where: str) -> tuple[str, str] | str:
    """(question, answer) of a source row, or what is wrong with it."""
    prompt = record.get("prompt") if isinstance(record, dict) else None
    first = prompt[0] if isinstance(prompt, list) and prompt else None
    question = first.get("content") if isinstance(first, dict) else None
    truth = record.get("reward_model") if isinstance(record, dict) else None
    answer = _answer(truth.get("ground_truth")) if isinstance(truth, dict) else None
    if not isinstance(question, str) or not question.strip():
        return f"{where} has no prompt[0].content"
    if answer is None:
        return f"{where} has no reward_model.ground_truth"
    return question, answer


def fetch(files: list, wanted: set, max_bytes: int) -> tuple[dict, int]:
    """{row number: (question, answer) or what is wrong with that source row} for the `wanted` rows of a
    source dataset (`files`: [(path, format)] in order), and how many rows it has."""
    found: dict = {}
    offset = 0
    order = sorted(wanted)
    for path, fmt in files:
        if fmt == PARQUET:
            rows = _parquet_rows(path, order, offset, found)
        else:
            rows = _jsonl_rows(path, fmt, order, offset, found, max_bytes)
        offset += rows
    return found, offset


def _parquet_rows(path: str, order: list, offset: int, found: dict) -> int:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    missing = [c for c in ("prompt", "reward_model") if c not in pf.schema_arrow.names]
    if missing:
        raise DataPrepError(f"{path} has no column {' or '.join(missing)}: not a DAPO-Math-17k or Skywork-OR1 file")
    start = offset
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        rows = order[bisect.bisect_left(order, start):bisect.bisect_left(order, start + n)]
        if rows:
            table = pf.read_row_group(g, columns=["prompt", "reward_model"]).take([r - start for r in rows])
            for r, record in zip(rows, table.to_pylist()):
                found[r] = _question_answer(record, f"row {r} ({path}:row={r - offset})")
        start += n
    return start - offset


def _jsonl_rows(path: str, fmt: str, order: list, offset: int, found: dict, max_bytes: int) -> int:
    wanted = set(order)
    n = 0
    with open_binary(path, fmt) as f:
        for lineno, line in enumerate(lines(f, max_bytes), 1):
            if line is not None and not line.strip():
                continue
            if offset + n in wanted:
                record, _, problem = parse(line) if line is not None else (None, "", over(max_bytes))
                where = f"row {offset + n} ({path}:{lineno})"
                found[offset + n] = _question_answer(record, where) if record is not None else f"{where}: {problem}"
            n += 1
    return n
