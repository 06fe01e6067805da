"""Hostile input through the installed CLI: inputs built to hang or crash the launcher (a YAML alias bomb of a
few hundred bytes, the same made of `${...}` interpolations, a 5,000-digit integer, TOML nested 100,000 deep) and
values that would quietly pass (a NaN or negative NeMo RL learning rate, a port past 65535, a pipe's unknown keys,
a mistyped artifact reference) each end in one error line naming the key or file, exit code 2, no traceback and
nothing written. A generous timeout on each command turns a regression into a failure instead of a hang."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

RL = ["rl", "rlvr", "-c", "tiny", "--batch", "ci", "-d", "policy=/lustre/ckpt/sft-hf", "data.dir=/lustre/data/rl"]
LR = "nemo_rl.policy.megatron_cfg.optimizer.lr"
COUNT = "nemo_rl.grpo.num_prompts_per_step"


def laughs(levels: int) -> list[str]:
    """A "billion laughs": each line's anchor repeats the one before it nine times (9**levels values)."""
    lines = ["a: &a [l,l,l,l,l,l,l,l,l]"]
    for before, name in zip("abcdefghi", "bcdefghij"[:levels - 1]):
        lines.append(f"{name}: &{name} [{','.join([f'*{before}'] * 9)}]")
    return lines


CONFIG_BOMB = "\n".join(["defaults: [tiny]", *laughs(7)]) + "\n"
OVERRIDE_BOMB = "x={" + ", ".join(laughs(6)) + "}"


def references(levels: int, table: bool = False) -> list[str]:
    """Laughs made of interpolations: each key of x names the one before nine times, in a list or a table
    (9**levels values once resolved, the same from OmegaConf's resolution as from YAML's aliases)."""
    lines = ["a: [l,l,l,l,l,l,l,l,l]"]
    for before, name in zip("abcdefghi", "bcdefghij"[:levels - 1]):
        refs = [f"'${{x.{before}}}'"] * 9
        lines.append(f"{name}: " + ("{" + ", ".join(f"{k}: {r}" for k, r in zip("pqrstuvwz", refs)) + "}" if table
                                    else f"[{','.join(refs)}]"))
    return lines


def doubled(levels: int) -> list[str]:
    """Strings that each join the one before four times (10 * 4**levels characters once resolved)."""
    return ["a: '0123456789'", *(f"{n}: '{f'${{s.{b}}}' * 4}'" for b, n in zip("abcdefghijklm",
                                                                              "bcdefghijklmn"[:levels]))]


def decoded(levels: int) -> list[str]:
    """Overrides whose references are escaped text that oc.decode reads as a value: each key names the one before
    nine times once decoded (9**levels values, none of them a reference until it resolves)."""
    return ["x.a=[1,2,3]", *("x.%s=${oc.decode:'[%s]'}" % (n, ",".join([r"\${x.%s}" % b] * 9))
                             for b, n in zip("abcdefghi", "bcdefghij"[:levels - 1]))]


REFERENCE_BOMB = "defaults: [tiny]\nx:\n" + "".join(f"  {line}\n" for line in references(7, table=True))


@dataclass
class Case:
    id: str
    args: list[str]
    error: str  # a regex for the one stderr line, matched after "error: "
    files: dict[str, str] = field(default_factory=dict)  # written in the cwd first

    @property
    def bounded(self) -> bool:
        """Built to hang, take the memory or blow the stack: run with a timeout in a process of its own. The wrong
        values that were only accepted run in the test's process."""
        return not self.id.startswith(("nemo-rl-", "sandbox-", "ray-address-", "env-nan", "pipe-", "reference-"))


CASES = [
    # -- alias bombs: refused while the YAML is composed, before anything expands --------------------------------
    Case("alias-bomb-config", ["pretrain", "-c", "./bomb.yaml", "-d"],
         r"\S*/bomb\.yaml:\d+: aliases \(\*\w\) repeat more than 10,000 values; write the values out",
         files={"bomb.yaml": CONFIG_BOMB}),
    Case("alias-bomb-override", ["pretrain", "-c", "tiny", "-d", OVERRIDE_BOMB],
         r"x: aliases \(\*\w\) repeat more than 10,000 values \(set in command line\); write the values out"),
    Case("alias-bomb-pipe", ["pipe", "-c", "./bomb.yaml", "-d"],
         r"bomb\.yaml:\d+: aliases \(\*\w\) repeat more than 10,000 values",
         files={"bomb.yaml": "stages: {}\n" + "\n".join(laughs(7)) + "\n"}),
    Case("alias-inside-itself", ["pretrain", "-c", "./loop.yaml", "-d"],
         r"\S*/loop\.yaml:2: alias \*a is inside the value it names; give the value itself$",
         files={"loop.yaml": "defaults: [tiny]\nx: &a {y: *a}\n"}),
    # -- interpolation bombs: refused before OmegaConf copies a value, by counting what the references would copy ---
    Case("interpolation-bomb-config", ["pretrain", "-c", "./bomb.yaml", "-d"],
         r"x\.\w\.\w: interpolations \(\$\{x\.\w\}\) repeat more than 10,000 values \(set in \S*/bomb\.yaml\); write "
         r"the values out or use fewer interpolations$", files={"bomb.yaml": REFERENCE_BOMB}),
    Case("interpolation-bomb-override", ["pretrain", "-c", "tiny", "-d", "x={" + ", ".join(references(7)) + "}"],
         r"x\.\w: interpolations \(\$\{x\.\w\}\) repeat more than 10,000 values \(set in command line\); write "
         r"the values out or use fewer interpolations$"),
    Case("interpolation-bomb-pipe", ["pipe", "-c", "./p.yaml", "-d"],
         r"pretrain: x\.\w: interpolations \(\$\{x\.\w\}\) repeat more than 10,000 values \(set in p\.yaml "
         r"\[pretrain\]\); ",
         files={"p.yaml": "stages:\n  pretrain:\n    stage: pretrain\n    config: tiny\n    overrides:\n"
                          + "".join(f"      x.{line}\n" for line in references(7))}),
    Case("interpolation-bomb-strings", ["pretrain", "-c", "./bomb.yaml", "-d"],
         r"s\.\w: interpolations \((\$\{s\.\w\}){4}\) repeat more than 1,000,000 characters \(set in "
         r"\S*/bomb\.yaml\); ",
         files={"bomb.yaml": "defaults: [tiny]\ns:\n" + "".join(f"  {line}\n" for line in doubled(13))}),
    Case("interpolation-bomb-env-toml", ["pretrain", "-c", "tiny", "-d", "--env-file", "bomb.toml", "--run", "p"],
         r"s\w: interpolations \((\$\{s\w\}){4}\) repeat more than 1,000,000 characters \(set in bomb\.toml \[p\]\); ",
         files={"bomb.toml": '[p]\nexecutor = "local"\ns0 = "0123456789"\n'
                             + "".join(f's{i} = "{f"${{s{i - 1}}}" * 4}"\n' for i in range(1, 14))}),
    Case("interpolation-bomb-oc-decode", ["pretrain", "-c", "tiny", "-d", *decoded(7)],
         r"x\.b: oc\.decode reads text as a value while it resolves, which can repeat values without bound \(set in "
         r"command line\); write the value out$"),
    Case("interpolation-chain-1000-deep", ["pretrain", "-c", "./chain.yaml", "-d"],
         r"x\.k\d+: interpolations nested more than 32 deep, each inside or naming the next \(set in "
         r"\S*/chain\.yaml\); name the value itself$",
         files={"chain.yaml": "defaults: [tiny]\nx:\n" + "".join(f"  k{i}: ${{x.k{i + 1}}}\n" for i in range(1000))
                              + "  k1000: 1\n"}),
    # -- numbers past what a config holds --------------------------------------------------------------------------
    Case("int-5000-digits-override", ["pretrain", "-c", "tiny", "-d", "train.train_iters=" + "1" * 5000],
         r"train\.train_iters: an integer of more than 100 digits \(set in command line\); a config's integers fit "
         r"in 64 bits \(19 digits\)$"),
    Case("int-5000-digits-config", ["pretrain", "-c", "./big.yaml", "-d"],
         r"\S*/big\.yaml:3: an integer of more than 100 digits; ",
         files={"big.yaml": "defaults: [tiny]\ntrain:\n  train_iters: " + "1" * 5000 + "\n"}),
    Case("int-5000-digits-env-toml", ["pretrain", "-c", "tiny", "-d", "--env-file", "big.toml", "--run", "p"],
         r"big\.toml: an integer of more than 100 digits; ",
         files={"big.toml": '[p]\nexecutor = "local"\nnodes = ' + "1" * 5000 + "\n"}),
    Case("int-5000-hex-digits-env-toml", ["pretrain", "-c", "tiny", "-d", "--env-file", "hex.toml", "--run", "p"],
         r"hex\.toml \[p\] nodes: an integer of more than 100 digits; ",
         files={"hex.toml": '[p]\nexecutor = "local"\nnodes = 0x' + "f" * 5000 + "\n"}),
    Case("env-toml-arrays-100000-deep", ["pretrain", "-c", "tiny", "-d", "--env-file", "deep.toml", "--run", "p"],
         r"deep\.toml: nested more than 32 levels deep; a config is a few levels of tables$",
         files={"deep.toml": '[p]\nexecutor = "local"\nsetup = ' + "[" * 100_000 + "]" * 100_000 + "\n"}),
    Case("env-toml-arrays-40-deep", ["pretrain", "-c", "tiny", "-d", "--env-file", "deep.toml", "--run", "p"],
         r"deep\.toml \[p\] setup: nested more than 32 levels deep; ",
         files={"deep.toml": '[p]\nexecutor = "local"\nsetup = ' + "[" * 40 + "]" * 40 + "\n"}),
    Case("yaml-100000-deep", ["pretrain", "-c", "./deep.yaml", "-d"],
         r"\S*/deep\.yaml:1: nested more than 32 levels deep; ", files={"deep.yaml": "x: " + "[" * 100_000 + "\n"}),
    Case("override-key-100-deep", ["pretrain", "-c", "tiny", "-d", ".".join(["a"] * 100) + "=1"],
         r"(a\.){99}a: nested more than 32 levels deep \(set in command line\); "),
    Case("nemo-rl-count-1e400", [*RL, f"{COUNT}=1e400"],
         rf"{COUNT}: must be a finite number, got inf \(set in command line\)$"),
    Case("nemo-rl-count-nan", [*RL, f"{COUNT}=.nan"],
         rf"{COUNT}: must be a finite number, got nan \(set in command line\)$"),
    Case("nemo-rl-add-list-inf", [*RL, "nemo_rl_add.extra=[1, -.inf]"],
         r"nemo_rl_add\.extra\[1\]: must be a finite number, got -inf \(set in command line\)$"),
    Case("nemo-rl-int-past-64-bits", [*RL, "nemo_rl.grpo.seed=" + "9" * 30],
         r"nemo_rl\.grpo\.seed: must be an integer within 64 bits, got 9{30} \(set in command line\)$"),
    Case("nemo-rl-lr-nan", [*RL, f"{LR}=.nan"], rf"{LR}: must be a finite number, got nan \(set in command line\)$"),
    Case("nemo-rl-lr-negative", [*RL, f"{LR}=-1e-6"], rf"{LR}: lr=-1e-06 must be positive$"),
    Case("nemo-rl-lr-below-min-lr", [*RL, f"{LR}=1e-6"],
         r"nemo_rl\.policy\.megatron_cfg\.optimizer\.min_lr: min_lr=4e-06 > lr=1e-06; .*set min_lr ≤ lr "
         rf"\[{LR}=1e-06 from command line\]$"),
    Case("sandbox-port", [*RL, "sandbox.port=99999"],
         r"sandbox\.port: must be an integer from 1 to 65535, got 99999 \(set in command line\)$"),
    *[Case(f"ray-address-port-{port}", ["data", "prep", "pretrain", "-c", "tiny", "-d", "--env-file", "ray.toml",
                                         "--batch", "r", f"run.address=http://head:{port}"],
           rf"run\.address: must be a Ray dashboard address such as http://head:8265 \(a port from 1 to 65535\), got "
           rf"'http://head:{port}' \(set in command line\)$",
           files={"ray.toml": '[r]\nexecutor = "ray"\naddress = "http://head:8265"\n'}) for port in (0, 65536, 99999)],
    Case("env-nan", ["pretrain", "-c", "tiny", "-d", "run.env.RATE=.nan"],
         r"run\.env\.RATE: must be a finite number, got nan \(set in command line\)$"),
    # -- pipe configs: no key is silently dropped ------------------------------------------------------------------
    Case("pipe-defaults", ["pipe", "-c", "./p.yaml", "-d"], r"p\.yaml defaults: unknown key; known keys: stages$",
         files={"p.yaml": "defaults: [tiny]\nstages:\n  pretrain: {stage: pretrain, config: tiny}\n"}),
    Case("pipe-overides", ["pipe", "-c", "./p.yaml", "-d"],
         r"p\.yaml stages\.pretrain\.overides: unknown key; did you mean 'overrides'\?$",
         files={"p.yaml": "stages:\n  pretrain:\n    stage: pretrain\n    config: tiny\n"
                          "    overides: {train.train_iters: 3}\n"}),
    # -- artifact references: a mistyped one is no relative path ---------------------------------------------------
    *[Case(f"reference-{name}", [*RL, f"policy={given}"],
           rf"policy: '{re.escape(ref)}' is not an artifact reference \(set in command line\); write NAME:latest, "
           rf"NAME:vN or job:ID, or \./{re.escape(ref)} for a path$")
      for name, given, ref in (("upper-case", "NAME:LATEST", "NAME:LATEST"), ("negative-version", "NAME:v-1",
                                "NAME:v-1"), ("no-name", ":latest", ":latest"), ("job-without-id", "'job:'", "job:"))],
]


def test_cases_are_distinct():
    assert len({c.id for c in CASES}) == len(CASES)
    assert 180 <= len(OVERRIDE_BOMB) <= 300 and 180 <= len(CONFIG_BOMB) <= 300  # as small as the ones reported
    assert len(REFERENCE_BOMB) <= 800


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, cli, cli_here, home, tmp_path):
    for name, text in case.files.items():
        (tmp_path / "work" / name).write_text(text)

    r = cli(*case.args, timeout=120) if case.bounded else cli_here(*case.args)

    assert r.rc == 2, f"rc {r.rc}\nstdout:\n{r.out[-2000:]}\nstderr:\n{r.err[-2000:]}"
    assert len(r.err_lines) == 1, f"expected one error line, got:\n{r.err[-2000:]}"
    assert re.match("error: " + case.error, r.err_lines[0]), r.err_lines[0][:500]
    assert "Traceback" not in r.out + r.err
    assert not home.exists() or not any(home.iterdir()), f"written under NEMOTRON_HOME: {list(home.rglob('*'))}"
