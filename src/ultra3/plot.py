"""`nemotron jobs plot`: a run's loss curve as a PNG, every attempt on one axis (matplotlib, imported here only)."""

from __future__ import annotations

from .errors import UserError
from .progress import Attempt, spikes

NAMED = 8  # attempts each named in the legend; a run of more has one entry for all
DOTTED = 500  # iterations up to which each is drawn as a dot too


def loss_png(attempts: list[Attempt], path: str, title: str, factor: float) -> None:
    """Train lm loss per iteration (a line per attempt), validation losses, where each attempt after the first
    started, and the spikes."""
    if not path.lower().endswith(".png"):
        raise UserError(f"-o {path}: the plot is a PNG; give a path ending in .png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("matplotlib is not installed; pip install 'ultra3-launcher[plot]'") from None
    trained = [a for a in attempts if any("lm loss" in it for it in a.iterations)]
    dots = "." if sum(len(a.iterations) for a in trained) <= DOTTED else None
    many = len(trained) > NAMED
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for k, a in enumerate(trained):
        points = [(it["iteration"], it["lm loss"]) for it in a.iterations if "lm loss" in it]
        label = (None if k else f"{len(trained)} attempts") if many else f"attempt {a.number}"
        ax.plot(*zip(*points), marker=dots, markersize=3, linewidth=1, label=label, color="C0" if many else None)
    starts = [a.iterations[0]["iteration"] for a in trained[1:]]
    if many:  # a tick each on the x axis
        ax.plot(starts, [0] * len(starts), "|", color="grey", markersize=8, transform=ax.get_xaxis_transform(),
                label="attempt start")
    for k, x in enumerate([] if many else starts):
        ax.axvline(x, color="grey", linewidth=0.6, linestyle=":", label=None if k else "attempt start")
    shown = [v for a in attempts for v in a.validation if v["set"] != "test"]
    if shown:
        ax.scatter([v["iteration"] for v in shown], [v["lm loss"] for v in shown], marker="x", color="black",
                   zorder=3, label="validation")
    if found := spikes(attempts, factor):
        ax.scatter([it["iteration"] for it in found], [it["lm loss"] for it in found], marker="o", s=60,
                   facecolors="none", edgecolors="red", zorder=4, label=f"spike (>= {factor:g}x)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise UserError(f"-o {path}: cannot write it ({e.strerror or e}); give a path in a writable directory"
                        ) from None
    finally:
        plt.close(fig)
