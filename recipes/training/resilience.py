"""Megatron-Bridge's resiliency sections (ft, straggler, nvrx_straggler, inprocess_restart) for the runtime, in pure
Python (tests check it against the record of the released API):

* the `ft.*` keys run.fault_tolerance.enabled sets: the ranks run under ft_launcher, so the FT package is on, and
  its timeouts are learned into <checkpoint.save>/ft_state.json unless ft.calc_ft_timeouts is set; the config's own
  ft.* keys (ft.simulate_fault...) pass through as every Megatron-Bridge key does;
* the sections to make before the overrides: Megatron-Bridge 0.6.2's Ultra recipes leave these four None, and its
  override helper cannot set a key under None ("Could not override 'ft.simulate_fault'").
"""

from __future__ import annotations

from typing import Any

CONFIG = "megatron.bridge.training.config"
SECTIONS = {"ft": f"{CONFIG}.FaultToleranceConfig", "straggler": f"{CONFIG}.StragglerDetectionConfig",
            "nvrx_straggler": f"{CONFIG}.NVRxStragglerDetectionConfig",
            "inprocess_restart": f"{CONFIG}.InProcessRestartConfig"}


def ft_values(cfg: dict, values: dict[str, Any]) -> dict[str, Any]:
    """The ft.* keys the ranks under ft_launcher need, beside the config's Megatron-Bridge keys (`values`)."""
    if not ((cfg.get("run") or {}).get("fault_tolerance") or {}).get("enabled"):
        return {}
    out: dict[str, Any] = {"ft.enable_ft_package": True}
    if values.get("ft.calc_ft_timeouts") is None:
        out["ft.calc_ft_timeouts"] = True
    return out


def sections_to_make(overrides: list[str]) -> dict[str, str]:
    """Section -> its class, for the resiliency sections the overrides set keys of (made with the class's defaults
    where the recipe left them None)."""
    named = {override.split(".", 1)[0] for override in overrides}
    return {section: target for section, target in SECTIONS.items() if section in named}
