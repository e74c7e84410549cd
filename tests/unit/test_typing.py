"""A task's ``defer`` is checked by mypy against its function's parameters (`Task` is
generic over a ParamSpec): a user's wrong call is a type error, a right one is not."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

HEAD = """\
import asyncq

app = asyncq.App()


@app.task
async def send(order_id: int, note: str = "") -> None: ...


@app.task(queue="other")
async def total(order_id: int) -> int:
    return order_id


@app.task
def resize(path: str, width: int = 100) -> bytes:
    return b""


@app.task(queue="images")
def crop(path: str) -> str:
    return path


async def main() -> None:
"""

# Each wrong call, and the error mypy must report for it.
WRONG = [
    ('await send.defer("7")', "arg-type", 'incompatible type "str"; expected "int"'),
    ("await send.defer()", "call-arg", 'Missing positional argument "order_id"'),
    ("await send.defer(7, colour=1)", "call-arg", 'Unexpected keyword argument "colour"'),
    ("await send.defer(order_id=7, note=3)", "arg-type", 'incompatible type "int"; expected "str"'),
    ('await send.options(delay=1).defer("7")', "arg-type", '"defer" of "Deferrer"'),
    ("await total.options(priority=1).defer()", "call-arg", "Missing positional argument"),
    ("await total.options(queue='q').defer(7, 8)", "call-arg", "Too many arguments"),
    ("x: str = await send.defer(7)", "assignment", 'expression has type "int"'),
    ("y: str = await total(7)", "assignment", 'expression has type "int"'),
    ("resize.defer_sync(7)", "arg-type", 'incompatible type "int"; expected "str"'),
    ('resize.defer_sync("a.png", height=5)', "call-arg", 'Unexpected keyword argument "height"'),
    ("crop.options(priority=1).defer_sync()", "call-arg", "Missing positional argument"),
    ("await crop.defer(1)", "arg-type", 'incompatible type "int"; expected "str"'),
    ('z: str = resize("a.png")', "assignment", 'expression has type "bytes"'),
]

RIGHT = [
    "await send.defer(7)",
    'await send.defer(7, note="gift")',
    "await send.defer(order_id=7)",
    "await send.options(delay=1, priority=2).defer(7)",
    "await total.options(queue='q').defer(order_id=7)",
    "ids: list[int] = await send.defer_many([{'order_id': 7}])",
    "n: int = await total(7)",
    "job_id: int = await total.defer(7)",
    'sync_id: int = resize.defer_sync("a.png", width=50)',
    'resized: bytes = resize("a.png")',
    'cropped: str = crop("a.png")',
    'crop_id: int = await crop.options(queue="q").defer("a.png")',
    "sent_id: int = send.defer_sync(7)",
]


def _module(calls: list[str]) -> str:
    return HEAD + "".join(f"    {call}\n" for call in calls)


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("typing")
    (folder / "wrong.py").write_text(_module([call for call, _, _ in WRONG]))
    (folder / "right.py").write_text(_module(RIGHT))
    config = folder / "mypy.ini"
    config.write_text("[mypy]\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(folder / ".mypy_cache"),
            "--config-file",
            str(config),  # mypy's defaults and the flags above, not the repository's
            "wrong.py",
            "right.py",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.stdout


def test_each_wrong_defer_is_reported(mypy_output: str) -> None:
    first = HEAD.count("\n") + 1
    errors = {
        int(match[1]): match[0]
        for match in re.finditer(r"^wrong\.py:(\d+): error: .*$", mypy_output, re.M)
    }
    for line, (call, code, text) in enumerate(WRONG, start=first):
        found = errors.get(line, "")
        assert f"[{code}]" in found and text in found, (
            f"{call}: {found or 'no error'}\n{mypy_output}"
        )
    assert set(errors) == set(range(first, first + len(WRONG))), mypy_output


def test_right_defers_pass(mypy_output: str) -> None:
    assert "right.py" not in mypy_output, mypy_output
