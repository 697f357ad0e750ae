"""Which node is a replica of which, from ROLE; which node to scan per shard. Parsers and choice are pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.base.errors import AUTH_HINT, NodeRefused, NodeUnreachable, is_auth_failure, not_answering
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.rawpipe import link_error
from opsctl.observe.findings import Finding, finding
from opsctl.observe.replies import ROLE, parse_role
from opsctl.spec.layout import Node, endpoint


@dataclass(frozen=True)
class LiveNode:
    node: Node
    role: str  # master | replica | down
    master: str | None = None  # the master's endpoint, for a replica
    linked: bool = False
    error: str = ""

    @property
    def shard_key(self) -> str:
        return self.node.endpoint if self.role == "master" else (self.master or self.node.endpoint)


def role_summary(reply: Sequence[Any]) -> tuple[str, str | None, bool]:
    """ROLE -> (master|replica|sentinel, master endpoint, link up)."""
    role = parse_role(reply)
    master = endpoint(*role.master) if role.master else None
    return role.kind, master, role.kind == "master" or role.link == "connected"


def live_node(connector: Connector, node: Node) -> LiveNode:
    try:
        with connection_to(connector, node, timeout=3.0) as handle:
            role = handle.read(ROLE)
    except NodeUnreachable as exc:
        return LiveNode(node, "down", error=link_error(exc).splitlines()[0])
    except NodeRefused as exc:
        return LiveNode(node, "down", error=exc.detail)
    except (ValueError, IndexError, TypeError) as exc:
        return LiveNode(node, "down", error=f"unexpected ROLE reply: {exc}")
    master = endpoint(*role.master) if role.master else None
    return LiveNode(node, role.kind, master, role.kind == "master" or role.link == "connected")


def discover(connector: Connector, servers: Sequence[Node] | None = None) -> list[LiveNode]:
    """What each server says of itself: servers, by default the spec's as placed (a command that narrows it to the
    nodes that run passes them)."""
    return [live_node(connector, node) for node in (connector.loaded.layout.servers if servers is None else servers)]


def shards(live: Sequence[LiveNode]) -> dict[str, list[LiveNode]]:
    """master endpoint -> [master, its replicas], from what the nodes say (not from the spec)."""
    out: dict[str, list[LiveNode]] = {}
    for ln in sorted(live, key=lambda n: n.role != "master"):
        if ln.role != "down":
            out.setdefault(ln.shard_key, []).append(ln)
    return out


def unreachable(live: Sequence[LiveNode]) -> list[Finding]:
    out = []
    for ln in (ln for ln in live if ln.role == "down"):
        hint = AUTH_HINT if is_auth_failure(ln.error) else "start it (`opsctl apply -f SPEC`) or check the host"
        out.append(finding("reachable", "critical", ln.node.name,
                           f"{ln.node.endpoint}: {not_answering(ln.node.name, ln.error)}", hint))
    return out


def scan_targets(live: Sequence[LiveNode], allow_masters: bool) -> tuple[list[LiveNode], list[Finding]]:
    """A linked replica per shard; the master only with allow_masters."""
    targets, problems = [], []
    for members in shards(live).values():
        replica = next((m for m in members if m.role == "replica" and m.linked), None)
        master = members[0] if members[0].role == "master" else None
        if replica:
            targets.append(replica)
        elif master and allow_masters:
            targets.append(master)
        else:
            who = master or members[0]
            problems.append(finding("scan-target", "medium", who.node.name, "shard has no linked replica to scan; "
                                    "not scanned", "pass --allow-masters to scan the master (throttle it with "
                                    "--max-ops-per-sec), or add a replica"))
    return sorted(targets, key=lambda t: t.node.name), problems
