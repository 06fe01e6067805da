"""The launcher's view of the runtime contract: recipes/contract.py (and the recipes/store.py it re-exports),
loaded from their files so the launcher and the job read one definition (the runtime package is not installed
with the launcher). `from ultra3.contract import PREFLIGHT_MARK` reads the runtime's own constant."""

from __future__ import annotations

import importlib.util
import sys
import types

from .paths import RECIPES_DIR

_PACKAGE = "ultra3._runtime"  # stands in for `recipes`: contract.py's `from .store import ...` finds store.py
_package = types.ModuleType(_PACKAGE)
_package.__path__ = [str(RECIPES_DIR)]
sys.modules.setdefault(_PACKAGE, _package)
_spec = importlib.util.spec_from_file_location(f"{_PACKAGE}.contract", RECIPES_DIR / "contract.py")
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module
_spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("_")})
