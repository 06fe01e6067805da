"""How every command group of the CLI is made: plain help (-h too), no completion, no pretty tracebacks."""

from __future__ import annotations

import typer

HELP = {"help_option_names": ["-h", "--help"]}


def new_group(name: str, help: str) -> typer.Typer:
    return typer.Typer(name=name, help=help, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
                       pretty_exceptions_enable=False, context_settings=HELP)
