"""`nemotron jobs ...`: following jobs and pipes from any shell. Each command imports its work (cli/jobs.py) when
it runs."""

from __future__ import annotations

from typing import Optional

import typer

from .groups import new_group

JOBS_LIST_EXAMPLES = (
    "nemotron jobs list -n 5",
    "nemotron jobs list --state FAILED --stage pretrain",
    "nemotron jobs list --profile local --state COMPLETED",
    "nemotron jobs list --pipes",
)


def list_(limit: int = typer.Option(20, "-n", "--limit", min=1, help="How many of the newest jobs."),
          stage: Optional[str] = typer.Option(None, "--stage", metavar="STAGE",
                                              help="Only this stage's jobs (data-prep-sft or 'data prep sft')."),
          state: Optional[str] = typer.Option(None, "--state", metavar="STATE",
                                              help="Only jobs in this state (RUNNING, FAILED, ...)."),
          profile: Optional[str] = typer.Option(None, "--profile", metavar="PROFILE",
                                                help="Only jobs of this profile (local: this machine's)."),
          pipe: Optional[str] = typer.Option(None, "--pipe", metavar="PIPE_ID",
                                             help="Only the steps of this pipe (an id or a prefix)."),
          pipes: bool = typer.Option(False, "--pipes", help="List the pipes instead, with their steps' "
                                                            "states.")) -> None:
    """List submitted jobs, newest first, with their current state."""
    from ..job_filter import JobFilter
    from .jobs import list_jobs, list_pipes

    if pipes:
        return list_pipes(limit)
    list_jobs(limit, JobFilter(stage, state, profile, pipe))

def status(job: Optional[str] = typer.Argument(None, help="Job id, Slurm job id, a unique prefix, or a pipe id "
                                                         "(default: the newest job).")) -> None:
    """Show one job (state, exit code, reason, paths) or every step of a pipe."""
    from .jobs import show_status

    show_status(job)

def logs(job: Optional[str] = typer.Argument(None, help="Job id, Slurm job id, or a unique prefix (default: the "
                                                        "newest job)."),
         follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends.")) -> None:
    """Print the job's log."""
    from .jobs import show_logs

    show_logs(job, follow)

def cancel(job: str = typer.Argument(..., help="Job id, Slurm job id, a unique prefix, or a pipe id.")) -> None:
    """Cancel a pending or running job, or every step of a pipe not yet ended."""
    from .jobs import cancel_job

    cancel_job(job)

def prune(older_than: str = typer.Option("7d", "--older-than", metavar="AGE",
                                         help="Only jobs submitted at least this long ago: 7d, 12h, 30m, 0."),
          yes: bool = typer.Option(False, "-y", "--yes", help="Remove them (without it: a dry run).")) -> None:
    """Remove the job dirs and records of old finished jobs; keep those running, pending or holding published
    artifacts or checkpoints, saying why. A dry run unless --yes."""
    from .jobs import prune_jobs

    prune_jobs(older_than, yes)

def lineage(job: str = typer.Argument(..., help="Job id, Slurm job id, or a unique prefix.")) -> None:
    """The jobs and artifacts that led to a job's outputs."""
    from .jobs import show_lineage

    show_lineage(job)

def compare(results: list[str] = typer.Argument(..., help="Eval results: job ids (or prefixes), artifacts "
                                                          "NAME:latest|NAME:vN, or results.json paths.")) -> None:
    """Eval results side by side: each task's score, its difference to the first, inside the stderr or not."""
    from .jobs import compare_results

    compare_results(results)

def plot(job: Optional[str] = typer.Argument(None, help="Job id, Slurm job id, or a unique prefix (default: the "
                                                        "newest job)."),
         output: Optional[str] = typer.Option(None, "-o", "--output", help="The PNG to write (default: "
                                                                         "<job id>-loss.png here).")) -> None:
    """Write a training run's loss curve (every attempt, validation, spikes) as a PNG."""
    from .jobs import show_plot

    show_plot(job, output)

def goodput(job: str = typer.Argument(..., help="Job id, Slurm job id, a unique prefix, or a pipe id.")) -> None:
    """Split a run's allocated time into productive, start-up and lost, attempt by attempt."""
    from .jobs import show_goodput

    show_goodput(job)


def build_jobs() -> typer.Typer:
    app = new_group("jobs", "Follow jobs submitted from any shell: list, status, logs, cancel, prune, lineage, "
                            "compare, plot, goodput.")
    app.command("list", epilog="\b\nExamples:\n  " + "\n  ".join(JOBS_LIST_EXAMPLES))(list_)
    app.command()(status)
    app.command()(logs)
    app.command()(cancel)
    app.command(epilog="\b\nExamples:\n  nemotron jobs prune\n  nemotron jobs prune --older-than 1d --yes")(prune)
    app.command()(lineage)
    app.command()(compare)
    app.command()(plot)
    app.command()(goodput)
    return app
