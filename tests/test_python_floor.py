"""What pyproject.toml claims holds (issue 25, defect 2): the checks look at the lowest Python requires-python names
(mypy and ruff target it; `make test-py310` runs the unit tests there), and every library the package imports is
declared as a dependency, so a fresh install runs every command."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _setting(name: str) -> str:
    match = re.search(rf'^{name}\s*=\s*"([^"]*)"', PYPROJECT, re.MULTILINE)
    assert match, name
    return match.group(1)


def _dependencies() -> set[str]:
    """The dependencies and the ansible extra's (provider: ansible imports those only: tests/test_ansible_extra.py),
    and the s3 extra's (s3:// backup locations import boto3 only: tests/test_backup_store.py)."""
    names: list[str] = []
    for key in ("dependencies", "ansible", "s3"):
        block = re.search(rf"^{key} = \[(.*?)^\]", PYPROJECT, re.MULTILINE | re.DOTALL)
        assert block, key
        names += re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block.group(1), re.MULTILINE)
    return {_normal(name) for name in names}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_libraries() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "opsctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name != "opsctl"}


def test_the_checks_target_the_lowest_python_claimed() -> None:
    floor = re.fullmatch(r">=3\.(\d+)", _setting("requires-python"))
    assert floor, "requires-python is a floor such as >=3.10"
    minor = floor.group(1)
    assert _setting("python_version") == f"3.{minor}", "mypy checks against the lowest claimed Python"
    assert _setting("target-version") == f"py3{minor}", "ruff lints for the lowest claimed Python"
    assert re.search(rf"^test-py3{minor}:", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert f"make test-py3{minor}" in (ROOT / ".ci" / "run").read_text()


def test_every_imported_library_is_declared() -> None:
    distributions = packages_distributions()
    declared = _dependencies()
    undeclared = sorted(name for name in _imported_libraries()
                        if not {_normal(d) for d in distributions.get(name, [name])} & declared)
    assert not undeclared, f"imported by opsctl but not in pyproject's dependencies: {undeclared}"
