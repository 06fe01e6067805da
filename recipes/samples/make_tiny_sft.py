"""Generate the tiny SFT sample used by the `tiny` SFT data-prep config and the tests.

    python -m recipes.samples.make_tiny_sft [--out recipes/samples/tiny] [--conversations 1500]

Writes `sft.jsonl.gz`: one `{"id", "messages": [{"role", "content"}, ...]}` conversation per line
(some with `tools`, `reasoning_content` and `tool_calls`), generated deterministically (seeded) from the
word lists and sentence patterns of `make_tiny.py`, so it is free of third-party text and identical on
every machine (gzip without a timestamp). The mix:

* single-turn question/answer, some with a system prompt;
* multi-turn chats of 2-4 rounds;
* answers with reasoning (`reasoning_content`, rendered as <think>...</think>);
* tool use: the assistant calls a tool (`tool_calls`), one `tool` result comes back, it answers;
* long-tailed lengths: answer sizes are lognormal, and a few long stories exceed the tiny 512-token
  pack so that truncation is exercised.

`conversations(seed)` is imported by the tests to make more data of the same kind.
"""

from __future__ import annotations

import argparse
import math
import os
import random
from collections.abc import Iterator

from .make_tiny import FIELDS, NAMES, NOUNS, PLACES, sentence, story, write_jsonl_gz

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a patient teacher who answers in plain words.",
    "You are a librarian in a small town. Keep answers short.",
    "Answer as a careful historian would, and say when you are unsure.",
    "You are a friendly guide for travelers.",
]
QUESTIONS = [
    "Tell me about {np}.",
    "What happened to {np} in {place}?",
    "Can you describe {place} for me?",
    "Why did {name} leave {place}?",
    "Write a short note about {field}.",
    "What do you know about the {noun}?",
    "Summarize the story of {name} and the {noun}.",
    "How would you explain {field} to a child?",
]
FOLLOW_UPS = ["Tell me more.", "Why?", "And then what happened?", "Can you say that more simply?",
              "What about {name}?", "Is that true of {place} as well?", "Give me one more example."]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a town.",
    "parameters": {"type": "object", "properties": {"town": {"type": "string"}}}}}
LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup_entry", "description": "Look a subject up.",
    "parameters": {"type": "object", "properties": {"subject": {"type": "string"}, "lines": {"type": "integer"}}}}}
WEATHER = ["sunny", "raining", "foggy", "snowing", "windy", "overcast"]


def _question(rng: random.Random) -> str:
    return rng.choice(QUESTIONS).format(np=f"the {rng.choice(NOUNS)}", place=rng.choice(PLACES),
                                        name=rng.choice(NAMES), field=rng.choice(FIELDS), noun=rng.choice(NOUNS))


def _answer(rng: random.Random, mean_sentences: float = 2.0) -> str:
    n = max(1, min(40, round(rng.lognormvariate(math.log(mean_sentences), 0.8))))
    return " ".join(sentence(rng) for _ in range(n))


def conversation(rng: random.Random) -> dict:
    kind = rng.random()
    messages: list[dict] = []
    record: dict = {}
    if rng.random() < 0.35:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if kind < 0.12:  # tool use
        town = rng.choice(PLACES)
        if rng.random() < 0.5:
            record["tools"] = [WEATHER_TOOL]
            messages.append({"role": "user", "content": f"What is the weather in {town}? Should I visit {town}?"})
            calls = [{"type": "function", "function": {"name": "get_weather", "arguments": {"town": town}}}]
            results = [f"{rng.choice(WEATHER)}, {rng.randint(-5, 30)} degrees"]
        else:
            record["tools"] = [LOOKUP_TOOL]
            subject = f"the {rng.choice(NOUNS)}"
            messages.append({"role": "user", "content": f"What is {subject}?"})
            calls = [{"type": "function", "function": {"name": "lookup_entry",
                                                       "arguments": {"subject": subject, "lines": rng.randint(2, 5)}}}]
            results = [_answer(rng, 1.5) for _ in calls]
        messages.append({"role": "assistant", "content": "Let me look that up." if rng.random() < 0.5 else "",
                         "tool_calls": calls})
        messages += [{"role": "tool", "content": r} for r in results]
        messages.append({"role": "assistant", "content": _answer(rng, 1.5)})
    elif kind < 0.30:  # reasoning
        messages.append({"role": "user", "content": _question(rng)})
        messages.append({"role": "assistant", "reasoning_content": _answer(rng, 2.0), "content": _answer(rng, 1.5)})
    elif kind < 0.55:  # multi-turn
        messages.append({"role": "user", "content": _question(rng)})
        messages.append({"role": "assistant", "content": _answer(rng)})
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": rng.choice(FOLLOW_UPS).format(
                name=rng.choice(NAMES), place=rng.choice(PLACES))})
            messages.append({"role": "assistant", "content": _answer(rng, 1.5)})
    elif kind < 0.57:  # a long story: longer than the tiny pack, exercises truncation
        messages.append({"role": "user", "content": f"Write a long story about {rng.choice(PLACES)}."})
        messages.append({"role": "assistant", "content": "\n\n".join(story(rng) for _ in range(rng.randint(2, 4)))})
    else:  # single turn
        messages.append({"role": "user", "content": _question(rng)})
        messages.append({"role": "assistant", "content": _answer(rng)})
    return {**record, "messages": messages}


def conversations(seed: int = 3) -> Iterator[dict]:
    """An endless, seeded stream of conversations `{"id", "messages", ["tools"]}`."""
    rng = random.Random(seed)
    i = 0
    while True:
        yield {"id": f"chat-{seed}-{i:06d}", **conversation(rng)}
        i += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny"))
    parser.add_argument("--conversations", type=int, default=1500)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = conversations()
    path = os.path.join(args.out, "sft.jsonl.gz")
    write_jsonl_gz(path, [next(gen) for _ in range(args.conversations)])
    print(f"{path}: {os.path.getsize(path):,} bytes")


if __name__ == "__main__":
    main()
