"""One parseable line per GRPO step from NeMo RL's own printout (its grpo.py at the pinned commit prints each step
as a block: a `===== Step N/M =====` header, then `📊 Training Results:` with `• Loss`, `• Generation KL Error`,
`• Avg Reward`, then `⏱️  Timing:` with `• Total step time: Xs` and `• <timer>: Xs (P%)` a line):

    rl: step 2/3 reward 0.2500 kl 0.000312 loss -0.0104 step_s 41.20 generation_s 12.31 training_s 9.87

`kl` is what NeMo RL prints as the Generation KL Error (the generation engine's log-probabilities against the
training policy's: NeMo RL prints no other KL per step); `generation_s` and `training_s` are its `generation` and
`policy_training` timers. benchmarks/gpu_smoke.py reads these lines back (STEP_LINE)."""

from __future__ import annotations

import re

HEADER = re.compile(r"^=+ Step (\d+)/(\d+) =+$")
VALUE = re.compile(r"^• (Loss|Generation KL Error|Avg Reward|Total step time|generation|policy_training): "
                   r"(-?[\d.]+(?:e[-+]?\d+)?)s?(?: \(|$)")
FIELDS = {"Avg Reward": "reward", "Generation KL Error": "kl", "Loss": "loss", "Total step time": "step_s",
          "generation": "generation_s", "policy_training": "training_s"}
STEP_LINE = re.compile(r"^rl: step (\d+)/(\d+)((?: \w+ -?[\d.]+(?:e[-+]?\d+)?)+)$")


class StepLog:
    """Feed it NeMo RL's output line by line; `feed` returns the summary line of a step once the next step's
    header (or `close`) ends its block."""

    def __init__(self) -> None:
        self.step: tuple[str, str] | None = None
        self.values: dict[str, str] = {}

    def feed(self, line: str) -> str | None:
        text = line.strip()
        if header := HEADER.match(text):
            done = self.close()
            self.step = header.groups()
            return done
        if self.step and (value := VALUE.match(text)):
            self.values.setdefault(FIELDS[value[1]], value[2])
        return None

    def close(self) -> str | None:
        step, values = self.step, self.values
        self.step, self.values = None, {}
        if not step or "reward" not in values:  # a block without training results (e.g. cut short)
            return None
        fields = " ".join(f"{name} {values[name]}" for name in FIELDS.values() if name in values)
        return f"rl: step {step[0]}/{step[1]} {fields}"


def parse(line: str) -> dict | None:
    """A STEP_LINE as {'step': N, 'steps': M, 'reward': ..., ...}, or None."""
    match = STEP_LINE.match(line.strip())
    if not match:
        return None
    words = match[3].split()
    return {"step": int(match[1]), "steps": int(match[2]),
            **{words[i]: float(words[i + 1]) for i in range(0, len(words), 2)}}
