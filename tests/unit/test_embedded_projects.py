"""The embedded server's database of a project: which directory is the project, what
its database is called, and that an App remembers the module that made it."""

from __future__ import annotations

from pathlib import Path

import pytest

import asyncq
from asyncq import embedded


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


@pytest.mark.parametrize("marker", embedded.PROJECT_MARKERS)
def test_the_project_is_the_nearest_directory_with_a_marker(tmp_path: Path, marker: str) -> None:
    root = tmp_path / "shop"
    touch(root / marker) if marker != ".git" else (root / ".git").mkdir(parents=True)
    module = touch(root / "src" / "shop" / "jobs.py")
    assert embedded.project_directory(str(module)) == root.resolve()
    assert embedded.project_directory(str(touch(root / "jobs.py"))) == root.resolve()


def test_a_nearer_marker_wins(tmp_path: Path) -> None:
    touch(tmp_path / "mono" / ".git" / "HEAD")
    touch(tmp_path / "mono" / "services" / "billing" / "pyproject.toml")
    module = touch(tmp_path / "mono" / "services" / "billing" / "app" / "jobs.py")
    assert embedded.project_directory(str(module)).name == "billing"


def test_without_a_marker_the_project_is_the_files_directory(tmp_path: Path) -> None:
    # tmp_path has no marker above it (a pytest temporary directory)
    module = touch(tmp_path / "scratch" / "try_asyncq.py")
    assert embedded.project_directory(str(module)) == module.parent.resolve()


def test_without_a_file_the_project_is_found_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touch(tmp_path / "shop" / "setup.cfg")
    (tmp_path / "shop" / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "shop" / "notebooks")
    assert embedded.project_directory(None) == (tmp_path / "shop").resolve()


@pytest.mark.parametrize(
    ("directory", "database"),
    [
        ("shop", "asyncq_shop"),
        ("My-Shop 2", "asyncq_my_shop_2"),
        ("fastapi.example", "asyncq_fastapi_example"),
        ("__tmp__", "asyncq_tmp"),
        ("Café", "asyncq_caf"),
    ],
)
def test_the_database_name(directory: str, database: str) -> None:
    assert embedded.database_name(Path("/home/ann") / directory) == database


def test_a_long_or_foreign_name_is_cut_with_a_hash() -> None:
    long = embedded.database_name(Path("/p") / ("a" * 80))
    assert len(long.encode()) == 63 and long.startswith("asyncq_aaaa")
    other = embedded.database_name(Path("/p") / ("a" * 79 + "b"))
    assert len(other) == 63 and other != long
    assert embedded.database_name(Path("/p") / ("a" * 80)) == long  # stable
    foreign = embedded.database_name(Path("/p") / "日本")
    assert foreign.startswith("asyncq_") and len(foreign) == len("asyncq_") + 8
    assert foreign != embedded.database_name(Path("/p") / "中国")


def test_the_app_remembers_the_module_that_made_it() -> None:
    assert asyncq.App()._origin == __file__


@pytest.mark.parametrize("bad", ["", "  ", "x" * 64, "é" * 32, 5])
def test_a_bad_embedded_database_is_refused(bad: object) -> None:
    with pytest.raises(asyncq.ConfigurationError, match="embedded database"):
        asyncq.App(embedded_database=bad)  # type: ignore[arg-type]
