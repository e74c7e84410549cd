"""The documentation site's build is strict: a broken link, or a public object of asyncq
without a docstring, fails ``mkdocs build --strict`` (what ``.ci/run`` runs). Each test
builds a copy in a temporary directory. Skipped without the ``docs`` extra."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("griffe") is None,
    reason="the docs extra is not installed (pip install -e '.[docs]')",
)


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site / "out")],
        cwd=site,
        capture_output=True,
        text=True,
        timeout=110,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def copy_site(site: Path) -> None:
    """What the site is built from: mkdocs.yml, docs/, asyncq/ (its docstrings and its
    command's help), and the files of benchmarks/ that its page includes."""
    shutil.copy(ROOT / "mkdocs.yml", site)
    shutil.copytree(ROOT / "docs", site / "docs")
    shutil.copytree(ROOT / "asyncq", site / "asyncq")
    (site / "benchmarks").mkdir()
    for path in [ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "full-run.json"]:
        shutil.copy(path, site / "benchmarks")
    for chart in (ROOT / "benchmarks").glob("*.png"):
        shutil.copy(chart, site / "benchmarks")


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy_site(tmp_path)
    assert build(tmp_path).returncode == 0  # the site as it is builds
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = build(tmp_path)
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


def test_a_public_object_without_a_docstring_fails_the_build(tmp_path: Path) -> None:
    package = tmp_path / "asyncq"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A stand-in for asyncq."""\n\n__all__ = ["documented", "undocumented"]\n\n\n'
        'def documented() -> None:\n    """Has one."""\n\n\n'
        "def undocumented() -> None:\n    pass\n"
    )
    (package / "dashboard.py").write_text(
        '"""The dashboard."""\n\n\ndef create_app() -> None:\n    """Has one."""\n'
    )
    docs = tmp_path / "docs"
    (docs / ".hooks").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / ".hooks" / "docstrings.py", docs / ".hooks")
    (docs / "index.md").write_text("# Home\n")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\nstrict: true\nhooks:\n  - docs/.hooks/docstrings.py\n"
    )
    result = build(tmp_path)
    assert result.returncode != 0
    assert "public object without a docstring: asyncq.undocumented" in result.stderr
    assert "asyncq.documented" not in result.stderr


def test_the_benchmarks_page_is_the_benchmarks_readme(tmp_path: Path) -> None:
    """docs/explanation/benchmarks.md includes benchmarks/README.md at build time: an
    edit of the one shows on the other, and the README's charts are served."""
    copy_site(tmp_path)
    readme = tmp_path / "benchmarks" / "README.md"
    readme.write_text(readme.read_text() + "\n## A run written today\n\nIt ran.\n")
    assert build(tmp_path).returncode == 0
    page = (tmp_path / "out" / "explanation" / "benchmarks" / "index.html").read_text()
    assert "A run written today" in page
    assert 'src="../../benchmarks/throughput.png"' in page
    assert (tmp_path / "out" / "benchmarks" / "throughput.png").is_file()
    (tmp_path / "benchmarks" / "shape.png").unlink()  # a link to it now leads nowhere
    result = build(tmp_path)
    assert result.returncode != 0
    assert "shape.png" in result.stderr
