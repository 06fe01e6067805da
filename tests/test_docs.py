"""Every command example of README.md and docs/*.md runs, against the profiles of the shipped env.toml.example.

A command example is a line of a ```bash, ```sh, ```console or unlabelled block (of any block but ```toml,
```yaml, ```json and ```text) that starts with `ultra3 `, `nemotron ` or `uv run nemotron `, or with `$ ` and
one of those (after `VAR=value` assignments, if any). The fast test runs those that need no Ray and no torch;
the heavy one the real runs that do, and the commands on the jobs and artifacts they make.
"""

# Transcripts: in a ```console block a `$ ` line is a command, run as written; the lines up to the next `$ ` are
# its output, copied from a real run. Each must appear in the real output (stdout and stderr), in order: `...`
# on its own elides lines, `...` in a line elides part of it, `<name>` stands for what differs between runs
# (<cwd>, <host>, a date), and job ids and pids may differ. A shown `error:` line means the command fails, else
# it must exit 0; `$ echo $?` shows its exit code. Commands outside transcripts that would submit run with
# --dry-run added and must exit 0. A block of a file (```yaml, ```jsonl) whose first line is `# <path>: ...` is
# written to <path> first.

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLE_ENV = REPO / "env.toml.example"
TEXT_LANGS = {"toml", "yaml", "yml", "json", "jsonl", "text"}  # blocks whose lines are never commands
FILE_LANGS = {"yaml", "yml", "json", "jsonl"}  # blocks that can be files the examples read
ARTIFACT = re.compile(r"=ultra3-[a-z0-9-]+:(latest|v\d+)$")  # a NAME:vN input
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_][A-Z0-9_]*=\S* )*(?:ultra3|nemotron|uv run nemotron)(?: |$)")
JOB_ID = re.compile(r"\b((?:ultra3-[a-z0-9-]+)|(?:pipe-\w+?))_\d{8}-\d{6}-[0-9a-f]{6}\b")
PLACEHOLDER = re.compile(r"(\.\.\.|<[A-Za-z][\w .:/-]*>)")
DRY = {"-d", "--dry-run", "-h", "--help", "--version"}
LIGHT_STAGES = {"ultra3-pretrain", "ultra3-sft"}  # a real run stops in its preflight here in seconds; others start
#                                                   Ray or import torch


@dataclass
class Example:
    path: Path
    line: int
    text: str                      # the command as the doc writes it
    output: list[str] | None       # a transcript's shown output; None outside transcripts
    exit_code: int | None = None   # from a `$ echo $?` after it
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    error: str | None = None       # why it cannot be run as written
    block: tuple = ()              # (file, line) of its transcript; (file, its own line) outside one

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.text}"

    @property
    def prog(self) -> str:
        return self.argv[0] if self.argv else ""

    @property
    def words(self) -> list[str]:
        """The words after the program (and after `ultra3` of `nemotron ultra3`)."""
        args = self.argv[1:]
        return args[1:] if self.prog == "nemotron" and args[:1] == ["ultra3"] else args

    @property
    def is_stage(self) -> bool:
        return self.prog == "ultra3" or (self.prog == "nemotron" and self.argv[1:2] == ["ultra3"])

    @property
    def runs_for_real(self) -> bool:
        """A stage command that submits when run as written."""
        return self.is_stage and not DRY & set(self.words) and any(not w.startswith("-") for w in self.words)

    @property
    def slug(self) -> str | None:
        """The job slug (`ultra3-data-prep-sft`, `pipe-tiny`) of the stage or pipe it names, if any."""
        from ultra3.stages import STAGES

        words, k = [], 0
        while k < len(self.words):  # the words that are not options, their values or overrides
            word = self.words[k]
            if word.startswith("-"):
                k += 1 if "=" in word or word in DRY or word in ("--force", "--full") else 2
                continue
            if "=" not in word:
                words.append(word)
            k += 1
        if words[:1] == ["pipe"]:
            config = next((w.split("=", 1)[1] for w in self.words if w.startswith("--config=")), None)
            for flag in ("-c", "--config"):
                if flag in self.words and self.words.index(flag) + 1 < len(self.words):
                    config = self.words[self.words.index(flag) + 1]
            return f"pipe-{config or 'default'}"
        stage = next((s for s in STAGES if list(s.words) == words), None)
        return stage.slug if stage else None

    @property
    def makes_jobs(self) -> bool:
        """A transcript of a real run of a stage or pipe: it makes a job the examples after it can name."""
        return self.error is None and self.output is not None and self.runs_for_real and self.slug is not None

    @property
    def shows_error(self) -> bool:
        return any(line.lstrip().startswith(("error:", "internal error:")) for line in self.output or [])

    def referenced_ids(self) -> list[str]:
        return [m.group(0) for w in self.argv for m in JOB_ID.finditer(w)]


def parse_command(text: str) -> tuple[dict[str, str], list[str]]:
    tokens = shlex.split(text, comments=True)
    env = {}
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if tokens[:3] == ["uv", "run", "nemotron"]:
        tokens = tokens[2:]
    return env, tokens


def extract(path: Path) -> tuple[list[Example], dict[str, str]]:
    """The command examples of one file, and the files its ```yaml blocks name (path -> text)."""
    examples: list[Example] = []
    files: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        marker, lang = fence.group(1), fence.group(2).lower()
        start = i + 1
        end = next((j for j in range(start, len(lines)) if lines[j].strip().startswith(marker)), len(lines))
        body = lines[start:end]
        i = end + 1
        if lang in FILE_LANGS and body and (m := re.match(r"#\s*([\w./-]+\.\w+)(:|$)", body[0])):
            files[m.group(1)] = "\n".join(body) + "\n"
        if lang in TEXT_LANGS:
            continue
        current: Example | None = None  # the transcript command whose output is being read
        j = 0
        while j < len(body):
            raw, number = body[j].strip(), start + j + 1
            j += 1
            is_command = raw.startswith("$ ") if lang == "console" and current is not None else bool(COMMAND.match(raw))
            while is_command and raw.endswith("\\") and j < len(body):  # a continued command line
                raw = raw[:-1].rstrip() + " " + body[j].strip()
                j += 1
            if lang == "console" and raw.startswith("$ "):
                if raw == "$ echo $?":
                    if current is None or j >= len(body):
                        examples.append(Example(path, number, raw, None, error="`echo $?` after no command"))
                    else:
                        current.exit_code = int(body[j].strip())
                        j += 1
                    current = None
                    continue
                if not COMMAND.match(raw):
                    examples.append(Example(path, number, raw[2:], None, error="not a command this test can run"))
                    current = None
                    continue
                current = Example(path, number, raw[2:], [], block=(path, start))
                examples.append(current)
            elif current is not None:  # output of the transcript's command
                if raw or current.output:
                    current.output.append(body[j - 1].rstrip())
            elif COMMAND.match(raw):
                examples.append(Example(path, number, raw.removeprefix("$ "), None))
    for example in examples:
        example.block = example.block or (path, example.line)
        if example.output is not None:
            while example.output and not example.output[-1].strip():
                example.output.pop()
        if example.error is None:
            try:
                example.env, example.argv = parse_command(example.text)
            except ValueError as e:
                example.error = f"cannot split it as a shell would: {e}"
            else:
                if example.prog not in ("ultra3", "nemotron"):
                    example.error = "not an ultra3 or nemotron command"
                elif any("..." in w or re.search(r"<[^>]*$|^[^<]*>", w) for w in example.argv):
                    example.error = "it has an elision or a placeholder where a value should be"
    return examples, files


def all_examples() -> tuple[list[Example], dict[str, str]]:
    examples, files = [], {}
    for path in DOCS:
        found, named = extract(path)
        examples += found
        files.update(named)
    return examples, files


def profiles(env_toml: Path) -> dict[str, dict]:
    """The profiles of an env.toml with their `extends` resolved (settings tables left out)."""
    data = tomllib.loads(env_toml.read_text())
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and k not in ("artifacts", "wandb", "cli", "cache")}

    def resolve(name: str, seen: tuple = ()) -> dict:
        table = dict(tables[name])
        parent = table.pop("extends", None)
        return {**(resolve(parent, seen + (name,)) if parent and parent not in seen else {}), **table}

    return {name: resolve(name) for name in tables}


def profile_arg(argv: list[str]) -> str | None:
    for k, word in enumerate(argv):
        if word in ("-r", "--run", "-b", "--batch") and k + 1 < len(argv):
            return argv[k + 1]
        if word.startswith(("--run=", "--batch=")):
            return word.split("=", 1)[1]
    return None


# -- running ----------------------------------------------------------------------------------------------

def normalize(text: str, home: Path, cwd: Path) -> list[str]:
    text = text.replace(str(home), "~/.nemotron").replace(str(cwd), "<cwd>")
    text = JOB_ID.sub(lambda m: f"{m.group(1)}_ID", text)
    text = re.sub(r"\(pid \d+\)", "(pid PID)", text)
    return [line.rstrip() for line in text.splitlines()]


def pattern(shown: str) -> re.Pattern:
    shown = JOB_ID.sub(lambda m: f"{m.group(1)}_ID", shown.rstrip())
    shown = re.sub(r"\(pid \d+\)", "(pid PID)", shown)
    parts = PLACEHOLDER.split(shown)
    return re.compile("".join(".*" if p == "..." else ".+" if k % 2 else re.escape(p) for k, p in enumerate(parts)))


def missing_lines(shown: list[str], real: list[str]) -> list[str]:
    """The shown lines not found in `real` in order (after the ones that were)."""
    k = 0
    for n, line in enumerate(shown):
        if line.strip() == "...":
            continue
        regex = pattern(line)
        while k < len(real) and not regex.fullmatch(real[k]):
            k += 1
        if k == len(real):
            return shown[n:]
        k += 1
    return []


class Workspace:
    """A working directory holding env.toml.example as env.toml and a private NEMOTRON_HOME, where the
    examples run in this process through the console scripts' own entry points."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]):
        self.home, self.cwd = tmp / "state", tmp / "work"
        self.cwd.mkdir(parents=True)
        (self.cwd / "env.toml").write_text(EXAMPLE_ENV.read_text())
        for name, text in files.items():
            (self.cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (self.cwd / name).write_text(text)
        self.profiles = profiles(EXAMPLE_ENV)
        monkeypatch.setenv("NEMOTRON_HOME", str(self.home))
        monkeypatch.setenv("NEMORUN_HOME", str(self.home / "nemorun"))
        for name in ("NEMOTRON_ENV_FILE", "ULTRA3_DEBUG"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.chdir(self.cwd)
        self.cache: dict[tuple, tuple[int, str]] = {}

    def jobs(self) -> dict[str, str]:
        """slug -> the newest job id (or pipe id) in this workspace's registry."""
        newest: dict[str, tuple[float, str]] = {}
        for kind in ("jobs", "pipes"):
            for record in (self.home / kind).glob("*.json"):
                job = json.loads(record.read_text())
                slug = JOB_ID.fullmatch(job["id"]).group(1)
                when = job.get("submitted", 0)
                if slug not in newest or when >= newest[slug][0]:
                    newest[slug] = (when, job["id"])
        return {slug: job_id for slug, (_, job_id) in newest.items()}

    def run(self, example: Example) -> tuple[int, str]:
        from ultra3.cli.app import nemotron_main, ultra3_main

        jobs = self.jobs()
        argv = [JOB_ID.sub(lambda m: jobs.get(m.group(1), m.group(0)), w).replace("$PWD", str(self.cwd))
                for w in example.argv]
        if example.output is None and example.runs_for_real:
            argv.append("--dry-run")
        key = (tuple(argv), tuple(sorted(example.env.items())))
        if key in self.cache and not example.runs_for_real:  # dry runs read the same state: the same output
            return self.cache[key]
        buffer = io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buffer), \
                contextlib.redirect_stderr(buffer):
            mp.setenv("ULTRA3_VERBOSE", "")  # recorded, so that what `-v` sets in the process goes with the example
            mp.delenv("ULTRA3_VERBOSE")
            for name, value in example.env.items():
                mp.setenv(name, value)
            mp.setattr(sys, "argv", argv)
            try:
                (ultra3_main if argv[0] == "ultra3" else nemotron_main)()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        result = (code, buffer.getvalue())
        self.cache[key] = result
        return result

    def check(self, example: Example) -> str | None:
        """Why the example failed, or None."""
        if example.error:
            return example.error
        if example.runs_for_real and example.output is not None:
            name = profile_arg(example.words)
            if name is not None and self.profiles.get(name, {}).get("executor") != "local":
                return f"the transcript submits to profile {name!r} for real; show it as a dry run"
        if missing := [i for i in example.referenced_ids() if JOB_ID.fullmatch(i).group(1) not in self.jobs()]:
            return f"no job or pipe of the kind of {missing[0]} was made by an earlier example"
        code, out = self.run(example)
        real = normalize(out, self.home, self.cwd)
        tail = "\n    | ".join(real[-15:])
        if example.output is None:
            return None if code == 0 else f"exit code {code}, expected 0:\n    | {tail}"
        if lost := missing_lines(example.output, real):
            return f"shown output line not in the real output (in order): {lost[0]!r}\n    | {tail}"
        fails = example.shows_error
        expected = example.exit_code
        if expected is not None and code != expected:
            return f"exit code {code}, the doc shows {expected}:\n    | {tail}"
        if expected is None and (code != 0) != fails:
            return f"exit code {code}, but the doc shows {'an' if fails else 'no'} error:\n    | {tail}"
        return None


def units(examples: list[Example]) -> list[list[Example]]:
    """The examples in the units they run in: a transcript's commands together and in order (a command may
    read what the one before it made), any other example alone."""
    grouped: dict[tuple, list[Example]] = {}
    for e in examples:
        grouped.setdefault(e.block, []).append(e)
    return list(grouped.values())


def needs(unit: list[Example]) -> set[str]:
    """The job slugs a unit names that it does not make itself."""
    made = {e.slug for e in unit if e.makes_jobs}
    return {JOB_ID.fullmatch(i).group(1) for e in unit for i in e.referenced_ids()} - made


def needs_ray_or_torch(unit: list[Example], made_fast: set[str]) -> bool:
    """Units of the heavy test: real runs that start Ray or import torch, and the commands on what they make."""
    if any(e.makes_jobs and e.slug not in LIGHT_STAGES for e in unit):
        return True
    if any(any(ARTIFACT.search(w) for w in e.argv) and not e.shows_error for e in unit):
        return True  # the artifacts come from the heavy runs: the light ones stop before publishing
    return not needs(unit) <= made_fast


def split_examples() -> tuple[list[list[Example]], list[list[Example]], dict[str, str]]:
    """The units of the fast test, those of the heavy one, and the files the docs show."""
    examples, files = all_examples()
    made = {e.slug for e in examples if e.makes_jobs and e.slug in LIGHT_STAGES}
    fast, heavy = [], []
    for unit in units(examples):
        (heavy if needs_ray_or_torch(unit, made) else fast).append(unit)
    return fast, heavy, files


def run_all(todo: list[list[Example]], workspace: Workspace) -> list[str]:
    """Run the units, those with real runs that make jobs before the ones that name them; the failures."""
    failures, pending = [], list(todo)
    while pending:
        made = set(workspace.jobs())
        ready = [u for u in pending if needs(u) <= made]
        makers = [u for u in ready if any(e.makes_jobs for e in u)]
        batch = makers or ready or pending  # nothing ready: the rest fail, naming the job they lack
        for unit in batch:
            for example in unit:
                if problem := workspace.check(example):
                    failures.append(f"{example}\n  {problem}")
        pending = [u for u in pending if u not in batch]
    return failures


# -- tests --------------------------------------------------------------------------------------------------

def test_extraction_finds_every_kind_of_command_example(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("\n".join([
        "```bash", "ultra3 pretrain -c tiny --dry-run   # a comment", "uv run nemotron jobs list",
        "ultra3 data prep rl -c tiny \\", "    --sample 10", "```",
        "```", "nemotron jobs list -n 3", "```",
        "```sh", "  NEMOTRON_HOME=/x ultra3 sft -c tiny", "```", "```shell", "nemotron --version", "```",
        "```console", "$ ultra3 pretrain -c huge -d", "error: one", "$ echo $?", "2",
        "$ ultra3 pipe -c tiny --dry-run", "ultra3 pipe: config tiny", "...", "$ ls", "```",
        "```text", "ultra3 pretrain -c tiny", "```", "```toml", "nemotron = 1", "```",
        "```yaml", "# my/cfg.yaml: a config", "defaults: [tiny]", "```",
        "ultra3 pretrain outside any block",
    ]))
    examples, files = extract(doc)
    assert [e.text for e in examples] == [
        "ultra3 pretrain -c tiny --dry-run   # a comment", "uv run nemotron jobs list",
        "ultra3 data prep rl -c tiny --sample 10", "nemotron jobs list -n 3", "NEMOTRON_HOME=/x ultra3 sft -c tiny",
        "nemotron --version", "ultra3 pretrain -c huge -d", "ultra3 pipe -c tiny --dry-run", "ls"]
    assert examples[0].argv == ["ultra3", "pretrain", "-c", "tiny", "--dry-run"]
    assert examples[1].argv == ["nemotron", "jobs", "list"]
    assert examples[4].env == {"NEMOTRON_HOME": "/x"} and examples[4].runs_for_real
    assert examples[6].output == ["error: one"] and examples[6].exit_code == 2
    assert examples[7].output == ["ultra3 pipe: config tiny", "..."]
    assert examples[8].error and not examples[0].error
    assert files == {"my/cfg.yaml": "# my/cfg.yaml: a config\ndefaults: [tiny]\n"}


def test_transcript_lines_match_in_order_with_elisions_and_placeholders():
    real = ["ultra3 sft: config tiny (tiny.yaml), profile 'plain' (slurm, <cwd>/env.toml), mode detached",
            "warning: x", "submitted ultra3-sft_ID (pid PID)", "total 5.2 GiB per GPU"]
    assert not missing_lines(["ultra3 sft: config tiny ... mode detached", "...",
                              "submitted ultra3-sft_20261121-114623-fcbba1 (pid 8650)", "total 5.2 GiB per GPU"], real)
    assert missing_lines(["total 5.2 GiB per GPU", "warning: x"], real) == ["warning: x"]
    assert missing_lines(["total 5.3 GiB per GPU"], real)
    assert not missing_lines(["ultra3 sft: config tiny (tiny.yaml), profile 'plain' (slurm, <path>), mode detached"],
                             real)


def test_help_examples_name_profiles_of_the_shipped_env_toml(cli_here):
    from ultra3.stages import STAGES

    shown = []
    for words in [(), ("pipe",), *(s.words for s in STAGES)]:
        r = cli_here(*words, "--help")
        assert r.rc == 0, r.err
        shown += [line.strip() for line in r.out.split("Examples:", 1)[-1].splitlines()
                  if line.strip().startswith(("ultra3 ", "nemotron "))]
    named = {profile_arg(shlex.split(e)) for e in shown} - {None}
    assert named and named <= set(profiles(EXAMPLE_ENV)), named - set(profiles(EXAMPLE_ENV))


def test_every_command_example_runs(tmp_path, monkeypatch):
    """The examples that need no Ray and no torch: dry runs, help, errors, and `nemotron jobs` on the jobs of
    the real local runs shown (a tiny pretraining stops in its preflight here in seconds)."""
    fast, _, files = split_examples()
    started, count = time.time(), sum(map(len, fast))
    failures = run_all(fast, Workspace(tmp_path, monkeypatch, files))
    assert not failures, f"{len(failures)} of {count} examples failed:\n" + "\n".join(failures)
    assert count > 100, "the extraction found too few examples"
    print(f"{count} examples in {time.time() - started:.1f} s")


@pytest.mark.heavy
def test_every_command_example_that_runs_ray_or_torch(tmp_path, monkeypatch):
    """The real runs of data prep, quantize and pipe that transcripts show, and the commands on their jobs."""
    _, heavy, files = split_examples()
    failures = run_all(heavy, Workspace(tmp_path, monkeypatch, files))
    assert not failures, f"{len(failures)} of {sum(map(len, heavy))} examples failed:\n" + "\n".join(failures)


def help_examples(cli_here) -> list[Example]:
    """The examples of every command's --help: the groups, each stage, pipe and each `nemotron jobs` command."""
    from ultra3.cli.jobs_app import build_jobs
    from ultra3.stages import STAGES

    jobs = [c.name or c.callback.__name__ for c in build_jobs().registered_commands]
    helps = [("ultra3", ()), ("ultra3", ("pipe",)), *(("ultra3", s.words) for s in STAGES), ("nemotron", ()),
             ("nemotron", ("jobs",)), *(("nemotron", ("jobs", name)) for name in jobs)]
    found = []
    for prog, words in helps:
        r = cli_here(*words, "--help", prog=prog)
        assert r.rc == 0, r.err
        for line in r.out.split("Examples:", 1)[1].splitlines() if "Examples:" in r.out else []:
            if COMMAND.match(line.strip()):
                example = Example(REPO / "help", 0, f"{prog} {' '.join(words)} --help: {line.strip()}", None)
                example.env, example.argv = parse_command(line.strip())
                found.append(example)
    return found


def test_every_help_example_runs_on_a_fresh_install(cli_here, tmp_path, monkeypatch):
    """What a command's --help shows runs as written against the shipped env.toml.example (a submission as a dry
    run), with no job made before it."""
    examples = help_examples(cli_here)
    assert len(examples) > 40 and any(e.prog == "nemotron" for e in examples), [e.text for e in examples]
    workspace = Workspace(tmp_path / "fresh", monkeypatch, {})
    failures = [f"{e.text}\n  {problem}" for e in examples if (problem := workspace.check(e))]
    assert not failures, f"{len(failures)} of {len(examples)} help examples failed:\n" + "\n".join(failures)
