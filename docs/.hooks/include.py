"""A build hook: a page holding ``<!-- include: PATH -->`` (PATH from the repository's
root) gets that file in its place, so a document kept beside its code (the benchmarks'
``benchmarks/README.md``) is on the site without a copy that could drift from it.

The file's first heading is left out (the page has its own title). Its relative links
are rewritten to work from the page: a link into ``docs/`` becomes a link to that page
of the site, and a link to another file of the repository (a chart, a JSON file) is
served by the site at the same path.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

MARKER = re.compile(r"^<!-- include: (\S+) -->$", re.M)
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def _root(config: Any) -> Path:
    return Path(config["config_file_path"]).parent


def _included(config: Any) -> list[tuple[str, str]]:
    """(page, included file) for every marker in the docs, both repository paths."""
    docs = Path(config["docs_dir"])
    root = _root(config)
    found = []
    for page in sorted(docs.rglob("*.md")):
        for path in MARKER.findall(page.read_text("utf-8")):
            found.append((page.relative_to(root).as_posix(), path))
    return found


def _targets(config: Any, source: str) -> set[str]:
    """The repository paths the relative links of ``source`` lead to, outside docs/."""
    root = _root(config)
    text = (root / source).read_text("utf-8")
    base = posixpath.dirname(source)
    targets = set()
    for _, target, _ in LINK.findall(text):
        if "://" in target or target.startswith("/"):
            continue
        path = posixpath.normpath(posixpath.join(base, target))
        if not path.startswith("docs/") and (root / path).is_file():
            targets.add(path)
    return targets


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    root = _root(config)
    for _, source in _included(config):
        for path in sorted(_targets(config, source)):
            if files.get_file_from_path(path) is None:
                files.append(File.generated(config, path, abs_src_path=str(root / path)))
    return files


def _rewrite(text: str, source: str, page: str) -> str:
    base = posixpath.dirname(source)
    page_dir = posixpath.dirname(page.removeprefix("docs/"))

    def link(match: re.Match[str]) -> str:
        opening, target, rest = match.groups()
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        path = posixpath.normpath(posixpath.join(base, target))
        site_path = path.removeprefix("docs/")
        return opening + posixpath.relpath(site_path, page_dir or ".") + rest

    return LINK.sub(link, text)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    root = _root(config)
    page_path = "docs/" + page.file.src_uri

    def include(match: re.Match[str]) -> str:
        source = match.group(1)
        text = (root / source).read_text("utf-8")
        text = re.sub(r"\A# [^\n]*\n+", "", text)  # the page has its own title
        return _rewrite(text, source, page_path)

    return MARKER.sub(include, markdown)
