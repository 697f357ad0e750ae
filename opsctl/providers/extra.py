"""provider: ansible's libraries come with the package's `ansible` extra; without them, one clear error says so.

Invariant: nothing outside provider: ansible (the local provider, validate, render, plan, status, ...) imports
paramiko, ansible_runner or ansible, so a plain `pip install opsctl-redis` runs every local command."""

from __future__ import annotations

import sys
from importlib.util import find_spec

from opsctl.base.errors import OpsctlError

DISTRIBUTION = "opsctl-redis"
ANSIBLE_EXTRA = f"{DISTRIBUTION}[ansible]"
# import name -> the distribution that provides it (all three are the extra's)
ANSIBLE_MODULES = {"ansible_runner": "ansible-runner", "ansible": "ansible-core", "paramiko": "paramiko"}


def missing_ansible_libraries() -> list[str]:
    """The extra's distributions this interpreter cannot import (a module blocked in sys.modules counts)."""
    return [dist for module, dist in ANSIBLE_MODULES.items() if not _importable(module)]


def require_ansible() -> None:
    """Raise the error naming the extra when any of its libraries is missing."""
    missing = missing_ansible_libraries()
    if missing:
        raise ansible_extra_error(missing)


def ansible_extra_error(missing: list[str]) -> OpsctlError:
    names = ", ".join(missing) or ", ".join(ANSIBLE_MODULES.values())
    return OpsctlError(
        f"provider: ansible needs {names}, not installed here",
        f"they come with the ansible extra: {ANSIBLE_EXTRA} (the local provider needs none of them)",
        f"pip install '{ANSIBLE_EXTRA}', or with pipx: pipx install --force '{ANSIBLE_EXTRA}'")


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec (loaded oddly): importable
        return sys.modules.get(module) is not None
