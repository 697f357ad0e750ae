"""The commands each node runs under another name: hardening.renamed_commands, plus in password mode the commands
that let a password holder take a node over. Admin and the rename-command lines (servers' and Sentinel's) take the
names from here, so opsctl keeps using what it renamed. Names are an HMAC keyed by rename_key, else the spec's
name: every run derives the same. See docs/internals.md.
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
