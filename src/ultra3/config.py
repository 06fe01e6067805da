"""Stage configs: find, load with `defaults:` inheritance, layer with the profile and the command
line, and remember where each value came from (stage config < profile < command line)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError
from .limits import MAX_DEPTH, MAX_DIGITS, MAX_REPEATS, TOO_DEEP, TOO_LONG
from .paths import CONFIGS_DIR, config_names

CLI_SOURCE = "command line"


@dataclass
class Layer:
    source: str  # a file, a profile or the command line: shown in the dry run and in errors
    values: dict[str, Any]  # flat dotted key -> value


def find_config(config_dir: str, name: str) -> Path:
    """`-c NAME` looks in the stage's config dir; anything with a '/' or a .yaml suffix is a path."""
    if not name.strip():
        raise UserError(f"--config: empty; give a config name ({', '.join(config_names(config_dir))}) or a path")
    if "/" in name or name.endswith((".yaml", ".yml")):
        path = Path(name).expanduser()
        if path.is_dir():
            raise UserError(f"--config: '{name}' is a directory; give a YAML file or a config name")
        if not path.is_file():
            raise UserError(f"--config: no such file '{name}'")
        return path
    path = CONFIGS_DIR / config_dir / f"{name}.yaml"
    if not path.is_file():
        from .schema import did_you_mean

        close = did_you_mean(name, config_names(config_dir))
        names = ", ".join(config_names(config_dir))
        raise UserError(f"--config: no config '{name}' for this stage; {f'{close} ' if close else ''}choose one of: "
                        f"{names}, or give a path")
    return path


def load_layers(path: Path, config_dir: str, _seen: tuple[Path, ...] = ()) -> list[Layer]:
    """The file's bases (its `defaults:` list, in order) come first, then the file itself."""
    path = path.resolve()
    if path in _seen:
        chain = " -> ".join(_label(p) for p in (*_seen, path))
        raise UserError(f"{_label(path)}: circular defaults: {chain}")
    data = read_yaml(path)
    bases = data.pop("defaults", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise UserError(f"{_label(path)}: defaults must be a config name or a list of names, got {bases!r}")
    layers: list[Layer] = []
    for base in bases:
        layers += load_layers(_find_base(base, path, config_dir), config_dir, (*_seen, path))
    layers.append(Layer(_label(path), flatten(data)))
    return layers


def _find_base(name: str, child: Path, config_dir: str) -> Path:
    file = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    for folder in (child.parent, CONFIGS_DIR / config_dir):
        if (folder / file).is_file():
            return folder / file
    raise UserError(f"{_label(child)}: defaults names '{name}', which is not a config next to it or of this stage")


def _label(path: Path) -> str:
    try:
        return f"configs/{path.relative_to(CONFIGS_DIR.resolve()).as_posix()}"
    except ValueError:
        return str(path)


def read_yaml(path: Path) -> dict:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{_label(path)}: not UTF-8 text (byte {e.start}); save it as UTF-8 YAML") from None
    except OSError as e:
        raise UserError(f"{_label(path)}: cannot read: {e.strerror}") from None
    try:
        data = load_yaml(text)
    except _Refused as e:
        raise UserError(f"{_label(path)}:{e.problem_mark.line + 1}: {e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{_label(path)}{at}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{_label(path)}: must be a mapping of keys, got {type(data).__name__}")
    return data




class _Refused(yaml.MarkedYAMLError):
    """YAML past the loader's bounds, refused before it is expanded."""


def load_yaml(text: str, depth: int = 0) -> Any:
    """Every YAML a user gives (config files, override values) is read here; `depth`: the levels of tables
    around the value (an override's key)."""
    loader = _Loader(text, depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: `1e-4` is a number, as in OmegaConf, not a string; `4:00:00` (a Slurm time)
    and `2024-01-01` stay strings, not YAML 1.1's base-60 integer 14400 and a date. A key given twice in one
    table is an error naming both lines (YAML would keep the second silently).

    Bounded while it is composed, before anything expands: nesting past MAX_DEPTH, aliases (`*name`, `<<: *name`)
    that repeat more than MAX_REPEATS values in all or sit inside the value they name, and integers longer than
    MAX_DIGITS are refused (_Refused)."""

    def __init__(self, text: str, depth: int = 0):
        super().__init__(text)
        self.depth, self.repeats, self.open = depth, 0, []  # open: the anchors of the nodes being composed
        self.extents: dict[yaml.Node, tuple[int, int]] = {}

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.open:
                raise _Refused(problem=f"alias *{event.anchor} is inside the value it names; give the value itself",
                              problem_mark=event.start_mark)
            if event.anchor in self.anchors:  # else the composer's own error: an undefined alias
                values, levels = self._extent(self.anchors[event.anchor])
                self.repeats += values
                if self.repeats > MAX_REPEATS:
                    raise _Refused(problem=f"aliases (*{event.anchor}) repeat more than {MAX_REPEATS:,} values; write "
                                          "the values out or use fewer aliases", problem_mark=event.start_mark)
                if self.depth + levels > MAX_DEPTH:
                    raise _Refused(problem=TOO_DEEP, problem_mark=event.start_mark)
            return super().compose_node(parent, index)
        if self.depth >= MAX_DEPTH:
            raise _Refused(problem=TOO_DEEP, problem_mark=event.start_mark)
        self.depth += 1
        self.open.append(event.anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1
            self.open.pop()

    def _extent(self, node: yaml.Node) -> tuple[int, int]:
        """(values, levels) of a composed node with its aliases expanded, each node counted once."""
        if not isinstance(node, yaml.CollectionNode):
            return 1, 1
        if node not in self.extents:
            children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
            parts = [self._extent(child) for child in children]
            self.extents[node] = (1 + sum(v for v, _ in parts), 1 + max((d for _, d in parts), default=0))
        return self.extents[node]

    def construct_yaml_int(self, node):
        if len(node.value) > MAX_DIGITS:
            raise _Refused(problem=TOO_LONG, problem_mark=node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.[\d_]*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d[\d_]*[eE][-+]?\d+"
               r"|\.inf|\.Inf|\.INF|\.nan|\.NaN|\.NAN)$"),
    list("-+0123456789."),
)
for _first, _resolvers in _Loader.yaml_implicit_resolvers.items():  # add_implicit_resolver made them copies
    _resolvers[:] = [(tag, regexp) for tag, regexp in _resolvers if tag != "tag:yaml.org,2002:timestamp"]
    if _first in "-+0123456789":
        _resolvers.insert(0, ("tag:yaml.org,2002:str", re.compile(r"^[-+]?\d[\d_]*(?::[0-5]?\d)+(?:\.[\d_]*)?$")))

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def parse_overrides(tokens: list[str]) -> Layer:
    """`a.b=value` tokens; values are typed like YAML (numbers, true/false, null, [lists])."""
    values: dict[str, Any] = {}
    for token in tokens:
        key, eq, raw = token.partition("=")
        if not eq:
            raise UserError(f"'{token}': not an option or a key=value override; "
                            "overrides look like model.seq_length=4096")
        if not _KEY.match(key):
            raise UserError(f"'{token}': '{key}' is not a dotted config key (e.g. train.train_iters=10)")
        value = parse_value(raw, token)
        if isinstance(value, dict) and value:
            values.update(flatten(value, f"{key}."))
        else:
            values[key] = value
    return Layer(CLI_SOURCE, values)


def parse_value(raw: str, token: str = "") -> Any:
    key = token.partition("=")[0]
    levels = key.count(".") + 1 if key else 0  # the tables the key opens around the value
    try:
        if levels >= MAX_DEPTH:
            raise _Refused(problem=TOO_DEEP)
        return load_yaml(raw, levels) if raw else ""
    except _Refused as e:
        what, _, fix = e.problem.partition("; ")
        raise UserError(f"{key or 'value'}: {what} (set in {CLI_SOURCE}); {fix}") from None
    except yaml.YAMLError:
        raise UserError(f"'{token}': cannot parse the value '{raw}'; quote strings with special characters") from None


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def merge(layers: list[Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    """Later layers win key by key. Returns the flat values and, per key, the layer that set it."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.values.items():
            # a leaf replaces a whole table (and the other way round)
            for old in [k for k in values if k.startswith(key + ".") or key.startswith(k + ".")]:
                del values[old]
                origin.pop(old, None)
            values[key] = value
            origin[key] = layer.source
    return values, origin


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def resolve(tree: dict[str, Any], origin: dict[str, str]) -> dict[str, Any]:
    """Resolve `${a.b}` interpolations with OmegaConf, once they are known to stay within the loader's bounds
    (interpolations.bound); a dangling reference names its key. `origin`: the source of each flat key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .interpolations import bound

    bound(tree, origin)
    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "config"
        msg = str(e).splitlines()[0]
        raise UserError(f"{key}: cannot resolve the interpolation: {msg}") from None
