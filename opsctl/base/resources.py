"""Where the data files shipped with opsctl live: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # opsctl/


def data_dir(name: str) -> Path:
    """templates/ or playbooks/: the installed copy if present, else the checkout's."""
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name
