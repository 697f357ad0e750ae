"""Which command names and ACL categories a server flavor and version knows (beside opsctl/server/versions.py).

The table (command_names.py) is generated from COMMAND LIST and ACL CAT of the servers opsctl is tested with, and a
test keeps it equal to them. A supported version without its own table knows a name any table has: validate still
catches typos, never refuses a real command."""

from __future__ import annotations

from opsctl.server.command_names import CATEGORIES, COMMANDS
from opsctl.server.versions import Version

TableKey = tuple[str, Version]


def table_version(flavor: str, version: Version) -> TableKey | None:
    """The table that describes exactly this server, or None when the union of all tables stands in."""
    key = (flavor, version)
    return key if key in COMMANDS else None


def _names(table: dict[TableKey, frozenset[str]], flavor: str, version: Version) -> frozenset[str]:
    key = table_version(flavor, version)
    if key is not None:
        return table[key]
    return frozenset().union(*table.values())


def command_names(flavor: str, version: Version) -> frozenset[str]:
    """Lowercase names, subcommands as 'config|set'."""
    return _names(COMMANDS, flavor, version)


def is_command(flavor: str, version: Version, name: str) -> bool:
    return name.lower() in command_names(flavor, version)


def is_category(flavor: str, version: Version, name: str) -> bool:
    """ACL CAT leaves out 'all', which every server takes (+@all)."""
    return name.lower() == "all" or name.lower() in _names(CATEGORIES, flavor, version)
