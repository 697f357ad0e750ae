"""CLI commands beyond validate/render/schema. Each module adds a `register(subparsers)` to REGISTRARS."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from opsctl.commands import inventory, lifecycle

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = [lifecycle.register, inventory.register]

from opsctl.commands import audit as _audit  # noqa: E402,F401  (registers `audit` and `bigkey`)
from opsctl.commands import cluster as _cluster  # noqa: E402,F401  (registers `cluster check`)
