"""`nemotron jobs plot`: a run's loss curve as a PNG, every attempt on one axis (matplotlib, imported here only)."""

from __future__ import annotations

from .errors import UserError
from .progress import Attempt, spikes


def loss_png(attempts: list[Attempt], path: str, title: str, factor: float) -> None:
    """Train lm loss per iteration, validation losses, where each attempt started, and the spikes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("matplotlib is not installed; pip install 'ultra3-launcher[plot]'") from None
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for a in attempts:
        points = [(it["iteration"], it["lm loss"]) for it in a.iterations if "lm loss" in it]
        if points:
            ax.plot(*zip(*points), marker=".", markersize=3, linewidth=1, label=f"attempt {a.number}")
            if a.number > 1 or len(attempts) > 1:
                ax.axvline(points[0][0], color="grey", linewidth=0.6, linestyle=":")
        shown = [v for v in a.validation if v["set"] != "test"]
        if shown:
            ax.scatter([v["iteration"] for v in shown], [v["lm loss"] for v in shown], marker="x", color="black",
                       zorder=3, label="validation" if a is attempts[0] or not any(
                           b.validation for b in attempts[:attempts.index(a)]) else None)
    for it in spikes(attempts, factor):
        ax.scatter([it["iteration"]], [it["lm loss"]], marker="o", s=60, facecolors="none", edgecolors="red",
                   zorder=4)
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
