"""Interpolations counted before OmegaConf resolves them. OmegaConf copies what `${a}` resolves to each time it is
named, resolving it again for each copy: a few hundred bytes of keys that each name the one before several times
(`b: [${a}, ${a}, ${a}]`, `c: "${b}${b}"`) resolve to billions of values or characters. Here each value's
resolved size is counted once, from the sizes of what it names, and a config past the loader's bounds is refused
before anything is copied."""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf.errors import GrammarParseError
from omegaconf.grammar.gen.OmegaConfGrammarLexer import OmegaConfGrammarLexer as Lexer
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as Parser
from omegaconf.grammar_parser import parse

from .limits import MAX_DEPTH, MAX_REPEATS, TOO_DEEP
from .errors import UserError

MAX_CHARS = 1_000_000  # characters interpolations may repeat in one config: `"${a}${a}"` doubles a string
FIX = "write the values out or use fewer interpolations"
TEXT_RESOLVERS = ("oc.create", "oc.decode")  # read text as a value while resolving, references included
KEY_RESOLVERS = ("oc.select", "oc.dict.keys", "oc.dict.values", "oc.deprecated")  # the first argument names a key
PUNCTUATION = (Lexer.COMMA, Lexer.COLON, Lexer.BRACKET_OPEN, Lexer.BRACKET_CLOSE, Lexer.BRACE_OPEN,
               Lexer.BRACE_CLOSE, -1)  # -1: the end of the text

KeyPath = tuple  # the keys and list indices from the config's root to a value
Size = tuple[int, int]  # values, characters


def bound(tree: dict[str, Any], origin: dict[str, str]) -> None:
    """Refuse interpolations that would repeat more than MAX_REPEATS values or MAX_CHARS characters in all once
    resolved, or nest more than MAX_DEPTH deep; `origin`: the source of each flat key."""
    _Sizes(tree, origin).size(())


class _Sizes:
    """The size of each value once resolved, each counted once."""

    def __init__(self, tree: dict[str, Any], origin: dict[str, str]):
        self.tree, self.origin = tree, origin
        self.sizes: dict[KeyPath, Size] = {}
        self.open: list[KeyPath] = []  # the values being sized, outermost first
        self.nested = 0  # interpolations being sized, each inside or named by the one before
        self.values = self.chars = 0  # what the interpolations sized so far repeat

    def size(self, path: KeyPath) -> Size:
        if path in self.sizes:
            return self.sizes[path]
        if path in self.open:
            return 1, 0  # a loop: OmegaConf's own error names it
        node = self.node(path)
        self.open.append(path)
        try:
            if isinstance(node, (dict, list)):
                size = self.table(node, path)
            elif isinstance(node, str) and "${" in node:
                size = self.text(node, path)
                self.values, self.chars = self.values + size[0], self.chars + size[1]
                if self.values > MAX_REPEATS or self.chars > MAX_CHARS:
                    what = f"{MAX_REPEATS:,} values" if self.values > MAX_REPEATS else f"{MAX_CHARS:,} characters"
                    raise self.refused(path, f"interpolations ({_short(node)}) repeat more than {what}", FIX)
            else:
                size = 1, len(str(node))
        finally:
            self.open.pop()
        self.sizes[path] = size
        return size

    def table(self, node: dict | list, path: KeyPath) -> Size:
        values, chars = 1, 0
        for key in (node if isinstance(node, dict) else range(len(node))):
            v, c = self.size((*path, key))
            values, chars = values + v, chars + c + (len(str(key)) if isinstance(node, dict) else 0)
        return values, chars

    def text(self, text: str, here: KeyPath) -> Size:
        try:
            return self.expr(parse(text), here)
        except GrammarParseError:  # OmegaConf cannot read it either, and its error names the key
            return 1, len(text)
        except RecursionError:  # references into tables that hold references into tables ...
            what, _, fix = TOO_DEEP.partition("; ")
            raise self.refused(here, f"{what} once its interpolations are resolved", fix) from None

    def expr(self, ctx, here: KeyPath) -> Size:
        """The size of a parsed value at `here`: a reference, what it names; a resolver, its arguments; text of
        several pieces, one string of their characters."""
        if hasattr(ctx, "symbol"):  # a token
            return 1, len(ctx.getText())
        if isinstance(ctx, (Parser.InterpolationNodeContext, Parser.InterpolationResolverContext)):
            self.nested += 1
            try:
                if self.nested > MAX_DEPTH:
                    raise self.refused(here, f"interpolations nested more than {MAX_DEPTH} deep, each inside or "
                                             "naming the next", "name the value itself")
                if isinstance(ctx, Parser.InterpolationResolverContext):
                    return self.resolver(ctx, here)
                return self.size(self.target(ctx, here))
            finally:
                self.nested -= 1
        if isinstance(ctx, Parser.QuotedValueContext):  # its quotes are no part of it
            return self.expr(ctx.text(), here) if ctx.text() else (1, 0)
        parts = [self.expr(c, here) for c in ctx.getChildren() if not _punctuation(c)]
        if isinstance(ctx, (Parser.SequenceContext, Parser.DictKeyValuePairContext)):
            return sum(v for v, _ in parts), sum(c for _, c in parts)
        if isinstance(ctx, (Parser.ListContainerContext, Parser.DictContainerContext)):
            return 1 + sum(v for v, _ in parts), sum(c for _, c in parts)
        return parts[0] if len(parts) == 1 else (1, sum(c for _, c in parts))

    def resolver(self, ctx, here: KeyPath) -> Size:
        name = ctx.resolverName()
        if name.interpolation():
            raise self.refused(here, f"the resolver's name in {_short(ctx.getText())} is interpolated",
                               "name the resolver")
        name = name.getText()
        if name in TEXT_RESOLVERS:
            raise self.refused(here, f"{name} reads text as a value while it resolves, which can repeat values "
                                     "without bound", "write the value out")
        args = ctx.sequence()
        if not args:
            return 1, 0
        values, chars = self.expr(args, here)
        first = args.getChild(0)  # a comma if the first argument is empty
        if name in (*KEY_RESOLVERS, "oc.env") and isinstance(first, Parser.ElementContext):
            key = self.literal(first, here)
            if key is None:
                raise self.unknown_key(here, ctx)
            key = key.strip()
            if name == "oc.env":
                return values, chars + len(os.environ.get(key, ""))
            dots = len(key) - len(key.lstrip("."))
            v, c = self.size(self.locate(_split(key), here[:len(here) - dots] if dots else ()))
            values, chars = values + v, chars + c
        return values, chars

    def target(self, ctx, here: KeyPath) -> KeyPath:
        """The path `${a.b}`, `${.b}` (relative) or `${a[${k}]}` names, from the value at `here`, as OmegaConf
        reads it: a key from a reference is split at its dots, unless in brackets."""
        dots, parts, in_brackets = 0, [], False
        for child in ctx.getChildren():
            if hasattr(child, "symbol"):
                kind = child.symbol.type
                dots += kind == Lexer.DOT and not parts
                in_brackets = kind == Lexer.BRACKET_OPEN or (in_brackets and kind != Lexer.BRACKET_CLOSE)
            elif isinstance(child, Parser.ConfigKeyContext):
                key = self.literal(child, here)
                if key is None:
                    raise self.unknown_key(here, ctx)
                if not child.interpolation():
                    parts.append(re.sub(r"\\([\\.\[\]:=])", r"\1", key))
                elif in_brackets:
                    parts.append(key)
                else:
                    dots += 0 if parts else len(key) - len(key.lstrip("."))
                    parts += _split(key)
        return self.locate(parts, here[:len(here) - dots] if dots else ())

    def locate(self, parts: list[str], base: KeyPath) -> KeyPath:
        """The path of the value `parts` names from `base`, through the references on the way (`${a.b}` where
        `a: ${c}` names c.b); a key that is not there is left to OmegaConf's own error."""
        path, node = base, self.node(base)
        for part in parts:
            seen = set()
            while isinstance(node, str) and "${" in node and path not in seen:
                seen.add(path)
                ref = self.reference(node, path)
                if ref is None:
                    break  # OmegaConf cannot read it: its own error names the key
                path = self.target(ref, path)
                node = self.node(path)
            if isinstance(node, dict) and part not in node and part.lstrip("-").isdigit():
                part = int(part)  # a YAML integer key
            elif isinstance(node, list) and part.isdigit():
                part = int(part)
            path, node = (*path, part), self.node((*path, part))
        return path

    def reference(self, text: str, here: KeyPath):
        """The parsed `${...}` that is all of `text` (a value another reference reads a key of), a reference to
        another key; None if OmegaConf cannot read it."""
        try:
            value = parse(text).text()
        except GrammarParseError:
            return None
        only = value.getChild(0) if value.getChildCount() == 1 else None
        if not isinstance(only, Parser.InterpolationContext) or not only.interpolationNode():
            raise self.refused(here, f"a reference reads a key of {_short(text)}, known only once resolved",
                               "name the key itself")
        return only.interpolationNode()

    def literal(self, ctx, here: KeyPath) -> str | None:
        """The text of a key: as written, or the plain value a reference in it names; None if only resolving
        would tell."""
        if hasattr(ctx, "symbol"):
            return ctx.getText()
        if isinstance(ctx, Parser.InterpolationNodeContext):
            node = self.node(self.target(ctx, here))
            return None if isinstance(node, (dict, list)) or (isinstance(node, str) and "${" in node) else str(node)
        if isinstance(ctx, Parser.InterpolationResolverContext):
            return None
        if isinstance(ctx, Parser.QuotedValueContext):
            return self.literal(ctx.text(), here) if ctx.text() else ""
        parts = [self.literal(c, here) for c in ctx.getChildren()]
        return None if None in parts else "".join(parts)

    def node(self, path: KeyPath) -> Any:
        node: Any = self.tree
        for key in path:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                return None
        return node

    def unknown_key(self, here: KeyPath, ctx) -> UserError:
        return self.refused(here, f"the key in {_short(ctx.getText())} is known only once resolved",
                            "name the key itself")

    def refused(self, path: KeyPath, what: str, fix: str) -> UserError:
        """The error naming the flat key that holds `path` and where it was set."""
        keys = []
        for part in path:
            if not isinstance(part, str):
                break
            keys.append(part)
        source = next((self.origin[key] for key in (".".join(keys[:n]) for n in range(len(keys), 0, -1))
                       if key in self.origin), None)
        return UserError(f"{'.'.join(keys) or 'config'}: {what}" + (f" (set in {source})" if source else "")
                         + f"; {fix}")


def _punctuation(ctx) -> bool:
    return hasattr(ctx, "symbol") and ctx.symbol.type in PUNCTUATION


def _split(key: str) -> list[str]:
    return re.findall(r"[^.\[\]]+", key)


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."
