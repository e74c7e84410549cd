"""A build hook: every public object of asyncq has a docstring.

``mkdocs build --strict`` turns the warnings logged here into a failed build, so a
public class, function, method or property without a docstring fails CI. "Public" is
what ``asyncq.__all__`` and ``asyncq.testing.__all__`` export (and
``asyncq.dashboard.create_app``), and the public methods and properties of the classes
among them. Read with griffe, as mkdocstrings
reads it, so a dataclass's generated ``__doc__`` does not count as a docstring.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import griffe

log = logging.getLogger("mkdocs.hooks.docstrings")

EXTRA = ["asyncq.dashboard.create_app"]


def _missing(obj: Any, path: str) -> list[str]:
    target = obj.final_target if obj.is_alias else obj
    missing = [] if target.docstring else [path]
    if target.is_class:
        for name, member in target.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            documentable = member.is_function or (
                member.is_attribute and "property" in member.labels
            )
            if documentable and not member.docstring:
                missing.append(f"{path}.{name}")
    return missing


def on_config(config: Any) -> Any:
    root = Path(config["config_file_path"]).parent  # asyncq/ sits beside mkdocs.yml
    package = griffe.load("asyncq", search_paths=[str(root)], resolve_aliases=True)
    missing: list[str] = []
    modules = [(package, "asyncq")]
    if "testing" in package.members:
        modules.append((package.members["testing"], "asyncq.testing"))
    for module, prefix in modules:
        exported = module.members["__all__"].value
        names = [str(n).strip("'\"") for n in getattr(exported, "elements", [])]
        for name in names:
            if name.startswith("__"):
                continue
            missing += _missing(module.members[name], f"{prefix}.{name}")
    for path in EXTRA:
        missing += _missing(package[path.removeprefix("asyncq.")], path)
    for path in missing:
        log.warning("public object without a docstring: %s", path)
    return config
