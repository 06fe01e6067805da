"""The launcher's view of the runtime contract: recipes/contract.py, loaded from its file so the
launcher and the job read one definition (the runtime package is not installed with the launcher).
`from ultra3.contract import PREFLIGHT_MARK` reads the runtime's own constant."""

from __future__ import annotations

import importlib.util

from .paths import RECIPES_DIR

_spec = importlib.util.spec_from_file_location("ultra3._runtime_contract", RECIPES_DIR / "contract.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("_")})
