"""Facts about drift the planner needs beyond CONFIG GET: the files on each node's disk, a sentinel's live
settings, and each node's exporter (the provider's exporter runner, opened only where the spec has one). I/O
here, comparison in opsctl.plan (secrets arrive there only as verdicts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from opsctl.base.errors import NodeUnreachable, OpsctlError
from opsctl.base.secrets import MASK
from opsctl.metrics.exporter import ExporterRun
from opsctl.net.connection import connection_to
from opsctl.net.connector import DEFAULT_TIMEOUT
from opsctl.net.fanout import fan_out
from opsctl.observe.replies import Command, RespError, TextReply
from opsctl.plan.desired import DIFFERS, password_verdicts, sentinel_file_values, server_file_values
from opsctl.plan.facts import NodeFacts, SentinelEntry
from opsctl.plan.rotation import managed_users
from opsctl.providers.local import LocalProvider
from opsctl.providers.localexporter import LocalExporters
from opsctl.render import render_acl
from opsctl.render.directives import SECRET_DIRECTIVES
from opsctl.render.exporteruser import EXPORTER_USER, RULE_FIELDS, acl_rule_words
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node, sentinel_master_name

if TYPE_CHECKING:
    from opsctl.runtime.opening import Runtime

SENTINEL_LIVE = ("quorum", "down-after-milliseconds", "failover-timeout", "parallel-syncs")


def with_disk_facts(rt: Runtime, facts: dict[str, NodeFacts]) -> dict[str, NodeFacts]:
    """Each known node's facts plus what its files say (and, for a running sentinel, its live settings); nodes
    side by side."""
    # never applied: there is nothing of ours on disk to compare
    applied = [(n, f) for n in rt.loaded.layout.nodes if (f := facts.get(n.name)) and f.recorded_digest is not None]

    def on_disk(pair: tuple[Node, NodeFacts]) -> NodeFacts:
        node, f = pair
        return sentinel_facts(rt, node, f) if node.is_sentinel else server_facts(rt, node, f)

    return {**facts, **{f.name: f for f in fan_out(on_disk, applied)}}


def server_facts(rt: Runtime, node: Node, f: NodeFacts) -> NodeFacts:
    credentials = rt.loaded.credentials
    text = rt.provider.read_file(node, "redis.conf")
    on_disk = {} if text is None else server_file_values(text, SECRET_DIRECTIVES, credentials.password,
                                                         credentials.previous)
    acl: str | None = None
    if rt.loaded.spec.auth.mode == "acl":
        acl_text = rt.provider.read_file(node, "users.acl")
        acl = MASK if acl_text == render_acl(rt.loaded, reveal=True) else DIFFERS
    return live_users(rt, node, dataclasses.replace(f, on_disk=on_disk, acl_on_disk=acl))


def live_users(rt: Runtime, node: Node, f: NodeFacts) -> NodeFacts:
    """f with which passwords each managed user accepts on the live node, as verdicts, and the exporter user's
    live rules (ACL GETUSER, one round trip); unchanged when the node does not answer."""
    if not f.reachable:
        return f
    users = managed_users(rt.loaded, node)
    replies = _ask(rt, node, [("ACL", "GETUSER", user) for user in users])
    if replies is None:
        return f
    by_user = dict(zip(users, replies, strict=True))
    accepts = {user: password_verdicts(_field(by_user[user], "passwords"), secret, previous)
               for user, (secret, previous) in users.items()}
    exporter = by_user.get(EXPORTER_USER)
    rules = acl_rule_words(*(_words(exporter, name) for name in RULE_FIELDS)) if exporter else None
    return dataclasses.replace(f, accepts=accepts, exporter_rules=rules)


def _ask(rt: Runtime, node: Node, commands: Sequence[Command]) -> list[TextReply] | None:
    """The replies to commands, in one round trip; None when the node does not answer or refuses one."""
    try:
        with connection_to(rt.connector, node, DEFAULT_TIMEOUT) as handle:
            replies = handle.texts(commands)
    except NodeUnreachable:
        return None
    return None if any(isinstance(reply, RespError) for reply in replies) else replies


def _field(reply: TextReply, name: str) -> list[str]:
    """A field of a flat RESP2 field/value reply (ACL GETUSER)."""
    value = dict(zip(reply[::2], reply[1::2], strict=False)).get(name, []) if isinstance(reply, list) else []
    return [str(v) for v in value] if isinstance(value, list) else []


def _words(reply: TextReply, name: str) -> str:
    """A field of ACL GETUSER as one string of words: flags come as a list, commands/keys/channels as a string."""
    value = dict(zip(reply[::2], reply[1::2], strict=False)).get(name, "") if isinstance(reply, list) else ""
    return " ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def sentinel_facts(rt: Runtime, node: Node, f: NodeFacts) -> NodeFacts:
    if not f.reachable:
        return f
    credentials = rt.loaded.credentials
    text = rt.provider.read_file(node, "sentinel.conf") or ""
    settings = sentinel_file_values(text, credentials.password, credentials.previous)
    replies = _ask(rt, node, [("SENTINEL", "MASTER", sentinel_master_name(rt.loaded.spec))])
    if replies is None or not isinstance(replies[0], list):
        return dataclasses.replace(f, sentinel_config=settings)
    pairs = dict(zip(replies[0][::2], replies[0][1::2], strict=False))
    settings |= {key: str(pairs[key]) for key in SENTINEL_LIVE if key in pairs}
    epoch = str(pairs.get("config-epoch", ""))
    entry = SentinelEntry(int(epoch), "failover_in_progress" in str(pairs.get("flags", "")).split(",")) \
        if epoch.isdigit() else None
    return live_users(rt, node, dataclasses.replace(f, sentinel_config=settings, sentinel_entry=entry))


class Exporters(Protocol):
    """What a provider's exporters offer the exporter steps (providers.localexporter, providers.ansibleexporter)."""

    def state(self, node: Node) -> str | None: ...

    def states(self, nodes: Sequence[Node]) -> list[str | None]: ...

    def start(self, node: Node, run: ExporterRun) -> None: ...

    def remove(self, node: Node) -> None: ...

    def renew_tls(self) -> None:
        """After `tls rotate`: the exporters use the nodes' new TLS files (a copy-holding provider redeploys)."""

def exporters_of(rt: Runtime) -> Exporters | None:
    """The provider's exporters; None for a provider that runs none (an error when the spec asks for them)."""
    if isinstance(rt.provider, LocalProvider):
        return LocalExporters(rt.provider)
    if rt.loaded.spec.provider == "ansible":
        from opsctl.providers.ansible import AnsibleProvider
        from opsctl.providers.ansibleexporter import AnsibleExporters  # paramiko: only with provider: ansible

        if isinstance(rt.provider, AnsibleProvider):
            return AnsibleExporters(rt.provider)
    if rt.loaded.spec.metrics.exporter:
        raise OpsctlError(f"metrics.exporter is not deployed by provider {rt.loaded.spec.provider} yet",
                          hint="set metrics.exporter: false and run redis_exporter yourself (docs/monitoring.md, "
                               "\"The exporter's user\"), or use provider: local")
    return None

def with_exporter_facts(rt: Runtime, facts: dict[str, NodeFacts]) -> dict[str, NodeFacts]:
    """Each node's facts with the digest its running exporter was started with (None: none runs)."""
    exporters = exporters_of(rt)
    if exporters is None:
        return facts
    nodes = [n for n in rt.loaded.layout.nodes if n.name in facts]
    states = exporters.states(nodes)
    return {**facts, **{n.name: replace(facts[n.name], exporter=s) for n, s in zip(nodes, states, strict=True)}}
