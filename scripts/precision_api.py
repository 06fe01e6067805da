"""Record the Megatron-Bridge, Megatron-Core and Transformer Engine names the NVFP4 recipe uses that the Megatron-Bridge
API record (src/ultra3/megatron_api/record.json: config fields, presets) does not hold, read from the wheels.

    pip download --no-deps --only-binary=:all: --python-version 3.12 -d WHEELS \
        megatron-bridge==0.6.2 megatron-core==0.19.2 transformer-engine==2.20.2
    python scripts/precision_api.py WHEELS/*.whl > tests/data/precision_api.json

Nothing is imported from the wheels (they need Python 3.12 and CUDA): the sources are parsed. tests/test_precision.py
checks every name recipes/training/precision.py and ultra3.precision_map use against this record.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

ULTRA_PRESET = "nemotron_3_ultra_bf16_with_nvfp4_mixed"
# Module-path segments Megatron-Core gives its modules (`name + ".out_proj"`, `name="decoder"`): the paths the
# per-module quantization recipe's globs match.
_SEGMENT = re.compile(r"""name \+ f?"\.([A-Za-z_][A-Za-z0-9_]*)|\bname="([A-Za-z_][A-Za-z0-9_]*)\"""")


def _sources(wheel: Path) -> tuple[str, str, dict[str, str]]:
    """(distribution, version, {path: text of each .py file})."""
    dist, version = wheel.name.split("-")[:2]
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n).decode() for n in z.namelist() if n.endswith(".py")}
    return dist, version, files


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls: ast.ClassDef) -> list[str]:
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _bridge(files: dict[str, str]) -> dict:
    tree = ast.parse(files["megatron/bridge/training/mixed_precision.py"])
    sets = {}
    for fn in tree.body:  # `cfg.<field> = <constant>` lines: what a preset sets on top of the one it starts from
        if isinstance(fn, ast.FunctionDef) and fn.name in ("bf16_with_nvfp4_mixed", ULTRA_PRESET):
            sets[fn.name] = {s.targets[0].attr: s.value.value for s in fn.body
                             if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Attribute)
                             and isinstance(s.value, ast.Constant)}
    names = [t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]
    return {"preset_assignments": sets, "mixed_precision_module_names": names}


def _core(files: dict[str, str]) -> dict:
    te = ast.parse(files["megatron/core/extensions/transformer_engine.py"])
    config_types = _class(te, "TransformerEngineConfigType")
    key = next(n.value.value for n in te.body if isinstance(n, ast.Assign)
               and getattr(n.targets[0], "id", None) == "_TE_CONFIG_TYPE_KEY")
    segments = sorted({a or b for text in files.values() for a, b in _SEGMENT.findall(text)})
    quant = ast.parse(files["megatron/core/quantization/quant_config.py"])
    return {
        "quant_config_classes": [n.name for n in quant.body if isinstance(n, ast.ClassDef)],
        "recipe_config_methods": [n.name for n in _class(quant, "RecipeConfig").body if isinstance(n, ast.FunctionDef)],
        "te_config_type_key": key,
        "te_config_types": [n.targets[0].id for n in config_types.body if isinstance(n, ast.Assign)],
        "te_quantization_recipe_fields": _fields(_class(te, "TEQuantizationRecipe")),
        "te_quantization_params_fields": _fields(_class(te, "TEQuantizationParams")),
        "module_path_segments": segments,
    }


def _engine(files: dict[str, str]) -> dict:
    recipe = _class(ast.parse(files["transformer_engine/common/recipe/__init__.py"]), "NVFP4BlockScaling")
    env = {}
    for node in recipe.body:  # `disable_rht: bool = os.getenv("NVTE_NVFP4_DISABLE_RHT", "0") == "1"`
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            for call in ast.walk(node.value):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "getenv":
                    env[call.args[0].value] = {"field": node.target.id, "default": call.args[1].value}
    return {"nvfp4_block_scaling_env": env, "nvfp4_block_scaling_fields": _fields(recipe)}


READERS = {"megatron_bridge": _bridge, "megatron_core": _core, "transformer_engine": _engine}


def main(wheels: list[str]) -> None:
    record = {}
    for wheel in map(Path, wheels):
        dist, version, files = _sources(wheel)
        if dist in READERS:
            record[dist] = {"version": version, **READERS[dist](files)}
    missing = set(READERS) - set(record)
    if missing:
        sys.exit(f"no wheel for {', '.join(sorted(missing))} among the arguments")
    json.dump(record, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
