"""The parts of NeMo-Run a Slurm submission uses, imported without its package `__init__`s.

`import nemo_run` imports every executor NeMo-Run has (Lepton's, DGX Cloud's, Kubeflow's, SkyPilot's, Docker's)
and its CLI: 2.6 s, where the Slurm executor, tunnels, packager and Experiment take under half of it. For the
pinned version only (another layout: the plain `import nemo_run`), `submission()` loads those modules with
the `nemo_run` and `nemo_run.core.execution` packages left unexecuted and the other executors' modules stood in
for by placeholders: `Experiment` and the torchx scheduler mapping name those classes, no object of them ever
exists in a Slurm submission. Those modules are in `sys.modules` only inside `submission()`: on leaving, they are
taken out and kept here for the next submission, so a later `import nemo_run` in the process imports the real,
whole package."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from importlib.metadata import version
from typing import Iterator

PINNED = "0.11.1"
UNEXECUTED = ("nemo_run", "nemo_run.core.execution")  # package __init__s that import every executor
PLACEHOLDERS = {"lepton": "LeptonExecutor", "dgxcloud": "DGXCloudExecutor", "kubeflow": "KubeflowExecutor",
                "docker": "DockerExecutor", "skypilot": "SkypilotExecutor", "skypilot_jobs": "SkypilotJobsExecutor"}
_kept: dict[str, types.ModuleType] = {}  # the lite modules between submissions


def _ours(name: str) -> bool:
    return name == "nemo_run" or name.startswith("nemo_run.")


def _api() -> types.SimpleNamespace:
    from nemo_run.config import Script, set_nemorun_home
    from nemo_run.core.execution.slurm import SlurmExecutor
    from nemo_run.core.packaging.pattern import PatternPackager
    from nemo_run.core.tunnel.client import LocalTunnel, SSHTunnel
    from nemo_run.run.experiment import Experiment

    return types.SimpleNamespace(Experiment=Experiment, LocalTunnel=LocalTunnel, PatternPackager=PatternPackager,
                                 Script=Script, SlurmExecutor=SlurmExecutor, SSHTunnel=SSHTunnel,
                                 set_nemorun_home=set_nemorun_home)


def _load_lite() -> None:
    for name in UNEXECUTED:
        sys.modules[name] = importlib.util.module_from_spec(importlib.util.find_spec(name))
    from nemo_run.package_info import __version__

    sys.modules["nemo_run"].__version__ = __version__  # Experiment writes it into the experiment dir (_VERSION)
    for module, cls in PLACEHOLDERS.items():
        stand_in = types.ModuleType(f"nemo_run.core.execution.{module}")
        setattr(stand_in, cls, type(cls, (), {"__module__": stand_in.__name__}))
        sys.modules[stand_in.__name__] = stand_in
    _api()


def _lite() -> bool:
    """The lite modules in sys.modules; False where NeMo-Run is not the pinned version, is imported whole
    already, or its layout did not load this way."""
    if any(map(_ours, sys.modules)) or version("nemo_run") != PINNED:
        return False
    if _kept:
        sys.modules.update(_kept)
        return True
    try:
        _load_lite()
        return True
    except Exception:  # another layout: leave nothing half-loaded behind
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        return False


@contextlib.contextmanager
def submission() -> Iterator[types.SimpleNamespace]:
    """NeMo-Run's submission API (Experiment, SlurmExecutor, LocalTunnel, SSHTunnel, PatternPackager, Script,
    set_nemorun_home), valid inside the block."""
    if not _lite():
        import nemo_run  # noqa: F401  # the whole package, its __init__s run

        yield _api()
        return
    try:
        yield _api()
    finally:
        for name in [n for n in sys.modules if _ours(n)]:
            _kept[name] = sys.modules.pop(name)
