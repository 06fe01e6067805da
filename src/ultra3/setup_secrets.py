"""Secrets given a literal value in setup lines, which the batch script and its log would show. A secret (a
variable, a `--option` or a file named like one) may take its value from the environment (`$HF_TOKEN`), a
command's output or a file on the cluster (`$(cat ~/.secrets/hf)`), not from text of the lines themselves:
`HF_TOKEN=hf_...`, `read HF_TOKEN <<< hf_...`, `printf -v HF_TOKEN hf_...`, `--token hf_...`,
`echo hf_... > ~/.cache/huggingface/token`, or that text passed on through a variable or a file the lines
wrote (`echo hf_... > /tmp/t; export HF_TOKEN=$(cat /tmp/t)`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .profiles import SECRET_NAME

_WORD = r"""(?:"(?:[^"\\]|\\.)*"|'[^']*'|\$\((?:[^()]|\([^()]*\))*\)|`[^`]*`|\\.|[^\s;&|<>()'"`\\])+"""
_LEXEME = re.compile(rf"""[^\S\n]*(?:(?P<sep>&&|\|\|)
    |(?P<redir>\d*(?:<<<|<<-?|>>|>\||&>>?|>&|<&|<|>))[^\S\n]*(?P<target>{_WORD})?
    |(?P<sep1>[;&|()\n])|(?P<word>{_WORD}|\S))""", re.X)
_REFERENCE = re.compile(r"\$[{(A-Za-z_0-9@*#?!$-]|`")  # $NAME, ${NAME}, $(command), `command`; not $'text'
_ASSIGNMENT = re.compile(r"([-+]*)([A-Za-z_][\w.-]*)\+?=(.*)", re.S)  # NAME=, --option=, ++hydra.key=
_NAME = re.compile(r"[A-Za-z_]\w*")
_WRITE = (">", ">>", ">|", "&>", "&>>")
_READ_OPTS = "adinNptu"  # read's options that take an argument


@dataclass
class _Command:
    words: list[str] = field(default_factory=list)
    redirs: list[tuple[str, str]] = field(default_factory=list)
    piped_from: _Command | None = None


@dataclass
class _State:
    """What the lines so far hold as text of their own: variables and files."""

    variables: dict[str, bool] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)
    found: dict[str, str] = field(default_factory=dict)  # what -> "variable" | "option" | "file"


def literal_secrets(lines: list[str], literal_variables: set[str] = frozenset()) -> dict[str, str]:
    """{what: kind} for the secrets the lines give a literal value, in order; kind is "variable" (HF_TOKEN),
    "option" (--token) or "file" (~/.cache/huggingface/token). `literal_variables`: variables the job gets
    with a value written in its config (run.env)."""
    state = _State(dict.fromkeys(literal_variables, True))
    for line in lines:
        for command in _commands(line):
            _run(command, state)
    return state.found


def is_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name.replace("-", "_")))


def _commands(text: str) -> list[_Command]:
    commands, current, pos = [], _Command(), 0
    while pos < len(text) and (m := _LEXEME.match(text, pos)) and m.end() > pos:
        pos = m.end()
        if m["word"]:
            current.words.append(m["word"])
        elif m["redir"]:
            current.redirs.append((m["redir"].lstrip("0123456789"), m["target"] or ""))
        elif sep := m["sep"] or m["sep1"]:
            commands.append(current)
            current = _Command(piped_from=current if sep == "|" else None)
    return [c for c in (*commands, current) if c.words or c.redirs]


def _unquoted(word: str) -> str:
    return word[1:-1] if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'" else word


def _literal(word: str, state: _State) -> bool:
    """Whether a shell word's value is text of the setup lines (a variable or file they filled with text included)."""
    value = word[1:-1] if len(word) >= 2 and word[0] == word[-1] == '"' else word
    if not value or value in ("''", '""'):
        return False
    if inner := re.fullmatch(r"\$\((.*)\)|`(.*)`", value, re.S):
        commands = _commands(inner[1] if inner[1] is not None else inner[2])
        return bool(commands) and _prints_text(commands[-1], state)
    if name := re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", value):
        return state.variables.get(name[1], False)
    return not _REFERENCE.match(value)


def _stdin_text(command: _Command, state: _State) -> bool:
    """Whether the command reads text of the lines: a here-string, a file they wrote, a pipe from such text."""
    for op, target in command.redirs:
        if op == "<<<":
            return _literal(target, state)
        if op == "<":
            return _unquoted(target) in state.files
    return command.piped_from is not None and _prints_text(command.piped_from, state)


def _prints_text(command: _Command, state: _State) -> bool:
    """Whether the command's output is text of the lines: echo/printf of it, cat or tee of it, `$(< file)`."""
    if not command.words:
        return _stdin_text(command, state)
    name, args = command.words[0], command.words[1:]
    if name in ("echo", "printf"):
        return all(_literal(a, state) for a in args)
    if name == "cat" and args:
        return all(_unquoted(a) in state.files for a in args if not a.startswith("-"))
    return name in ("cat", "tee") and _stdin_text(command, state)


def _assign(name: str, literal: bool, kind: str, state: _State) -> None:
    if kind == "variable":
        state.variables[name] = literal
    if literal and is_secret(name.rsplit(".", 1)[-1]):
        state.found.setdefault(name, kind)


def _run(command: _Command, state: _State) -> None:
    words = command.words
    for i, word in enumerate(words):
        if m := _ASSIGNMENT.fullmatch(word):  # HF_TOKEN=..., --token=..., ++policy.api_key=...
            dashes, name, value = m.groups()
            plain = not dashes and _NAME.fullmatch(name)
            _assign(name if plain else f"{dashes}{name}", _literal(value, state), "variable" if plain else "option",
                    state)
        elif word.startswith("--") and is_secret(word) and i + 1 < len(words) and not words[i + 1].startswith("-"):
            _assign(word, _literal(words[i + 1], state), "option", state)  # --token VALUE
    name = words[0] if words else ""
    if name == "read":
        args = iter(words[1:])
        for arg in args:
            if arg.startswith("-"):
                if len(arg) == 2 and arg[1] in _READ_OPTS:
                    next(args, None)
            elif _NAME.fullmatch(arg):
                _assign(arg, _stdin_text(command, state), "variable", state)
    elif name == "printf" and len(words) > 1 and words[1].startswith("-v"):  # printf -v NAME FORMAT ARGS
        target, rest = (words[1][2:], words[2:]) if words[1] != "-v" else (" ".join(words[2:3]), words[3:])
        if _NAME.fullmatch(target):
            _assign(target, bool(rest) and all(_literal(a, state) for a in rest), "variable", state)
    if _prints_text(command, state):  # tee: of its input
        written = [t for op, t in command.redirs if op in _WRITE] + \
            ([a for a in words[1:] if not a.startswith("-")] if name == "tee" else [])
        for path in map(_unquoted, written):
            state.files.add(path)
            stem = PurePosixPath(path).name.lstrip(".").split(".")[0]
            if stem and is_secret(stem):
                state.found.setdefault(path, "file")
