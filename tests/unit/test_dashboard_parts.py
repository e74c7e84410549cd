"""The dashboard's pure parts: the command's defaults, the chart's layout, the metrics
text, and that asyncq never imports the dashboard's extra unless asked to."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest

from asyncq.cli import build_parser


def test_the_command_binds_to_localhost_by_default() -> None:
    args = build_parser().parse_args(["dashboard", "jobs:app"])
    assert (args.host, args.port, args.read_only) == ("127.0.0.1", 8080, False)
    assert (args.allowed_host, args.insecure_no_auth) == ([], False)
    names = ["--allowed-host", "jobs.example", "--allowed-host", "[::1]:9", "--insecure-no-auth"]
    args = build_parser().parse_args(
        ["dashboard", "jobs:app", "--host", "0.0.0.0", "--port", "9000", "--read-only", *names]
    )
    assert (args.host, args.port, args.read_only) == ("0.0.0.0", 9000, True)
    assert (args.allowed_host, args.insecure_no_auth) == (["jobs.example", "[::1]:9"], True)


def test_asyncq_and_its_command_import_without_the_dashboard_extra() -> None:
    code = (
        "import sys, asyncq, asyncq.cli, asyncq.admin\n"
        "found = [m for m in ('starlette', 'jinja2', 'uvicorn', 'asyncq.dashboard')"
        " if m in sys.modules]\n"
        "assert not found, found\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_chart_stacks_each_minutes_endings_and_scales_to_the_peak() -> None:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from asyncq.dashboard import chart

    now = datetime(2026, 1, 1, 12, 30, 40, tzinfo=UTC)
    minute = now.replace(second=0)
    rows = [
        (minute, "done", 6),
        (minute, "failed", 2),
        (minute - timedelta(minutes=1), "done", 4),
        (minute - timedelta(minutes=90), "done", 100),  # outside the window: not drawn
    ]
    drawn = chart.throughput(rows, now=now, minutes=60)
    assert drawn.peak == 8
    last, failed, before = drawn.bars[-2], drawn.bars[-1], drawn.bars[0]
    plot = chart.HEIGHT - chart.AXIS
    assert (last.title, failed.title, before.title) == (
        "12:30 done: 6",
        "12:30 failed: 2",
        "12:29 done: 4",
    )
    assert last.height + failed.height == pytest.approx(plot, abs=0.2)
    assert failed.y + failed.height == pytest.approx(last.y, abs=0.2)  # stacked on top
    assert before.height == pytest.approx(plot / 2, abs=0.2)
    assert last.x > before.x
    assert [label for _, label in drawn.labels] == [
        "11:31",
        "11:41",
        "11:51",
        "12:01",
        "12:11",
        "12:21",
    ]
    assert chart.throughput([], now=now, minutes=60).bars == []
    # The database's session time zone does not move the bars or the labels.
    elsewhere = now.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert chart.throughput(rows, now=elsewhere, minutes=60) == drawn


def test_the_command_without_the_extra_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['starlette'] = None  # as if not installed\n"
        "from asyncq.cli import main\n"
        "sys.exit(main(['dashboard', 'tests.harness.app:app']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert "pip install 'asyncq[dashboard]'" in done.stderr
