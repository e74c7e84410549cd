"""A build hook: the ``asyncq`` command's help, taken from its parser at build time.

A page that holds the line ``<!-- asyncq-cli-help -->`` gets, in its place, the help of
``asyncq`` and of each of its commands, as ``asyncq COMMAND --help`` prints them, so
the reference cannot drift from ``asyncq/cli.py``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- asyncq-cli-help -->"


def _help() -> str:
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal's width
    from asyncq.cli import build_parser

    parser = build_parser()
    parts = ["## `asyncq`", "", "```", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts += [f"## `asyncq {name}`", "", "```", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, _help())
