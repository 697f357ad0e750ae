"""The functional core imports no I/O, not even through another opsctl module or inside a function: parsing a
spec, rendering files, planning steps and judging what nodes said are pure and tested on data alone
(../shared/design.md, "functional core, thin shell"). The shell (connector, admin, providers, executor, ...) is
the only place that talks to nodes, hosts, processes or files."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opsctl"

# Modules that do I/O: sockets, processes, SSH, Ansible, threads, files (safefs is the only file writer/reader).
IO_LIBRARIES = {"redis", "socket", "select", "ssl", "subprocess", "paramiko", "ansible_runner", "threading"}
IO_MODULES = ("opsctl.connector", "opsctl.admin", "opsctl.rawpipe", "opsctl.providers", "opsctl.remote.runner",
              "opsctl.remote.ssh", "opsctl.executor", "opsctl.runtime", "opsctl.safefs", "opsctl.readback",
              "opsctl.statelock", "opsctl.topolock", "opsctl.waits", "opsctl.observe.collect")

CORE_PACKAGES = ("opsctl.spec", "opsctl.render", "opsctl.plan")
CORE_MODULES = ("opsctl.resp", "opsctl.observe.parse", "opsctl.observe.cluster_state", "opsctl.failover.checks",
                "opsctl.failover.fencing", "opsctl.slots.planning", "opsctl.slots.ranges", "opsctl.slots.balance",
                "opsctl.slots.batching", "opsctl.slots.scale", "opsctl.audit.findings", "opsctl.audit.keynames",
                "opsctl.audit.keyspace", "opsctl.audit.nodechecks", "opsctl.backup.manifest", "opsctl.backup.plan",
                "opsctl.health", "opsctl.status", "opsctl.report", "opsctl.tls.judge", "opsctl.remote.inventory",
                "opsctl.slots.coverage")
# plan.saved reads the file `opsctl plan --out` wrote (through readback, which validates every field).
SHELL_IN_CORE = {"opsctl.plan.saved"}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


@cache
def _imports(module: str) -> frozenset[str]:
    tree = ast.parse(MODULES[module].read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return frozenset(names)


def io_reached(module: str) -> dict[str, str]:
    """Each I/O module the module reaches, directly or through opsctl modules, with the opsctl module that
    imports it."""
    found: dict[str, str] = {}
    seen, todo = {module}, [module]
    while todo:
        current = todo.pop()
        for name in _imports(current):
            if name.split(".")[0] in IO_LIBRARIES or any(name == io or name.startswith(f"{io}.") for io in IO_MODULES):
                found.setdefault(name, current)
            elif name in MODULES and name not in seen:
                seen.add(name)
                todo.append(name)
    return found


CORE = sorted({m for m in MODULES if m in CORE_PACKAGES or m.startswith(tuple(f"{p}." for p in CORE_PACKAGES))}
              - SHELL_IN_CORE | set(CORE_MODULES))


@pytest.mark.parametrize("module", CORE)
def test_the_core_reaches_no_io(module: str) -> None:
    reached = io_reached(module)
    assert not reached, f"{module} reaches I/O: " + ", ".join(f"{io} (imported by {by})" for io, by in reached.items())


def test_the_check_sees_io_where_it_is() -> None:
    assert "opsctl.connector" in io_reached("opsctl.observe.collect") or "socket" in io_reached("opsctl.connector")
    assert all(m in MODULES for m in [*CORE_MODULES, *SHELL_IN_CORE])
