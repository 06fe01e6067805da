"""What a stage command does once its arguments are parsed: compile, then dry-run or launch."""

from __future__ import annotations

from ..compile import compile_job
from ..job import Options
from ..errors import UserError
from ..stage import Stage


def run_stage(stage: Stage, given: dict, overrides: list[str]) -> None:
    options = Options(config="default" if given["config"] is None else given["config"], run=given["run"],
                      batch=given["batch"], dry_run=given["dry_run"], env_file=given["env_file"], overrides=overrides)
    if given["full"] and not options.dry_run:
        raise UserError("--full shows more of a dry run: give it with --dry-run")
    if options.run and options.batch:
        raise UserError("--run and --batch: choose one (--run follows the job, --batch returns after submitting)")
    job = compile_job(stage, options)
    if options.dry_run:
        from .dryrun import print_dry_run

        print_dry_run(job, show_full=given["full"])
        return
    if (done := stage.parts().done) and (why := done(job)):  # up to date: nothing to submit
        print(why)
        return
    from ..launch import launch

    launch(job)
