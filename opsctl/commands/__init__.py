"""CLI commands beyond validate/render/schema: each module has a register(subparsers) listed here."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from opsctl.commands import audit, backup, cluster, failover, inventory, lifecycle, restart, restore, tls

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = [
    lifecycle.register,
    restart.register,
    failover.register,
    cluster.register,
    audit.register_audit,
    audit.register_bigkey,
    inventory.register,
    backup.register,
    restore.register,
    tls.register,
]
