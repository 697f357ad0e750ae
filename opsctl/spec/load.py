"""A validated spec with what a run derives from it (layout, resolved secrets): LoadedSpec. The validation itself
(pydantic, file:line for every problem) is opsctl.spec.validate's, imported only when a spec is validated.

The commands each node runs under another name: hardening.renamed_commands, plus in password mode the commands
that let a password holder take a node over. The node handle (opsctl.net.connection) and the rename-command lines
(servers' and Sentinel's) take the names from here, so opsctl keeps using what it renamed. Names are an HMAC keyed
by rename_key, else the spec's name: every run derives the same. See docs/internals.md."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import typing
from collections.abc import Callable

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.secrets import Secret
from opsctl.spec.layout import Layout, Node, layout
from opsctl.spec.model import SecretRef, Spec
from opsctl.spec.secretrefs import SecretResolver, SecretUnusable


@frozen
class Credentials(Frozen):
    """The resolved secrets of a spec: the admin password and each ACL user's."""

    password: Secret
    users: tuple[tuple[str, Secret], ...] = ()
    previous: Secret | None = None  # auth.previous_password: still accepted while a rotation overlaps
    users_previous: tuple[tuple[str, Secret], ...] = ()  # users[].previous_password, where given
    rename_key: Secret | None = None  # hardening.rename_key: what derived command names are keyed by

    def all(self) -> list[Secret]:
        return [self.password, *(s for _, s in self.users), *([self.previous] if self.previous else []),
                *(s for _, s in self.users_previous), *([self.rename_key] if self.rename_key else [])]


@frozen
class LoadedSpec(Frozen):
    file: str
    spec: Spec
    layout: Layout
    credentials: Credentials

    @functools.cached_property
    def renames(self) -> dict[str, str]:
        """Original command -> the name the nodes run it under (explicit and derived renames); computed once
        (an HMAC per command), every admin connection and every rendering asks."""
        return command_renames(self.spec, self.credentials.rename_key)

    def renames_for(self, node: Node) -> dict[str, str]:
        """The renames node runs with: none on a sentinel (rename-command is for servers)."""
        return {} if node.is_sentinel else self.renames

    @property
    def server_binary(self) -> str | None:
        """server.binary with a relative path taken from the spec's folder, as every file the spec names."""
        binary = self.spec.server.binary
        return None if binary is None else os.path.join(os.path.dirname(os.path.abspath(self.file)), binary)

    def command_name(self, node: Node, command: str) -> str:
        """The name node runs command under (upper case)."""
        return self.renames_for(node).get(command.upper(), command.upper())


def load_spec(text: str, file: str, resolve: SecretResolver | None) -> LoadedSpec:
    """resolve None: secrets are not resolved nor checked, and the credentials are empty (validate --no-secrets)."""
    from opsctl.spec.validate import validated_spec

    return loaded_spec(file, validated_spec(text, file, resolve), resolve)


def loaded_spec(file: str, spec: Spec, resolve: SecretResolver | None) -> LoadedSpec:
    """A spec already validated, with its layout and its secrets resolved."""
    return LoadedSpec(file, spec, layout(spec), _credentials(spec, resolve))


def _credentials(spec: Spec, resolve: SecretResolver | None) -> Credentials:
    def secret(ref: SecretRef) -> Secret:
        try:
            return Secret((resolve(ref) if resolve else None) or "")
        except SecretUnusable:
            return Secret("")

    users = tuple((u.name, secret(u.password)) for u in spec.auth.users)
    previous = secret(spec.auth.previous_password) if spec.auth.previous_password else None
    users_previous = tuple((u.name, secret(u.previous_password)) for u in spec.auth.users if u.previous_password)
    rename_key = secret(spec.hardening.rename_key) if spec.hardening.rename_key else None
    return Credentials(secret(spec.auth.password), users, previous, users_previous, rename_key)


def make_resolver(env: typing.Mapping[str, str], read_file: Callable[[str], str | None]) -> SecretResolver:
    def resolve(ref: SecretRef) -> str | None:
        if ref.env is not None:
            return env.get(ref.env) or None
        return read_file(ref.file) if ref.file else None

    return resolve


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
