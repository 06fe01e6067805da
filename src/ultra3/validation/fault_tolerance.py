"""Hangs, dead ranks and in-job restarts: the combinations that fail at run time or are silently off.

run.fault_tolerance.enabled runs the ranks under nvidia-resiliency-ext's ft_launcher and turns on Megatron-Bridge's
FT package (ft.enable_ft_package, ft.calc_ft_timeouts); under torchrun the package is silently off. Megatron-Bridge
0.6: in-process restart (inprocess_restart.*) does not work under the FT launcher; async checkpoint saving needs
the torch_dist format; the straggler detectors nvrx_straggler and straggler are one or the other.
"""

from __future__ import annotations

from ultra3.cost import step_and_save
from ultra3.dotted import get

FT = "run.fault_tolerance"
STARTUP_S = 300  # assumed, as the long-run plan's start-up


def check(cfg: dict, report) -> None:
    enabled = bool(get(cfg, f"{FT}.enabled"))
    for key in ("ft.enable_ft_package", "ft.simulate_fault", "ft.calc_ft_timeouts"):
        if get(cfg, key) and not enabled:
            report.error(key, f"true without {FT}.enabled: ranks under torchrun run without the FT package, so "
                              f"this does nothing; set {FT}.enabled=true", (f"{FT}.enabled",))
    if enabled and get(cfg, "inprocess_restart.enabled"):
        report.error("inprocess_restart.enabled", f"in-process restart does not work under the FT launcher "
                                                  f"({FT}.enabled); choose one", (f"{FT}.enabled",))
    if enabled and not get(cfg, "checkpoint.save"):
        report.error(f"{FT}.enabled", "needs checkpoint.save: restarted ranks go on from its newest checkpoint, and "
                                      "the learned timeouts are kept there (ft_state.json); set checkpoint.save")
    fmt = get(cfg, "checkpoint.ckpt_format")
    if get(cfg, "checkpoint.async_save") and fmt not in (None, "torch_dist"):
        report.error("checkpoint.async_save", f"needs checkpoint.ckpt_format: torch_dist, not {fmt}; set it or "
                                              "async_save=false", ("checkpoint.ckpt_format",))
    if get(cfg, "nvrx_straggler.enabled") and (get(cfg, "straggler.log_straggler")
                                               or get(cfg, "straggler.enable_straggler_on_startup")):
        report.error("nvrx_straggler.enabled", "and the older straggler detector (straggler.*) both on: keep one, "
                                               "nvrx_straggler", ("straggler.log_straggler",))
    if get(cfg, "ft.simulate_fault") and get(cfg, "ft.simulated_fault_type") not in (None, "rank_hung", "rank_killed",
                                                                                      "random"):
        report.error("ft.simulated_fault_type", f"{get(cfg, 'ft.simulated_fault_type')!r}: Megatron-Bridge knows "
                                                "rank_hung, rank_killed and random")
    if enabled:
        _timeouts(cfg, report)


def _timeouts(cfg: dict, report) -> None:
    """A timeout shorter than what it covers would restart a healthy job: the start-up to the first step (a
    checkpoint's load, and kernel autotuning: 87 s on one H200), a step, a save (ultra3.cost's model)."""
    step_s, save_s, _, _ = step_and_save(cfg)
    needs = {"setup_timeout_s": (STARTUP_S + (save_s or 0) + (step_s or 0), "the start-up, a checkpoint's load and "
                                 f"the first step ({STARTUP_S} s assumed + the load at the save's rate + a step)"),
             "step_timeout_s": (step_s, "a step, by the throughput model"),
             "checkpointing_timeout_s": (save_s, "a synchronous save, by the cost model")}
    for key, (need, what) in needs.items():
        value = get(cfg, f"{FT}.{key}")
        if need and isinstance(value, int) and value < need:
            report.warn(f"{FT}.{key}", f"{value} s is shorter than {what}: ~{need:.0f} s; FT would end and restart "
                                       "healthy ranks")
