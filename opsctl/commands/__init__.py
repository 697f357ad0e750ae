"""CLI commands beyond validate/render/schema. Each module adds a `register(subparsers)` to REGISTRARS."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = []
