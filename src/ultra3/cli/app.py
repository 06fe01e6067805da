"""`nemotron ultra3 <stage>` / `ultra3 <stage>` and `nemotron jobs ...`, built from the stage registry.

Start-up stays light: nothing heavier than Typer is imported until a command runs, and NeMo-Run
only when a job is submitted to Slurm.
"""

from __future__ import annotations

import atexit
import difflib
import gc
import inspect
import os
import re
import sys
from typing import List, Optional

import typer
from typer.core import TyperCommand

try:  # Typer 0.29+ carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover
    from click import exceptions as cx

from ..stage import Flag, Stage
from ..stages import STAGES
from .groups import HELP, new_group
from .jobs_app import build_jobs

def _verbose(value: bool) -> None:
    """The job learns it from its environment (run.env), where the compiled config puts VERBOSE_VAR=1."""
    if value:
        from ..contract import VERBOSE_VAR

        os.environ[VERBOSE_VAR] = "1"


# Options every stage takes, after `ultra3` (before the stage name) or after the stage name.
SHARED_OPTIONS = {
    "config": (Optional[str], typer.Option(None, "-c", "--config", metavar="NAME|PATH",
                                           help="Stage config name or YAML path.")),
    "run": (Optional[str], typer.Option(None, "-r", "--run", metavar="PROFILE",
                                        help="Submit with this env.toml profile and follow it.")),
    "batch": (Optional[str], typer.Option(None, "-b", "--batch", metavar="PROFILE",
                                          help="Submit with this env.toml profile and return.")),
    "dry_run": (bool, typer.Option(False, "-d", "--dry-run",
                                   help="Validate and print a summary of the compiled job (where it runs, "
                                        "findings, inputs, resources, cost); submit nothing.")),
    "full": (bool, typer.Option(False, "--full", help="With --dry-run: also the compiled config and the job's "
                                                      "script (the sbatch or command it would run).")),
    "env_file": (Optional[str], typer.Option(None, "--env-file", metavar="PATH",
                                             help="env.toml to read profiles from.")),
    "verbose": (bool, typer.Option(False, "-v", "--verbose", callback=_verbose,
                                   help="Keep the libraries' warnings, INFO lines and progress bars in the job's "
                                        "log (Megatron, transformers, ModelOpt, tqdm, Ray).")),
}


def _with_shared_options(fn, flags: tuple[Flag, ...] = ()):
    """Declare SHARED_OPTIONS (and a stage's own flags) as keyword parameters of `fn(..., **options)`,
    where Typer reads them."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    options = {**SHARED_OPTIONS, **{f.key: _flag_option(f) for f in flags}}
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
               for name, (kind, option) in options.items()]
    fn.__signature__ = sig.replace(parameters=params)
    return fn


def _flag_option(flag: Flag):
    if flag.kind is str:
        return Optional[str], typer.Option(None, flag.option, metavar="RUN[@N]", help=flag.help)
    if flag.kind is bool:
        return bool, typer.Option(False, flag.option, help=flag.help)
    return Optional[flag.kind], typer.Option(None, flag.option, metavar="N", help=flag.help)


class StageCommand(TyperCommand):
    """Help shows the stage's configs, the profiles found and examples, computed when asked for."""

    stage: Stage

    @property
    def epilog(self) -> str:  # type: ignore[override]
        from ..paths import config_names

        by = "-c, or the first word" if self.stage.named_configs else "-c"
        lines = ["\b", f"Configs ({by}): {', '.join(config_names(self.stage.config_dir))}",
                 *([f"  {self.stage.configs_note}"] if self.stage.configs_note else []), _profiles_line()]
        shown = dict.fromkeys(t for e in self.stage.examples for t in e.split()[1:] if "=" in t and t[0] != "-")
        lines.append(f"Overrides: dotted key=value, e.g. {' '.join([*list(shown)[:2], 'run.time=01:00:00'])}")
        for inp in self.stage.inputs:  # from the registry: what the stage consumes and makes
            when = " (" + ", ".join([*([f"when {inp.when} is set"] if inp.when else []),
                                     *([f"unless {inp.unless}"] if inp.unless else [])]) + ")" \
                if inp.unless or inp.when else "" if inp.required else " (optional)"
            lines.append(f"Input {inp.name}: {inp.key} <- {' or '.join(inp.kinds)}{when}")
        if self.stage.inputs:
            lines.append("  unset: the profile's newest artifact; else a path, job:ID or NAME:vN")
        if self.stage.outputs:
            lines.append(f"Publishes: {', '.join(o.kind for o in self.stage.outputs)}")
        lines += ["", "\b", "Examples:", *(f"  {e}" for e in self.stage.examples)]
        return "\n".join(lines)

    @epilog.setter
    def epilog(self, _value: str | None) -> None:
        pass


def _profiles_line() -> str:
    """The profiles of the env.toml the command would read, for help."""
    from ..profiles import profile_names

    path, profiles = profile_names(_env_file_arg(sys.argv[1:]))
    return (f"Profiles (--run/--batch): {', '.join(profiles) if profiles else 'none'}"
            f"{f' in {path}' if path else ' (no env.toml found)'}")


def _stage_command(stage: Stage):
    def command(
        ctx: typer.Context,
        overrides: Optional[List[str]] = typer.Argument(
            None, metavar="[CONFIG] [KEY=VALUE]..." if stage.named_configs else "[KEY=VALUE]...", show_default=False),
        **options,
    ) -> None:
        from .run_stage import run_stage

        overrides = list(overrides or [])
        if stage.named_configs and overrides and "=" not in overrides[0]:  # `container build data`: -c data
            word = overrides.pop(0)
            if options["config"] not in (None, word):
                raise cx.UsageError(f"'{word}' and -c {options['config']} both name the config; give one")
            options["config"] = word
        # a stage flag is its config key set on the command line, after the overrides
        values = {f.key: options.pop(f.key) for f in stage.flags}
        given = [f"{key}={str(v).lower() if isinstance(v, bool) else v}" for key, v in values.items()
                 if v is not None and v is not False]  # 0 too
        run_stage(stage, _merge_group_options(ctx, options), [*overrides, *given])

    command.__doc__ = stage.summary
    return _with_shared_options(command, stage.flags)


def _merge_group_options(ctx: typer.Context, given: dict) -> dict:
    group = (ctx.find_root().obj or {}).get("options", {})
    merged = dict(given)
    for key, value in group.items():
        if value in (None, False):
            continue
        if merged[key] not in (None, False) and merged[key] != value:
            raise cx.UsageError(f"--{key.replace('_', '-')} given twice with different values")
        merged[key] = value
    return merged


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"{os.path.basename(sys.argv[0]) or 'ultra3'} {__version__}")
        raise typer.Exit()


VERSION = typer.Option(False, "--version", is_eager=True, callback=_version, help="Print the version and exit.")


@_with_shared_options
def _group_callback(ctx: typer.Context, version: bool = VERSION, **options) -> None:
    """Nemotron 3 Ultra training recipe: pretrain, sft, RL, data prep, quantize, checkpoint conversion and container
    image stages, and pipes of them.

    \b
    Examples:
      ultra3 pretrain -c tiny --dry-run
      ultra3 data prep pretrain -c tiny
      ultra3 pretrain -c tiny --run mycluster
      ultra3 sft -c tiny --run mycluster
      ultra3 pipe -c tiny --dry-run
      nemotron jobs list
    """
    root = ctx.find_root()
    root.obj = root.obj or {}
    root.obj["options"] = options


PIPE_EXAMPLES = (
    "ultra3 pipe -c tiny --dry-run",
    "ultra3 pipe --batch mycluster",
    "ultra3 pipe -c tiny --run mycluster pretrain.train.train_iters=20",
    "ultra3 pipe -c tiny --run mycluster --to sft --force",
)


class PipeCommand(TyperCommand):
    @property
    def epilog(self) -> str:  # type: ignore[override]
        from ..paths import config_names

        return "\n".join(["\b", f"Pipes (-c): {', '.join(config_names('pipe'))}", _profiles_line(),
                          "Overrides: STEP.key=value, e.g. pretrain.train.train_iters=20", "", "\b", "Examples:",
                          *(f"  {e}" for e in PIPE_EXAMPLES)])

    @epilog.setter
    def epilog(self, _value: str | None) -> None:
        pass


@_with_shared_options
def _pipe_command(
    ctx: typer.Context,
    overrides: Optional[List[str]] = typer.Argument(None, metavar="[STEP.KEY=VALUE]...", show_default=False),
    start: Optional[str] = typer.Option(None, "--from", metavar="STEP", help="Start at this step; earlier "
                                        "steps' outputs come from their completed runs."),
    stop: Optional[str] = typer.Option(None, "--to", metavar="STEP", help="Stop after this step."),
    force: bool = typer.Option(False, "--force", help="Re-run steps that already completed with this config."),
    **options,
) -> None:
    """Run stages as one chain, each input wired to an earlier stage's output (Slurm: afterok)."""
    from .pipe import PipeOptions
    from .pipe_run import run_pipe

    given = _merge_group_options(ctx, options)
    run_pipe(PipeOptions(config="default" if given["config"] is None else given["config"], run=given["run"],
                         batch=given["batch"], dry_run=given["dry_run"], full=given["full"],
                         env_file=given["env_file"], start=start, stop=stop, force=force,
                         overrides=list(overrides or [])))


def build_ultra3() -> typer.Typer:
    app = new_group("ultra3", _group_callback.__doc__ or "")  # the group's description and examples
    app.callback(invoke_without_command=False)(_group_callback)
    groups: dict[tuple[str, ...], typer.Typer] = {(): app}
    for stage in STAGES:
        for depth in range(1, len(stage.words)):
            prefix = stage.words[:depth]
            if prefix not in groups:
                under = dict.fromkeys(s.words[depth] for s in STAGES if s.words[:depth] == prefix)
                sub = new_group(prefix[-1], f"The `{' '.join(prefix)}` commands: {', '.join(under)}.")
                groups[prefix[:-1]].add_typer(sub, name=prefix[-1])
                groups[prefix] = sub
        cls = type(f"{stage.slug}Command", (StageCommand,), {"stage": stage})
        groups[stage.words[:-1]].command(stage.words[-1], cls=cls, context_settings=HELP)(_stage_command(stage))
    app.command("pipe", cls=PipeCommand, context_settings=HELP)(_pipe_command)
    return app


def build_nemotron() -> typer.Typer:
    app = new_group("nemotron", "Nemotron training recipes launcher.")

    @app.callback()
    def _nemotron(version: bool = VERSION) -> None:
        pass

    app.add_typer(build_ultra3(), name="ultra3",
                  help="Nemotron 3 Ultra stages: pretrain, sft, rl, data prep, quantize, convert, pipe.")
    app.add_typer(build_jobs(), name="jobs")
    return app


def _env_file_arg(argv: list[str]) -> str | None:
    """--env-file's value on the command line, for help (which is shown before the options are parsed)."""
    for i, arg in enumerate(argv):
        if arg == "--env-file" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--env-file="):
            return arg.split("=", 1)[1]
    return None


def _command_hint(ctx, word: str) -> str:
    """For an unknown command: the stage whose words hold the typed ones in order (`data pretrain` ->
    `data prep pretrain`), else a close name among this group's commands (`SFT` -> `sft`)."""
    if ctx is None:
        return ""
    typed = [*ctx.command_path.split()[1:], word.lower()]
    if typed == ["kit"]:  # NVIDIA's quick start builds its images with `nemotron kit slurm build`
        return ("; NVIDIA's `nemotron kit slurm build` is `ultra3 container build [training|rl|data] --run|--batch "
                "PROFILE` here (or `nemotron ultra3 container build ...`)")
    if ctx.command_path.split()[0] == "nemotron" and typed[0] != "ultra3":
        return ("; this launcher has the Nemotron 3 Ultra stages only: "
                f"nemotron ultra3 {' '.join(typed[1:] or ['--help'])}")
    typed = [w for w in typed if w != "ultra3"]
    for stage in sorted(STAGES, key=lambda s: len(s.words)):
        words = iter(stage.words)
        if all(w in words for w in typed):
            return f"; did you mean '{' '.join(['ultra3', *stage.words])}'?"
    commands = list(getattr(ctx.command, "commands", {}) or {})
    close = difflib.get_close_matches(word.lower(), commands, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _main(app: typer.Typer, prog: str) -> None:
    from .. import __version__
    from ..errors import LauncherError

    if sys.argv[1:2] == ["--version"]:
        print(f"{prog} {__version__}")
        sys.exit(0)
    try:
        code = typer.main.get_command(app).main(sys.argv[1:], prog_name=prog, standalone_mode=False)
    except cx.NoArgsIsHelpError as e:
        print(e.ctx.get_help() if e.ctx else "")
        code = 0
    except cx.UsageError as e:  # one line, exit 2: unknown option, missing value, bad type...
        message = e.format_message()
        unknown = re.fullmatch(r"No such command '(.+)'\.", message)  # click's own did-you-mean is kept
        hint = _command_hint(e.ctx, unknown.group(1)) if unknown else ""
        hint += f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        print(f"error: {message.removesuffix('.') if hint.startswith(';') else message}{hint}", file=sys.stderr)
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        code = 130
    except LauncherError as e:
        for line in e.lines():
            print(line, file=sys.stderr)
        code = e.exit_code
    except OSError as e:  # the machine refused: a path, a permission, a full disk
        print(f"error: {e}", file=sys.stderr)
        code = 1
    except Exception as e:  # a bug of ours: one line, the traceback on request
        if os.environ.get("ULTRA3_DEBUG", "0") not in ("", "0"):
            raise
        print(f"internal error: {type(e).__name__}: {e} (a launcher bug; ULTRA3_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        code = 1
    # the last thing before the interpreter's teardown: its collections then skip what the run left (after a
    # submission, NeMo-Run's ~170,000 objects: 2 s of exit)
    atexit.register(gc.freeze)
    sys.exit(code or 0)


def nemotron_main() -> None:
    _main(build_nemotron(), "nemotron")


def ultra3_main() -> None:
    _main(build_ultra3(), "ultra3")
