"""asyncq as it was at another commit, importable beside the working tree's asyncq.

``python -m benchmarks.run --baseline REF`` measures asyncq at REF side by side with the
working tree's. The package at REF (``git archive REF asyncq``) is extracted into a
temporary directory as ``asyncq_baseline``, its absolute imports of ``asyncq`` and its
``resources.files("asyncq")`` renamed; nothing else is touched (SQL, table and channel
names stay). The harness and the baseline's worker processes put that directory on
``sys.path`` (``benchmarks.worker --path``).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT

PACKAGE = "asyncq_baseline"

# `from asyncq import ...`, `from asyncq.x import ...` (also indented, as under TYPE_CHECKING)
_FROM = re.compile(r"^(\s*)from asyncq(?=[.\s])", re.MULTILINE)
# `import asyncq` and `import asyncq as name`: the name stays bound as before
_IMPORT = re.compile(r"^(\s*)import asyncq(\s*(?:#.*)?)$", re.MULTILINE)
_IMPORT_AS = re.compile(r"^(\s*)import asyncq(\s+as\s+\w+)", re.MULTILINE)
# `resources.files("asyncq")`, `files("asyncq.dashboard")`, `PackageLoader("asyncq.x", ...)`:
# the package's SQL files, templates and styles
_FILES = re.compile(r"""\b(files|PackageLoader)\((["'])asyncq(\.[\w.]+)?\2""")


@dataclass(frozen=True)
class Baseline:
    """A commit of this repository whose asyncq/ is measured as the baseline."""

    ref: str
    commit: str
    short: str
    subject: str

    @property
    def title(self) -> str:
        return f"asyncq@{self.short}"


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def resolve(ref: str) -> Baseline:
    """The commit ``ref`` names; ValueError when it names none, or one without asyncq/."""
    done = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if done.returncode != 0:
        raise ValueError(f"{ref!r} is not a commit of {ROOT}")
    commit = done.stdout.decode().strip()
    if _git("cat-file", "-e", f"{commit}:asyncq/__init__.py").returncode != 0:
        raise ValueError(f"commit {commit[:10]} has no asyncq/__init__.py")
    short = _git("rev-parse", "--short", commit).stdout.decode().strip()
    subject = _git("log", "-1", "--format=%s", commit).stdout.decode().strip()
    return Baseline(ref=ref, commit=commit, short=short, subject=subject)


def rewrite(source: str) -> str:
    """``source`` with its absolute imports of asyncq made imports of asyncq_baseline."""
    source = _FROM.sub(rf"\1from {PACKAGE}", source)
    source = _IMPORT.sub(rf"\1import {PACKAGE} as asyncq\2", source)
    source = _IMPORT_AS.sub(rf"\1import {PACKAGE}\2", source)
    return _FILES.sub(rf"\1(\2{PACKAGE}\3\2", source)


def _is_asyncq(name: str | None) -> bool:
    return name is not None and (name == "asyncq" or name.startswith("asyncq."))


def leftovers(package_dir: Path) -> list[str]:
    """Where the rewritten package would still import asyncq itself (should be none)."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"), str(path))
        for node in ast.walk(tree):
            names: list[str | None] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Call) and node.args:
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                first = node.args[0]
                if called in ("files", "import_module", "PackageLoader") and isinstance(
                    first, ast.Constant
                ):
                    names = [first.value if isinstance(first.value, str) else None]
            if any(_is_asyncq(name) for name in names):
                found.append(f"{path.relative_to(package_dir.parent)}:{node.lineno}")
    return found


def extract(baseline: Baseline, into: Path) -> Path:
    """Write asyncq/ of ``baseline`` to ``into``/asyncq_baseline; returns that directory."""
    done = _git("archive", "--format=tar", baseline.commit, "asyncq")
    if done.returncode != 0:
        raise RuntimeError(f"git archive {baseline.short}: {done.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(into, filter="data")
    package_dir = into / PACKAGE
    (into / "asyncq").rename(package_dir)
    for path in package_dir.rglob("*.py"):
        text = path.read_text("utf-8")
        changed = rewrite(text)
        if changed != text:
            path.write_text(changed, "utf-8")
    missed = leftovers(package_dir)
    if missed:
        raise RuntimeError(
            f"asyncq at {baseline.short} imports asyncq in a form not renamed: {', '.join(missed)}"
        )
    return package_dir
