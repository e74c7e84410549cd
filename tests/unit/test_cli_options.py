"""The global options (``--log-level``, ``--log-format``) before the command, as
``asyncq --log-format json worker MODULE:APP``, and after it, as the contract writes
``asyncq worker MODULE:APP --log-format json``: for every command. The log level each
command has unless asked, and MODULE:APP and job ids in either order."""

from __future__ import annotations

import argparse

import pytest

from asyncq.cli import build_parser, parse_args

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
    "limits": ["m:app"],
    "jobs": ["m:app"],
    "job": ["m:app", "1"],
    "workers": ["m:app"],
    "queues": ["m:app"],
    "stats": ["m:app"],
    "prune": ["m:app"],
    "bulk": ["m:app", "requeue"],
    "audit": ["m:app"],
    "dashboard": ["m:app"],
}


def parse(*argv: str) -> argparse.Namespace:
    return parse_args(argv)


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
    assert plain.log_format == "text"
    # Given in both places, the one after the command wins.
    both = parse("--log-level", "ERROR", command, *rest, "--log-level", "DEBUG")
    assert both.log_level == "DEBUG"


def test_a_bad_value_after_the_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("worker", "m:app", "--log-format", "yaml")
    assert exited.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_only_the_commands_that_run_or_change_the_schema_log_at_info_unless_asked(
    command: str,
) -> None:
    """A command that prints what it found (``asyncq jobs``) logs only warnings: no line
    about the database it uses before its table, unless asked with --log-level."""
    rest = COMMANDS[command]
    assert parse(command, *rest).log_level == (
        "INFO" if command in ("worker", "migrate", "dashboard") else "WARNING"
    )
    assert parse(command, *rest, "--log-level", "INFO").log_level == "INFO"
    assert parse("--log-level", "INFO", command, *rest).log_level == "INFO"


@pytest.mark.parametrize(
    ("argv", "app", "ids"),
    [
        (["job", "m:app", "42"], "m:app", 42),
        (["job", "42", "m:app"], "m:app", 42),
        (["job", "42", "m:app", "--json"], "m:app", 42),
        (["retry", "7", "m:app", "--from-step", "pack"], "m:app", 7),
        (["cancel", "3", "1", "2", "m:app"], "m:app", [3, 1, 2]),
        (["cancel", "3", "m:app", "4"], "m:app", [3, 4]),
        (["requeue", "5", "m:app"], "m:app", [5]),
        (["requeue", "m:app", "--queue", "q", "5"], "m:app", [5]),
    ],
)
def test_the_app_and_the_job_ids_in_either_order(
    argv: list[str], app: str, ids: int | list[int]
) -> None:
    args = parse(*argv)
    assert args.app == app
    assert (args.ids if isinstance(ids, list) else args.id) == ids


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["job", "m:app", "x"], "argument ID: 'x' is not a job id"),
        (["cancel", "m:app", "1", "n:app"], "expected one MODULE:APP, got m:app and n:app"),
    ],
)
def test_a_word_for_a_job_id_or_two_apps_are_refused(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(*argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_without_an_app_the_first_id_is_left_for_the_app_path_to_refuse() -> None:
    args = parse("job", "42", "43")
    assert (args.app, args.id) == ("42", 43)  # load_app: "expected MODULE:APP, got '42'"
