"""Regenerate src/ultra3/megatron_api/record.json from the Megatron-Bridge and Megatron-Core wheels' source.

The record is what the launcher knows of the released API without importing it: the fields and types of
the ConfigContainer sections and of the Ultra model provider's class chain, the signatures of the
functions (and AutoBridge methods) the runtimes call, the NemotronH bridge's HF -> Megatron config mapping
and the registered mixed-precision presets. Everything is read with `ast`; nothing from the wheels is imported.

    pip download --no-deps --ignore-requires-python --python-version 3.12 --only-binary :all: \\
        megatron-bridge==0.6.2 megatron-core==0.19.2 -d /tmp/mb
    python scripts/megatron_api_record.py /tmp/mb/megatron_bridge-0.6.2-*.whl /tmp/mb/megatron_core-0.19.2-*.whl
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "ultra3" / "megatron_api" / "record.json"
ULTRA = "megatron.bridge.recipes.nemotronh.h100.nemotron_3_ultra"

# ConfigContainer section -> the class our runtime fills it with (ConfigContainer types some as unions)
SECTIONS = {
    "model": "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider",
    "dataset": "megatron.bridge.training.config.GPTDatasetConfig",
}
CLASSES = (  # built by the runtime with keyword arguments
    "megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig",
    "megatron.bridge.data.packing.config.PackedSequenceSpecs",
)
FUNCTIONS = (
    f"{ULTRA}.nemotron_3_ultra_pretrain_24gpu_h100_bf16_config",
    f"{ULTRA}.nemotron_3_ultra_sft_192gpu_h100_bf16_openmathinstruct2_packed_config",
    "megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides",
    "megatron.bridge.recipes.utils.dataset_utils.get_blend_fields_from_data_paths",
    "megatron.bridge.training.pretrain.pretrain",
    "megatron.bridge.training.finetune.finetune",
    "megatron.bridge.training.gpt_step.forward_step",
    "megatron.bridge.training.mixed_precision.get_mixed_precision_config",
)
AUTO_BRIDGE = "megatron.bridge.models.conversion.auto_bridge.AutoBridge"
METHODS = (f"{AUTO_BRIDGE}.from_auto_config", f"{AUTO_BRIDGE}.export_ckpt")  # quantize's Megatron -> HF export
CONSTANTS = (f"{ULTRA}.NEMOTRON_3_ULTRA_HF_MODEL_ID",)
BRIDGE = ("megatron.bridge.models.conversion.model_bridge.MegatronModelBridge",
          "megatron.bridge.models.nemotronh.nemotron_h_bridge.NemotronHBridge")
PRESETS = "megatron.bridge.training.mixed_precision"

SCALARS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "Path": "str", "dict": "dict",
           "Dict": "dict", "list": "list", "List": "list", "tuple": "list", "Tuple": "list", "Sequence": "list",
           "Any": "any", "None": "none", "NoneType": "none", "Callable": "callable", "dtype": "dtype"}


class Source:
    """The .py files of the wheels, by module name, parsed on demand."""

    def __init__(self, wheels: list[str]):
        self.files: dict[str, str] = {}
        self.packages: set[str] = set()  # modules that are a package's __init__
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.endswith(".py") and name.startswith("megatron/"):
                        module = name[:-3].replace("/", ".")
                        if module.endswith(".__init__"):
                            module = module.removesuffix(".__init__")
                            self.packages.add(module)
                        self.files[module] = z.read(name).decode()
        self._trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.files[module])
        return self._trees[module]

    def top(self, dotted: str) -> tuple[str, ast.AST]:
        """The module-level definition `module.name`, following `from x import y` re-exports."""
        module, _, name = dotted.rpartition(".")
        for node in self.tree(module).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                return module, node
        target = self.imports(module).get(name)
        if target:
            return self.top(target)
        raise KeyError(dotted)

    def imports(self, module: str) -> dict[str, str]:
        names = {}
        package = module if module in self.packages else module.rpartition(".")[0]
        for node in ast.walk(self.tree(module)):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                source = ".".join(p for p in (base, node.module) if p)
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{source}.{alias.name}"
        return names


def type_of(node: ast.AST | None) -> str:
    """An annotation as one of int, float, str, bool, list, list[int], dict, any, callable, dtype, a
    record class name, or a `|` union of those ("none" dropped)."""
    if node is None:
        return "any"
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):  # a string annotation
            try:
                return type_of(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return "any"
        return "none" if node.value is None else "any"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([type_of(node.left), type_of(node.right)])
    if isinstance(node, ast.Subscript):
        outer = _name(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if outer in ("Optional", "Union"):
            return _union([type_of(a) for a in args])
        if outer == "Literal":
            kinds = {type(a.value).__name__ for a in args if isinstance(a, ast.Constant) and a.value is not None}
            return _union(sorted(kinds)) if kinds else "none"
        if outer in ("list", "List", "Sequence"):
            item = type_of(args[0])
            return f"list[{item}]" if item in ("int", "str", "float") else "list"
        if outer in ("ClassVar", "InitVar"):
            return "skip"
        if outer in ("Annotated",):
            return type_of(args[0])
        return SCALARS.get(outer, "any")
    name = _name(node)
    return SCALARS.get(name, f"class:{name}" if name[:1].isupper() else "any")


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _union(types: list[str]) -> str:
    parts = sorted({p for t in types for p in t.split("|") if p != "none"})
    if "any" in parts or "skip" in parts:
        return "any"
    return "|".join(parts) or "none"


def dataclass_fields(src: Source, dotted: str, classes: dict) -> dict[str, str]:
    """The fields of a dataclass and of its bases (base fields first), with their types; a field typed
    as another dataclass of the wheels is recorded in `classes` too."""
    module, node = src.top(dotted)
    assert isinstance(node, ast.ClassDef), dotted
    fields: dict[str, str] = {}
    scope = src.imports(module)
    for base in node.bases:
        base = base.value if isinstance(base, ast.Subscript) else base
        name = _name(base)
        target = scope.get(name) or f"{module}.{name}"
        if target.startswith("megatron.") and _defined(src, target):
            fields.update(dataclass_fields(src, target, classes))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            t = type_of(stmt.annotation)
            if t == "skip" or stmt.target.id.startswith("_"):
                continue
            fields[stmt.target.id] = _resolve(src, module, t, classes)
    return fields


def _resolve(src: Source, module: str, t: str, classes: dict) -> str:
    """`class:Name` -> the record name of a dataclass of the wheels (recorded), else "any"."""
    out = []
    for part in t.split("|"):
        if part.startswith("class:"):
            name = part[6:]
            target = src.imports(module).get(name) or f"{module}.{name}"
            if _defined(src, target) and _is_dataclass(src, target):
                short = target.rpartition(".")[2]
                if short not in classes:
                    classes[short] = {}
                    classes[short] = dataclass_fields(src, target, classes)
                part = short
            else:
                part = "any"
        out.append(part)
    return _union(out)


def _defined(src: Source, dotted: str) -> bool:
    try:
        src.top(dotted)
        return True
    except KeyError:
        return False


def _is_dataclass(src: Source, dotted: str) -> bool:
    _, node = src.top(dotted)
    return isinstance(node, ast.ClassDef) and any(
        "dataclass" in ast.unparse(d) for d in node.decorator_list)


def signature(src: Source, dotted: str) -> dict:
    _, node = src.top(dotted)
    assert isinstance(node, ast.FunctionDef), dotted
    a = node.args
    return {"params": [p.arg for p in a.posonlyargs + a.args], "kwonly": [p.arg for p in a.kwonlyargs],
            "varargs": a.vararg is not None, "varkw": a.kwarg is not None}


def method(src: Source, dotted: str) -> dict:
    """The signature of `module.Class.method` as called on a class or an instance (without cls/self)."""
    owner, _, name = dotted.rpartition(".")
    _, cls = src.top(owner)
    node = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    a = node.args
    bound = not any(_name(d) == "staticmethod" for d in node.decorator_list)
    params = [p.arg for p in a.posonlyargs + a.args][bound:]
    return {"params": params, "kwonly": [p.arg for p in a.kwonlyargs], "varargs": a.vararg is not None,
            "varkw": a.kwarg is not None}


def constant(src: Source, dotted: str):
    _, node = src.top(dotted)
    return ast.literal_eval(node.value)


def config_mapping(src: Source) -> list[list[str]]:
    pairs: list[list[str]] = []
    for dotted in BRIDGE:
        _, node = src.top(dotted)
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "CONFIG_MAPPING":
                value = stmt.value.right if isinstance(stmt.value, ast.BinOp) else stmt.value
                pairs += [list(ast.literal_eval(e)) for e in value.elts]
    return pairs


def presets(src: Source) -> list[str]:
    return sorted(n.name for n in src.tree(PRESETS).body if isinstance(n, ast.FunctionDef)
                  and any(_name(d) == "register" for d in n.decorator_list))


def container_sections(src: Source, classes: dict) -> dict[str, str]:
    """ConfigContainer field -> the record class of that section (or a scalar type)."""
    module, node = src.top("megatron.bridge.training.config.ConfigContainer")
    sections = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)) or stmt.target.id[0] == "_":
            continue
        name = stmt.target.id
        if name in SECTIONS:
            short = SECTIONS[name].rpartition(".")[2]
            classes[short] = dataclass_fields(src, SECTIONS[name], classes)
            sections[name] = short
        else:
            sections[name] = _resolve(src, module, type_of(stmt.annotation), classes)
    return sections


def version(wheel: str) -> str:
    return re.match(r"[a-z_]+-([^-]+)-", Path(wheel).name).group(1)


def build(bridge_wheel: str, core_wheel: str) -> dict:
    src = Source([bridge_wheel, core_wheel])
    classes: dict[str, dict] = {}
    sections = container_sections(src, classes)
    for dotted in CLASSES:
        classes[dotted.rpartition(".")[2]] = dataclass_fields(src, dotted, classes)
    return {
        "versions": {"megatron-bridge": version(bridge_wheel), "megatron-core": version(core_wheel)},
        "sections": sections,
        "classes": dict(sorted(classes.items())),
        "functions": {**{d: signature(src, d) for d in FUNCTIONS}, **{d: method(src, d) for d in METHODS}},
        "constants": {d: constant(src, d) for d in CONSTANTS},
        "hf_config_mapping": config_mapping(src),
        "mixed_precision_presets": presets(src),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bridge_wheel")
    parser.add_argument("core_wheel")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    record = build(args.bridge_wheel, args.core_wheel)
    Path(args.out).write_text(json.dumps(record, separators=(",", ":"), sort_keys=False) + "\n")
    n = sum(len(c) for c in record["classes"].values())
    print(f"{args.out}: {len(record['classes'])} classes, {n} fields, {len(record['functions'])} functions")


if __name__ == "__main__":
    main()
