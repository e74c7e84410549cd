"""The global options (``--log-level``, ``--log-format``) before the command, as
``asyncq --log-format json worker MODULE:APP``, and after it, as the contract writes
``asyncq worker MODULE:APP --log-format json``: for every command."""

from __future__ import annotations

import argparse

import pytest

from asyncq.cli import build_parser

# The least each command takes.
COMMANDS = {
    "worker": ["m:app"],
    "migrate": ["m:app"],
    "requeue": ["m:app", "1"],
    "schedules": ["m:app"],
    "cancel": ["m:app", "1"],
    "retry": ["m:app", "1"],
    "pause": ["m:app", "q"],
    "resume": ["m:app", "q"],
    "jobs": ["m:app"],
    "job": ["m:app", "1"],
    "workers": ["m:app"],
    "queues": ["m:app"],
    "stats": ["m:app"],
    "prune": ["m:app"],
    "dashboard": ["m:app"],
}


def parse(*argv: str) -> argparse.Namespace:
    args, extra = build_parser().parse_known_args(argv)
    assert not extra
    return args


def test_every_command_is_listed_here() -> None:
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_global_options_after_the_command(command: str) -> None:
    rest = COMMANDS[command]
    after = parse(command, *rest, "--log-format", "json", "--log-level", "DEBUG")
    assert (after.command, after.log_format, after.log_level) == (command, "json", "DEBUG")
    between = parse(command, "--log-level=WARNING", *rest)
    assert (between.log_format, between.log_level) == ("text", "WARNING")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_global_options_before_the_command_still_hold(command: str) -> None:
    rest = COMMANDS[command]
    before = parse("--log-format", "json", "--log-level", "ERROR", command, *rest)
    assert (before.log_format, before.log_level) == ("json", "ERROR")
    plain = parse(command, *rest)
    assert (plain.log_format, plain.log_level) == ("text", "INFO")
    # Given in both places, the one after the command wins.
    both = parse("--log-level", "ERROR", command, *rest, "--log-level", "DEBUG")
    assert both.log_level == "DEBUG"


def test_a_bad_value_after_the_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("worker", "m:app", "--log-format", "yaml")
    assert exited.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err
