"""Generate the tiny RL blends used by the `tiny` RL data-prep config and the tests.

    python -m recipes.samples.make_tiny_rl [--out recipes/samples/tiny/rl]

Writes, deterministically (seeded, no third-party text, identical on every machine):

* `rlvr1.jsonl` and `mopd.jsonl`: 40 NeMo Gym rows each (`responses_create_params.input`, `agent_ref`, and
  the fields of their Gym environment: math questions with `expected_answer`, multiple choice with `options`,
  instruction following with `instruction_id_list`/`kwargs`), among them placeholder rows in NVIDIA's format
  (`_hf_placeholder: {row, question_template}`, see recipes/dataprep/rl_records.py) for both sources, some
  in the last 5 rows (the tiny validation split), one whose `dataset` names no source (its template does);
* `sources/dapo-math-17k.jsonl` and `sources/skywork-or1-math.jsonl`: the tiny source datasets the
  placeholders point into, in the two datasets' row shapes (`prompt[0].content`,
  `reward_model.ground_truth`; DAPO's question inside an instruction paragraph before and after, Skywork's
  ground truth a JSON list).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random

from .make_tiny import NAMES, NOUNS, PLACES

SOURCE_ROWS = {"dapo": 24, "skywork": 16}
BLENDS = {  # name: (seed, rows, DAPO placeholders, Skywork placeholders)
    "rlvr1": (11, 40, 6, 4),
    "mopd": (12, 40, 3, 3),
}
MATH_AGENT = "math_with_judge_simple_agent"
DAPO_TEMPLATE = {"prefix": "Work through the problem and give only the final number in \\boxed{}.\n\n",
                 "suffix": "\n\nCheck the arithmetic before you answer.\n"}
SKYWORK_TEMPLATE = "{question}\n\nThink it through, then put the final answer within \\boxed{}."


def word_problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(3, 60), rng.randint(2, 19)
    name, noun, place = rng.choice(NAMES), rng.choice(NOUNS), rng.choice(PLACES)
    kind = rng.randrange(4)
    if kind == 0:
        return f"{name} packs {a} crates of {b} {noun}s each in {place}. How many {noun}s are packed?", str(a * b)
    if kind == 1:
        return f"What is the remainder when {a * b + a % b} is divided by {b}?", str((a * b + a % b) % b)
    if kind == 2:
        return (f"{name} walks {a} miles to {place} and {b} miles back.\n\nHow many miles does {name} walk in all?",
                str(a + b))
    return f"Find the greatest common divisor of {a * b} and {b * 6}.", str(math.gcd(a * b, b * 6))


def source_rows(source: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(SOURCE_ROWS[source]):
        question, answer = word_problem(rng)
        if source == "dapo":
            prompt = (f"Solve the problem below. End with a line of the form Answer: $Answer.\n\n{question}\n\n"
                      "Write the answer on its own line after \"Answer:\".")
            rows.append({"data_source": "tiny_math_dapo", "prompt": [{"content": prompt, "role": "user"}],
                         "ability": "MATH", "reward_model": {"ground_truth": answer, "style": "rule"},
                         "extra_info": {"index": f"dapo-{i:04d}"}})
        else:
            rows.append({"data_source": "tiny_skywork_math", "prompt": [{"content": question, "role": "user"}],
                         "ability": "math", "reward_model": {"ground_truth": json.dumps([answer]), "style": "rule"},
                         "extra_info": {"index": i, "model_difficulty": {"DeepSeek-R1-Distill-Qwen-7B": i % 17}}})
    return rows


def _agent(name: str) -> dict:
    return {"type": "responses_api_agents", "name": name}


def math_row(rng: random.Random, blend: str, i: int) -> dict:
    question, answer = word_problem(rng)
    prompt = f"Solve the following problem and put the answer in \\boxed{{}}.\n\n{question}"
    return {"responses_create_params": {"input": [{"role": "user", "content": prompt}]}, "question": question,
            "expected_answer": answer, "agent_ref": _agent(MATH_AGENT), "dataset": f"tiny_{blend}_math",
            "uuid": f"{blend}-{i:04d}"}


def choice_row(rng: random.Random, blend: str, i: int) -> dict:
    values = rng.sample(range(2, 99), 4)
    options = [{letter: str(v)} for letter, v in zip("ABCD", values)]
    answer = "ABCD"[values.index(max(values))]
    prompt = "Which number is the largest? Answer with the letter in \\boxed{}.\n" + "\n".join(
        f"{letter}: {v}" for letter, v in zip("ABCD", values))
    return {"responses_create_params": {"input": [{"role": "user", "content": prompt}]}, "options": options,
            "expected_answer": answer, "grading_mode": "strict_single_letter_boxed",
            "agent_ref": _agent("mcqa_simple_agent"), "dataset": f"tiny_{blend}_mcqa", "uuid": f"{blend}-{i:04d}"}


def instruction_row(rng: random.Random, blend: str, i: int) -> dict:
    n, place = rng.randint(2, 5), rng.choice(PLACES)
    prompt = f"Write a short note about the market in {place} in exactly {n} sentences."
    return {"responses_create_params": {"input": [{"role": "system", "content": "You are a careful writer."},
                                                  {"role": "user", "content": prompt}]},
            "id": i, "prompt": prompt, "instruction_id_list": ["length_constraints:number_sentences"],
            "kwargs": [{"num_sentences": n, "relation": "exactly"}],
            "agent_ref": _agent("instruction_following_simple_agent"), "dataset": f"tiny_{blend}_if",
            "uuid": f"{blend}-{i:04d}"}


def placeholder_row(blend: str, i: int, source: str, row: int, named: bool = True) -> dict:
    template = DAPO_TEMPLATE if source == "dapo" else SKYWORK_TEMPLATE
    dataset = {"dapo": f"tiny_{blend}_dapo17k", "skywork": f"tiny_{blend}_skywork_or1"}[source]
    out = {"question": "", "expected_answer": "", "agent_ref": _agent(MATH_AGENT),
           "dataset": dataset if named else f"tiny_{blend}_masked_math", "uuid": f"{blend}-{i:04d}",
           "_hf_placeholder": {"row": row, "question_template": template}}
    if i % 2:  # half of them carry the masked request, half none
        out = {"responses_create_params": {"input": [{"role": "user", "content": ""}]}, **out}
    return out


def blend_rows(blend: str) -> list[dict]:
    seed, n, dapo, skywork = BLENDS[blend]
    rng = random.Random(seed)
    # placeholder positions: spread over the blend, the last of each in the validation tail (last 5 rows)
    spots = sorted(rng.sample(range(n - 5), dapo + skywork - 2)) + [n - 4, n - 2]
    kinds = ["dapo"] * (dapo - 1) + ["skywork"] * (skywork - 1)
    rng.shuffle(kinds)
    kinds += ["dapo", "skywork"]
    placed = dict(zip(spots, kinds))
    rows = []
    for i in range(n):
        if i in placed:
            source = placed[i]
            row = rng.randrange(SOURCE_ROWS[source])
            rows.append(placeholder_row(blend, i, source, row, named=not (blend == "mopd" and i == spots[0])))
        else:
            rows.append(rng.choice((math_row, math_row, choice_row, instruction_row))(rng, blend, i))
    return rows


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny", "rl"))
    args = parser.parse_args()
    os.makedirs(os.path.join(args.out, "sources"), exist_ok=True)
    files = {f"{b}.jsonl": blend_rows(b) for b in BLENDS}
    files["sources/dapo-math-17k.jsonl"] = source_rows("dapo", 21)
    files["sources/skywork-or1-math.jsonl"] = source_rows("skywork", 22)
    for name, rows in files.items():
        path = os.path.join(args.out, name)
        write_jsonl(path, rows)
        print(f"{path}: {len(rows)} rows, {os.path.getsize(path):,} bytes")


if __name__ == "__main__":
    main()
