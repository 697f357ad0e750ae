"""The commands each node runs under another name: the spec's hardening.renamed_commands, plus, in password
mode, the commands that let any client holding the password take a node over (point it at another master, ship
keys to any address, add users, stop it, promote a replica). Admin, the rendered rename-command lines and
Sentinel's rename-command lines all take the names from here, so opsctl keeps using what it renamed.

Names are derived, not stored: OPS_<COMMAND>_<16 hex digits of HMAC-SHA256>, keyed by hardening.rename_key (a
secret) when given, else by the spec's name. Every run and every checkout derives the same names, so plans stay
empty. Without rename_key the names hide the commands from clients and tools that only hold the password, not from
someone who has the spec and reads this file: set rename_key for names nobody can derive, or better, use
auth.mode: acl, where each user gets only the commands it needs.
"""

from __future__ import annotations

import hashlib
import hmac

from opsctl.base.secrets import Secret
from opsctl.spec.model import Spec

# CLUSTER stays: cluster-aware clients need CLUSTER SLOTS/SHARDS, and only ACL rules can take subcommands away.
# PSYNC/REPLCONF stay: replicas send them by name. DEBUG and MODULE are off through enable-*-command already.
TAKEOVER_COMMANDS = ("ACL", "CONFIG", "FAILOVER", "MIGRATE", "REPLICAOF", "SHUTDOWN", "SLAVEOF")


def derived_name(command: str, key: bytes) -> str:
    digest = hmac.new(key, f"opsctl rename-command v1 {command.upper()}".encode(), hashlib.sha256).hexdigest()
    return f"OPS_{command.upper()}_{digest[:16].upper()}"


def command_renames(spec: Spec, rename_key: Secret | None) -> dict[str, str]:
    """Original command (upper case) -> the name the nodes know it by."""
    explicit = {command.upper(): new for command, new in spec.hardening.renamed_commands.items()}
    if spec.auth.mode != "password" or not spec.hardening.rename_takeover_commands:
        return explicit
    key = rename_key.reveal().encode() if rename_key and rename_key.reveal() else f"spec {spec.name}".encode()
    disabled = {command.upper() for command in spec.hardening.disabled_commands}
    derived = {command: derived_name(command, key) for command in TAKEOVER_COMMANDS if command not in disabled}
    return {**derived, **explicit}
