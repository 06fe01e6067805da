"""Record what recipes/ft_launcher.py relies on in nvidia-resiliency-ext's ft_launcher and in Megatron-Bridge's FT
integration, read with `ast` from their released source (nothing imported), for the tests that check the command
line contract.ft_launcher_argv builds (tests/data/nvrx_ft_launcher.json):

* the launcher: its console script's module and whether it runs with `python -m`; every option of its parser
  (launcher.py, and cli_args.py for the rendezvous ones) with its dest, whether it takes a value and of what type;
  the fields of its FaultToleranceConfig, which the --ft-* options set;
* Megatron-Bridge: the FT sections it opens (its timeouts are those sections') and whether it sends heartbeats.

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64 \\
        nvidia-resiliency-ext==0.6.0 megatron-bridge==0.6.2 -d /tmp/w
    unzip -q /tmp/w/nvidia_resiliency_ext-*.whl -d /tmp/nvrx && unzip -q /tmp/w/megatron_bridge-*.whl -d /tmp/mb
    python scripts/nvrx_launcher_record.py /tmp/nvrx /tmp/mb > tests/data/nvrx_ft_launcher.json
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

NO_VALUE = {"check_env", "store_true", "store_false", "store_const", "count"}  # options that take no value


def _options(source: str) -> dict[str, dict]:
    """Every `add_argument(...)` / `_add_argument(parser, ...)` call: its option strings -> dest, value type."""
    found: dict[str, dict] = {}
    for node in ast.walk(ast.parse(source)):
        func = getattr(node, "func", None)
        if getattr(func, "attr", None) != "add_argument" and getattr(func, "id", None) != "_add_argument":
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
        if not flags:
            continue
        kw = {k.arg: k.value for k in node.keywords}
        action = kw.get("action")
        action = getattr(action, "id", None) or getattr(action, "value", None)
        kind = "str" if kw.get("type") is None else getattr(kw["type"], "id", "other")
        value = "none" if action in NO_VALUE else kind if kind in ("int", "float", "str") else "other"
        dest = getattr(kw.get("dest"), "value", None) or flags[-1].lstrip("-").replace("-", "_")
        for flag in flags:
            found[flag] = {"dest": dest, "value": value}
    return found


def _fields(source: str, cls: str) -> list[str]:
    tree = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls)
    return sorted(s.target.id for s in tree.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))


def main(root: str, mb_root: str) -> None:
    ft = Path(root, "nvidia_resiliency_ext", "fault_tolerance")
    launcher = (ft / "launcher.py").read_text()
    info = next(Path(root).glob("nvidia_resiliency_ext-*.dist-info"))
    script = re.search(r"^ft_launcher\s*=\s*([\w.]+):(\w+)", (info / "entry_points.txt").read_text(), re.M)
    mb_ft = Path(mb_root, "megatron", "bridge", "training", "fault_tolerance.py").read_text()
    mb_info = next(Path(mb_root).glob("megatron_bridge-*.dist-info"))
    print(json.dumps({
        "nvidia-resiliency-ext": info.name.split("-")[1].removesuffix(".dist"),
        "ft_launcher": {"module": script[1], "function": script[2],
                        "runs_as_main": "if __name__ == \"__main__\":" in launcher},
        "options": dict(sorted({**_options((ft / "cli_args.py").read_text()), **_options(launcher)}.items())),
        "fault_tolerance_config": _fields((ft / "config.py").read_text(), "FaultToleranceConfig"),
        "megatron-bridge": mb_info.name.split("-")[1].removesuffix(".dist"),
        "megatron_bridge_ft": {"sections": sorted(set(re.findall(r"\.start_section\(\"(\w+)\"\)", mb_ft))),
                               "sends_heartbeats": "send_heartbeat" in mb_ft},
    }, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
