"""Hangs, dead ranks and in-job restarts: the combinations that fail at run time or are silently off, and the
ft_launcher command line the job runs (the dry run's "fault tolerance" table).

run.fault_tolerance.enabled runs the ranks under nvidia-resiliency-ext 0.6's ft_launcher (contract.ft_launcher_argv)
and turns on Megatron-Bridge 0.6.2's FT package (ft.enable_ft_package, ft.calc_ft_timeouts); under torchrun the
package is silently off. FT times Megatron-Bridge's sections: setup (from the FT start to the first step), each step
from the second one on, each save, and the time between them once a step was timed; the first step of each start
(kernel autotuning) is not timed. In-process restart (inprocess_restart.*) does not work under the FT launcher; an
asynchronous save needs the torch_dist (or fsdp_dtensor) format and checkpoint.save; the straggler detectors
nvrx_straggler and straggler are one or the other. A simulated fault (ft.simulate_fault) is set up again at every
start, in-job restarts too.
"""

from __future__ import annotations

from ultra3.contract import FT_SECTIONS, HEAD_NODE_VAR, ft_launcher_argv
from ultra3.cost import step_and_save
from ultra3.dotted import get

from ..model_math import pos_int
from .long_run import STARTUP_S

FT = "run.fault_tolerance"
ASYNC_FORMATS = ("torch_dist", "fsdp_dtensor")  # Megatron-Bridge 0.6.2's ConfigContainer asserts one of these
FAULT_TYPES = ("rank_hung", "rank_killed", "random")  # its ft.simulated_fault_type


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
                                      "the learned timeouts are kept there (ft_state.json); set checkpoint.save",
                     ("checkpoint.save",))
    _async_save(cfg, report)
    if get(cfg, "nvrx_straggler.enabled") and get(cfg, "straggler.log_straggler"):
        report.error("nvrx_straggler.enabled", "and the older straggler detector (straggler.log_straggler) both on: "
                                               "keep one, nvrx_straggler", ("straggler.log_straggler",))
    if get(cfg, "ft.simulate_fault"):
        _simulated_fault(cfg, report)
    if enabled:
        _timeouts(cfg, report)
        report.tables["fault tolerance"] = _table(cfg)


def _async_save(cfg: dict, report) -> None:
    """Megatron-Bridge 0.6.2's Ultra recipes save asynchronously (checkpoint.async_save: true) unless told not to;
    the runtime turns it off where nothing is saved."""
    value, save = get(cfg, "checkpoint.async_save"), get(cfg, "checkpoint.save")
    if not (value if value is not None else save):
        return
    said = "" if value is not None else " (the Ultra recipe's checkpoint.async_save: true)"
    fmt = get(cfg, "checkpoint.ckpt_format")
    if fmt is not None and fmt not in ASYNC_FORMATS:
        report.error("checkpoint.ckpt_format", f"{fmt}: an asynchronous save{said} needs torch_dist (or "
                                               "fsdp_dtensor); set checkpoint.ckpt_format=torch_dist or "
                                               "checkpoint.async_save=false", ("checkpoint.async_save",))
    if not save:
        report.error("checkpoint.async_save", "true without checkpoint.save: nothing to save to; set checkpoint.save "
                                              "or checkpoint.async_save=false", ("checkpoint.save",))
    if get(cfg, "checkpoint.use_persistent_ckpt_worker") is False:
        report.error("checkpoint.use_persistent_ckpt_worker",
                     f"false: an asynchronous save{said} needs its persistent worker; remove it or set "
                     "checkpoint.async_save=false", ("checkpoint.async_save",))


def _simulated_fault(cfg: dict, report) -> None:
    kind, rank, delay = (get(cfg, f"ft.simulated_fault_{k}") for k in ("type", "rank", "base_delay"))
    if kind not in (None, *FAULT_TYPES):
        report.error("ft.simulated_fault_type", f"{kind!r}: Megatron-Bridge knows {', '.join(FAULT_TYPES)}",
                     ("ft.simulated_fault_type",))
    world = (pos_int(get(cfg, "run.nodes")) or 1) * (pos_int(get(cfg, "run.gpus_per_node")) or 1)
    if isinstance(rank, int) and not 0 <= rank < world:
        report.error("ft.simulated_fault_rank", f"{rank} is not a rank of this job (0 to {world - 1}), so no fault "
                                                "would happen; give one of them or leave it unset (a random rank)",
                     ("run.nodes", "run.gpus_per_node"))
    if not delay:
        report.warn("ft.simulated_fault_base_delay", "0: the fault comes at once, at every start (in-job restarts "
                                                     "too), before any step, so no restart gets past it; give the "
                                                     "seconds after which it comes", ("ft.simulate_fault",))


def _timeouts(cfg: dict, report) -> None:
    """A timeout shorter than what it covers would restart a healthy job: setup is the start-up and a checkpoint's
    load (the load at the save's rate), a step and a save by ultra3.cost's model."""
    step_s, save_s, _, _ = step_and_save(cfg)
    needs = {"setup_timeout_s": (STARTUP_S + (save_s or 0), f"the start-up and a checkpoint's load ({STARTUP_S} s "
                                                            "assumed + the load at the save's rate)"),
             "step_timeout_s": (step_s, "a step, by the throughput model"),
             "checkpointing_timeout_s": (save_s, "a synchronous save, by the cost model")}
    for key, (need, what) in needs.items():
        value = get(cfg, f"{FT}.{key}")
        if need and isinstance(value, int) and value < need:
            report.warn(f"{FT}.{key}", f"{value} s is shorter than {what}: ~{need:.0f} s; FT would end and restart "
                                       "healthy ranks", (f"{FT}.{key}",))


def _table(cfg: dict) -> list[tuple[str, str]]:
    run, ft = cfg["run"], get(cfg, FT)
    argv = ft_launcher_argv(run, "python", f"${HEAD_NODE_VAR}", "<job id>", (cfg.get("job") or {}).get("recipe")
                            or "recipes.<stage>", "config.yaml")
    timeouts = ", ".join(f"{name} {ft[f'{name}_timeout_s']} s" for name in FT_SECTIONS)
    learned = "ft.calc_ft_timeouts=false" if get(cfg, "ft.calc_ft_timeouts") is False else \
        "then learned into <checkpoint.save>/ft_state.json (ft.calc_ft_timeouts)"
    return [("each node runs", " ".join(argv)),
            ("in-job restarts", f"{ft['max_restarts']} of every rank, from the newest checkpoint; then the attempt "
                                "fails and run.max_retries decides"),
            ("timeouts", f"{timeouts}, between them {ft['out_of_section_timeout_s']} s; {learned}"),
            ("not timed", "the first step of each start (kernel autotuning: 87 s on one H200)")]
