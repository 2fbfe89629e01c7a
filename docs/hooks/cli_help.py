"""A mkdocs hook for the CLI reference (docs/reference/cli.md, written by mkdocs-click): each
command's help shows on the site as ``tghost COMMAND --help`` prints it on a reader's machine.

- A paragraph that click prints line by line (the lines after a ``\\b`` line: a quick start, a
  list of exit codes) becomes a ```text block. mkdocs-click drops the ``\\b`` and hands the
  lines on as prose, which Markdown joins into one line (mkdocs/mkdocs-click#59).
- A default under tghost's own folder shows as ``~/.config/tghost/...``, as click's app dir is
  on Linux for any reader, not under the home directory of the machine that built the site.

Both change only the click commands loaded in the mkdocs process, before any page is built.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from typing import Any

import click

NO_REWRAP = "\b"


def on_config(config: Any) -> Any:
    os.environ["XDG_CONFIG_HOME"] = "~/.config"  # before the commands' modules compute their help
    from tghost.cli.app import cli

    for command in commands(cli, click.Context(cli, info_name="tghost")):
        if command.help and NO_REWRAP in command.help:
            command.help = fenced(command.help)
    return config


def commands(group: click.Group, ctx: click.Context) -> Iterator[click.Command]:
    """``group`` and every command under it, at any depth."""
    yield group
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from commands(command, click.Context(command, parent=ctx, info_name=name))
        elif command is not None:
            yield command


def fenced(text: str) -> str:
    """The help ``text`` with each paragraph that starts with a ``\\b`` line as a ```text block."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join("\n".join(["```text", *lines[1:], "```"])
                       if (lines := paragraph.splitlines()) and lines[0].strip() == NO_REWRAP else paragraph
                       for paragraph in paragraphs)
