"""CLI commands beyond validate/render/schema. Each module adds a `register(subparsers)` to REGISTRARS."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from opsctl.commands import inventory, lifecycle

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = [lifecycle.register, inventory.register]

from opsctl.commands import audit as _audit  # noqa: E402,F401  (registers `audit` and `bigkey`)
from opsctl.commands import cluster as _cluster  # noqa: E402,F401  (registers `cluster check`)
from opsctl.commands import failover as _failover  # noqa: E402,F401  (registers `failover`)
from opsctl.commands import restart as _restart  # noqa: E402

REGISTRARS.append(_restart.register)
