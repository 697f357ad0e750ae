"""What changes by server flavor and version, in one place: supported versions, directives, capabilities.

A directive or capability maps each flavor to the first version that has it (None: never).

Which command names and ACL categories a server flavor and version knows (beside opsctl/server/versions.py).

The table (command_names.py) is generated from COMMAND LIST and ACL CAT of the servers opsctl is tested with, and a
test keeps it equal to them. A supported version without its own table knows a name any table has: validate still
catches typos, never refuses a real command."""

from __future__ import annotations

from opsctl.server.command_names import CATEGORIES, COMMANDS

Version = tuple[int, int]

SUPPORTED: dict[str, tuple[Version, ...]] = {
    "redis": ((6, 2), (7, 0), (7, 2), (7, 4), (8, 0), (8, 2), (8, 4)),
    "valkey": ((7, 2), (8, 0), (8, 1), (9, 0), (9, 1)),
}

TESTED: dict[str, Version] = {"redis": (7, 0), "valkey": (9, 1)}

# Directives absent from some supported versions. Anything not listed exists in every supported version.
DIRECTIVE_SINCE: dict[str, dict[str, Version | None]] = {
    "enable-protected-configs": {"redis": (7, 0), "valkey": (7, 2)},
    "bind-source-addr": {"redis": (7, 0), "valkey": (7, 2)},
    "enable-debug-command": {"redis": (7, 0), "valkey": (7, 2)},
    "enable-module-command": {"redis": (7, 0), "valkey": (7, 2)},
    "latency-tracking": {"redis": (7, 0), "valkey": (7, 2)},
    "hide-user-data-from-log": {"redis": (7, 4), "valkey": (8, 0)},
    "repl-diskless-sync-max-replicas": {"redis": (7, 0), "valkey": (7, 2)},
    "cluster-announce-human-nodename": {"redis": (7, 2), "valkey": (7, 2)},
    "cluster-port": {"redis": (7, 0), "valkey": (7, 2)},
    "locale-collate": {"redis": (7, 2), "valkey": (7, 2)},
    "cluster-slot-stats-enabled": {"redis": None, "valkey": (8, 0)},
    "availability-zone": {"redis": None, "valkey": (8, 0)},
    "extended-redis-compatibility": {"redis": None, "valkey": (8, 0)},
}

CAPABILITY_SINCE: dict[str, dict[str, Version | None]] = {
    # FAILOVER command on a master (coordinated replication failover)
    "failover_command": {"redis": (6, 2), "valkey": (7, 2)},
    # CLUSTER MIGRATESLOTS (Valkey) / CLUSTER MIGRATION IMPORT (Redis): server-side slot moves
    "atomic_slot_migration": {"redis": (8, 4), "valkey": (9, 0)},
    "cluster_shards": {"redis": (7, 0), "valkey": (7, 2)},
    # `save 900 1 300 10` on one line (before Redis 7.0 only `save <seconds> <changes>` lines count)
    "multi_arg_save": {"redis": (7, 0), "valkey": (7, 2)},
    # CLUSTER ADDSLOTSRANGE / DELSLOTSRANGE (before: ADDSLOTS / DELSLOTS with every slot listed)
    "slot_range_commands": {"redis": (7, 0), "valkey": (7, 2)},
    # CLUSTER SLOT-STATS: key-count per slot; cpu-usec, network-bytes-in/out with cluster-slot-stats-enabled
    "slot_stats": {"redis": None, "valkey": (8, 0)},
}


def parse_version(text: str) -> Version:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def version_text(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def is_supported(flavor: str, version: Version) -> bool:
    return version in SUPPORTED.get(flavor, ())


def _since(table: dict[str, dict[str, Version | None]], key: str, flavor: str, version: Version) -> bool:
    if key not in table:
        return True
    first = table[key].get(flavor)
    return first is not None and version >= first


def has_directive(flavor: str, version: Version, directive: str) -> bool:
    return _since(DIRECTIVE_SINCE, directive, flavor, version)


def has_capability(flavor: str, version: Version, capability: str) -> bool:
    if capability not in CAPABILITY_SINCE:
        raise KeyError(f"unknown capability {capability}")
    return _since(CAPABILITY_SINCE, capability, flavor, version)


# RDB format each server version writes. A replica loads its master's RDB during a full sync, so a rolling
# change (replicas first, then a failover onto them) needs every new version to read the old one's RDB.
RDB_VERSION: dict[str, dict[Version, int]] = {
    "redis": {(6, 2): 9, (7, 0): 10, (7, 2): 11, (7, 4): 12, (8, 0): 12, (8, 2): 12, (8, 4): 12},
    "valkey": {(7, 2): 11, (8, 0): 11, (8, 1): 11, (9, 0): 80, (9, 1): 80},
}
# Which RDB versions each server version can load: its own and older, except that Valkey's numbers jump
# to 80 (9.0) and Valkey never reads Redis 7.4+'s 12, while Redis never reads Valkey's 80.
def reads_rdb(flavor: str, version: Version, rdb: int) -> bool:
    own = RDB_VERSION.get(flavor, {}).get(version)
    if own is None:
        return False
    if flavor == "valkey":
        return rdb <= 11 or rdb == own
    return rdb <= own


def server_text(flavor: str, version: Version) -> str:
    return f"{flavor} {version_text(version)}"


def rolling_change_problem(old: tuple[str, Version], new: tuple[str, Version]) -> str | None:
    """Why a rolling change from old to new cannot keep replication going, or None when it can."""
    if old == new:
        return None
    written = RDB_VERSION.get(old[0], {}).get(old[1])
    if written is None or new[1] not in RDB_VERSION.get(new[0], {}):
        return f"no known replication path from {server_text(*old)} to {server_text(*new)}"
    if not reads_rdb(new[0], new[1], written):
        return (f"{server_text(*new)} cannot load the RDB format {written} that {server_text(*old)} writes, "
                "so its replicas could not sync from the old masters during the rollout")
    return None


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
