"""Worker settings: defaults, bounds, and the two ways to give them (the command line and
run_worker) derived from one list."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, get_type_hints

import pytest

import asyncq
from asyncq.worker import settings
from asyncq.worker.settings import WorkerOptions, WorkerSettings


def test_the_defaults() -> None:
    s = WorkerSettings()
    assert (s.queues, s.concurrency, s.batch, s.lease, s.grace, s.poll_interval) == (
        None,
        10,
        100,
        30.0,
        20.0,
        1.0,
    )
    assert (s.prefetch, s.threads) == (400, 10)
    assert WorkerSettings(concurrency=500).batch == 100
    # Without claiming ahead, a claim takes no more than can run.
    assert WorkerSettings(concurrency=20, prefetch=0).batch == 20
    assert WorkerSettings(queues="one").queues == ("one",)


def test_run_worker_options_are_exactly_the_settings_options() -> None:
    options = {f.name for f in fields(WorkerSettings) if "option" in f.metadata} - {"queues"}
    assert set(get_type_hints(WorkerOptions)) == options


def test_every_option_with_a_flag_is_on_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for f in fields(WorkerSettings):
        spec = f.metadata.get("option")
        if spec is not None:
            assert set(spec.flags) <= flags


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], (None, {})),
        (["-q", "a", "--queue", "b", "-c", "5"], (("a", "b"), {"concurrency": 5})),
        (["--lease", "2.5", "--drain"], (None, {"lease": 2.5, "drain": True})),
    ],
)
def test_command_line_values(argv: list[str], expected: Any) -> None:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    assert settings.from_arguments(parser.parse_args(argv)) == expected


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--lease", "inf"], "--lease must be a number of seconds from 0.5 to 604800, not 'inf'"),
        (["--poll-interval", "0"], "--poll-interval must be"),
        (["--concurrency", "1.5"], "--concurrency must be a whole number from 1"),
        (["--queue", "bad\nname"], "control characters"),
    ],
)
def test_bad_command_line_values_name_their_flag(argv: list[str], says: str) -> None:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    with pytest.raises(asyncq.ConfigurationError) as raised:
        settings.from_arguments(parser.parse_args(argv))
    assert says in str(raised.value)


def test_unknown_run_worker_options_are_refused() -> None:
    with pytest.raises(TypeError, match="concurency"):
        settings.from_options(None, concurency=3)
