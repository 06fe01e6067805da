"""Chat rendering and loss masking for SFT: conversation -> (token ids, per-token loss mask).

A conversation is rendered once, whole, through a Jinja chat template. The template marks what the
model is trained to produce with `{% generation %}...{% endgeneration %}` (the convention of Hugging
Face's `return_assistant_tokens_mask`); while rendering, the marked character spans are recorded.
The full text is then tokenized once with offsets, and a token is a loss token iff its first
character lies inside a marked span. So the mask is aligned with exactly the tokens of the full
rendered conversation, with no re-tokenization of pieces that could merge differently.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

TEMPLATES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
ROLES = ("system", "user", "assistant", "tool")


class TemplateError(Exception):
    """The chat template cannot be used (missing, unparsable, no generation block)."""


class BadRecord(Exception):
    """One input record cannot become a training conversation: its kind (for counting) and why."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def shipped_templates() -> list[str]:
    return sorted(f[: -len(".jinja")] for f in os.listdir(TEMPLATES_DIR) if f.endswith(".jinja"))


def template_path(spec: str | None, base_dir: str | None = None) -> str:
    """A shipped template's name (`nemotron3`) or a path to a .jinja file (relative to `base_dir`)."""
    spec = spec or "nemotron3"
    if not spec.endswith(".jinja") and os.sep not in spec and "/" not in spec:
        path = os.path.join(TEMPLATES_DIR, f"{spec}.jinja")
        if not os.path.isfile(path):
            raise TemplateError(f"chat_template {spec!r} is not a shipped template ({', '.join(shipped_templates())}) "
                                "nor a path to a .jinja file")
        return path
    path = os.path.expanduser(spec)
    if not os.path.isabs(path) and base_dir:
        path = os.path.join(base_dir, path)
    if not os.path.isfile(path):
        raise TemplateError(f"chat_template {spec} does not exist")
    return path


class ChatTemplate:
    """A compiled chat template that reports the character spans of its `{% generation %}` blocks."""

    def __init__(self, source: str, name: str = "<template>"):
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        outer = self

        class Generation(Extension):
            tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension API)

            def parse(self, parser):
                outer._has_generation = True
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

            def _mark(self, caller):
                text = caller()
                if outer._spans is not None:
                    outer._spans.append((outer._emitted, text))
                return text

        def raise_exception(message):
            raise BadRecord("template_error", f"the chat template refused the conversation: {message}")

        def tojson(value, indent=None):
            return json.dumps(value, ensure_ascii=False, indent=indent)

        env = ImmutableSandboxedEnvironment(extensions=[Generation], keep_trailing_newline=True)
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self._has_generation = False
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template {name} line {e.lineno}: {e.message}") from None
        if not self._has_generation:
            raise TemplateError(f"chat template {name} has no {{% generation %}} block; mark each assistant turn "
                                "with {% generation %}...{% endgeneration %} so its tokens can be trained on")
        self.name = name
        self._spans: list[tuple[int, str]] | None = None
        self._emitted = 0

    @classmethod
    def load(cls, spec: str | None, base_dir: str | None = None) -> ChatTemplate:
        path = template_path(spec, base_dir)
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise TemplateError(f"chat template {path} is unreadable ({e})") from None
        return cls(source, name=os.path.basename(path))

    def render(self, messages: list[dict], tools: list | None = None) -> tuple[str, list[tuple[int, int]]]:
        """Rendered text and the [start, end) character spans of its generation blocks."""
        import jinja2

        self._spans, self._emitted = [], 0
        chunks = []
        try:
            # generate() is lazy: when a generation block runs, every chunk before it has been counted
            for chunk in self._template.generate(messages=messages, tools=tools or [], add_generation_prompt=False):
                chunks.append(chunk)
                self._emitted += len(chunk)
            recorded = self._spans
        except BadRecord:
            raise
        except (jinja2.TemplateError, TypeError, AttributeError, KeyError, ValueError) as e:
            raise BadRecord("template_error", f"the chat template failed on it ({type(e).__name__}: {e})") from None
        finally:
            self._spans = None
        text = "".join(chunks)
        spans = []
        for start, piece in recorded:
            if text[start:start + len(piece)] != piece:  # the block sat in a macro or a {% set %} block
                raise TemplateError(f"chat template {self.name}: a {{% generation %}} block is inside a macro, call "
                                    "or {% set %} block, so its position is unknown; move it to the top level")
            if piece:
                spans.append((start, start + len(piece)))
        return text, spans


def conversation(record: object, messages_field: str = "messages") -> tuple[list[dict], list]:
    """The validated messages (and tool definitions) of one record, or BadRecord with the reason."""
    if not isinstance(record, dict):
        raise BadRecord("invalid_json", f"a JSON {type(record).__name__}, not an object")
    messages = record.get(messages_field)
    if messages is None:
        raise BadRecord("missing_field", f"no {messages_field!r} field")
    if not isinstance(messages, list) or not messages:
        raise BadRecord("bad_messages", f"{messages_field!r} is not a non-empty list of messages")
    out = []
    has_assistant = False
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRecord("bad_messages", f"message {i} is not an object")
        m = {k: v for k, v in m.items() if v is not None}  # Parquet structs carry absent keys as nulls
        role = m.get("role")
        if role not in ROLES:
            raise BadRecord("bad_messages", f"message {i} has role {role!r}; expected one of {', '.join(ROLES)}")
        content = m.get("content")
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if content is None and calls:
                content = ""
            if not isinstance(calls, list):
                raise BadRecord("bad_messages", f"message {i}: tool_calls is not a list")
            m["tool_calls"] = [_tool_call(i, c) for c in calls]
            if isinstance(content, str) and (content.strip() or calls or m.get("reasoning_content")):
                has_assistant = True
        if not isinstance(content, str):
            raise BadRecord("bad_messages", f"message {i} ({role}) has no text content")
        m["content"] = content
        out.append(m)
    if not has_assistant:
        raise BadRecord("no_assistant", "no assistant turn to train on")
    tools = record.get("tools") or []
    if isinstance(tools, str):  # some datasets store the tool list as a JSON string
        try:
            tools = json.loads(tools)
        except ValueError:
            raise BadRecord("bad_messages", "'tools' is a string that is not JSON") from None
    if not isinstance(tools, list):
        raise BadRecord("bad_messages", "'tools' is not a list")
    return out, tools


def _tool_call(i: int, call: object) -> dict:
    if not isinstance(call, dict):
        raise BadRecord("bad_messages", f"message {i}: a tool call is not an object")
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRecord("bad_messages", f"message {i}: a tool call has no function name")
    args = fn.get("arguments") or {}
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            raise BadRecord("bad_messages",
                            f"message {i}: tool call {fn['name']} has arguments that are not JSON") from None
    if not isinstance(args, dict):
        raise BadRecord("bad_messages", f"message {i}: tool call {fn['name']} has arguments that are not an object")
    return {"function": {"name": fn["name"], "arguments": args}}


@dataclass
class Encoded:
    ids: np.ndarray  # int32 token ids of the whole rendered conversation
    mask: np.ndarray  # int8, 1 on tokens the model is trained to produce


def check_text(text: str) -> None:
    """Rendered text must be encodable: JSON `\\ud800` escapes give lone surrogates, which are not text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRecord("bad_utf8", f"not valid UTF-8 text (lone surrogate at character {e.start})") from None


def masked(encoding, spans: list[tuple[int, int]]) -> Encoded:
    """Ids and mask of a `tokenizers` Encoding of the rendered text: a token is trained on iff its first
    character lies inside a generation span."""
    ids = np.asarray(encoding.ids, dtype=np.int32)
    if not len(ids):
        raise BadRecord("bad_messages", "the conversation renders to no tokens")
    starts = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
    bounds = np.asarray(spans, dtype=np.int64).reshape(-1)
    mask = (np.searchsorted(bounds, starts, side="right") % 2).astype(np.int8)
    return Encoded(ids, mask)


def encode(tokenizer, text: str, spans: list[tuple[int, int]]) -> Encoded:
    """Tokenize one rendered conversation (no special tokens added) and mask it."""
    check_text(text)
    return masked(tokenizer.encode(text, add_special_tokens=False), spans)
