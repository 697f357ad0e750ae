"""The docs name only what exists (issue 25, defect 7: docs cited opsctl.admin.route_admin,
opsctl.runtime.admin_routes and slots.planning.cover_owners long after they moved). Every dotted `opsctl.x.y` name
in README.md and docs/ is a module of the package, or a module and attributes reachable from it; every
`opsctl/....py` path is a file of the checkout."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOTTED = re.compile(r"\bopsctl(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATHS = re.compile(r"\bopsctl/[A-Za-z0-9_/]+\.py\b")
# opsctl.crt and opsctl.key are the files of opsctl's TLS client certificate (docs/tls.md), not names in the code.
FILES = {"crt", "key", "pem", "yaml", "json"}


def names() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        found += [(doc.relative_to(ROOT).as_posix(), m) for m in sorted(set(DOTTED.findall(text)))]
        found += [(doc.relative_to(ROOT).as_posix(), m) for m in sorted(set(PATHS.findall(text)))]
    return found


def resolves(name: str) -> bool:
    """Whether the longest importable module prefix of name has the rest as attributes, one after the other."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_the_docs_name_something() -> None:
    assert len(names()) > 20  # the pattern still finds the names the docs use


@pytest.mark.parametrize(("doc", "name"), names())
def test_each_name_exists(doc: str, name: str) -> None:
    if "/" in name:
        assert (ROOT / name).is_file(), f"{doc} names {name}, which is not a file"
    elif name.split(".")[1] not in FILES:
        assert resolves(name), f"{doc} names {name}, which opsctl does not have"


def test_the_spec_page_is_help_spec() -> None:
    """docs/spec.md holds `opsctl help spec`'s text: a field added to opsctl.spec.model shows up in both or the page
    is regenerated (its header says how)."""
    from opsctl.cli.commands.help import TOPICS

    page = (ROOT / "docs" / "spec.md").read_text()
    block = page.split("```text\n", 1)[1].rsplit("```", 1)[0]
    assert block == TOPICS["spec"][1]() + "\n", "docs/spec.md is stale: regenerate it (its header says how)"
