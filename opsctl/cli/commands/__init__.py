"""CLI commands beyond validate/render/schema: each module has a register(subparsers) listed here.

COMMANDS names the module and function that register each command, so a run builds the parser of its own
command only, without importing the other command modules (tests/test_cli_start.py checks the table against
what the modules register).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

# command -> (module in opsctl.cli.commands, its register function), in the order `opsctl --help` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("scaffold", "register"),
    "plan": ("lifecycle", "register"),
    "apply": ("lifecycle", "register"),
    "status": ("lifecycle", "register"),
    "destroy": ("lifecycle", "register"),
    "restart": ("restart", "register"),
    "failover": ("failover", "register"),
    "cluster": ("cluster", "register"),
    "audit": ("audit", "register_audit"),
    "bigkey": ("audit", "register_bigkey"),
    "inventory": ("inventory", "register"),
    "backup": ("backup", "register"),
    "restore": ("restore", "register"),
    "migrate": ("migrate", "register"),
    "follow": ("standby", "register_follow"),
    "switchover": ("standby", "register_switchover"),
    "tls": ("tls", "register"),
    "metrics": ("metrics", "register"),
    "help": ("help", "register_help"),
    "completion": ("help", "register_completion"),
}


def registrars(command: str | None = None) -> list[Registrar]:
    """The functions that register every command (None), or the one that registers command."""
    wanted = [COMMANDS[command]] if command in COMMANDS else list(COMMANDS.values())
    unique = list(dict.fromkeys(wanted))
    return [getattr(importlib.import_module(f"opsctl.cli.commands.{module}"), name) for module, name in unique]
