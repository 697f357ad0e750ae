"""Read one node for the non-scan checks: CONFIG GET, harmless probes of dangerous commands, an anonymous
PING, ACL GETUSER default, INFO, SLOWLOG. Thin I/O; the judging is in opsctl.audit.nodechecks.
"""

from __future__ import annotations

from typing import Any

import redis

from opsctl.admin import Admin
from opsctl.audit import nodechecks as nc
from opsctl.audit.findings import Finding
from opsctl.connector import Connector
from opsctl.observe.parse import parse_info
from opsctl.render.directives import Directive, NodePaths, server_sections
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

NO_PATHS = NodePaths("", "", "", "", "")


def expected_directives(loaded: LoadedSpec, node: Node) -> list[Directive]:
    sections = server_sections(loaded, node, NO_PATHS, "***", daemonize=True)
    return [d for section in sections for d in section.directives]


def _error_of(admin: Admin, *args: str) -> str | None:
    """Run a command under exactly this name (no rename); the error text, or None when it ran."""
    try:
        admin.client.execute_command(*args)
    except redis.ResponseError as exc:
        return str(exc)
    return None


def anonymous_error(connector: Connector, node: Node) -> str | None:
    """What an unauthenticated PING gets (through the connector's route and TLS), or None when it works.
    The connector's clients never retry: a node that refuses an anonymous client closes it on purpose."""
    client = connector.client(node, timeout=3.0, auth=False)
    try:
        client.ping()
    except redis.ResponseError as exc:
        return str(exc)
    except redis.ConnectionError as exc:  # protected mode or AUTH-required handshakes close the connection
        return str(exc) or "connection refused"
    finally:
        client.close()
    return None


def default_flags(admin: Admin) -> list[str] | None:
    try:
        reply: Any = admin.call("ACL", "GETUSER", "default")
    except redis.ResponseError:
        return None
    if isinstance(reply, dict):
        return [str(f) for f in reply.get("flags", [])]
    if isinstance(reply, list) and "flags" in reply:
        return [str(f) for f in reply[reply.index("flags") + 1]]
    return None


def config_findings(connector: Connector, node: Node, admin: Admin) -> list[Finding]:
    loaded = connector.loaded
    spec = loaded.spec
    live = admin.config_get("*")
    out = nc.config_drift(node.name, expected_directives(loaded, node), live)
    checked = nc.probes(spec.hardening.disabled_commands, loaded.renames)
    results = {p.command: _error_of(admin, p.command, *p.args) for p in checked}
    out += nc.probe_findings(node.name, results, checked)
    out += nc.auth_findings(node.name, anonymous_error(connector, node), default_flags(admin),
                            spec.auth.mode == "acl")
    return out


def memory_facts(node: Node, admin: Admin) -> dict[str, Any]:
    info = parse_info(admin.info("all"))
    maxclients = int(admin.config_get("maxclients").get("maxclients", "0"))
    return nc.memory_row(node.name, info, maxclients)


def slowlog(node: Node, admin: Admin, count: int = 128) -> list[dict[str, Any]]:
    entries = admin.raw("SLOWLOG", "GET", str(count))
    return nc.slowlog_rows(node.name, entries if isinstance(entries, list) else [])


def policy(admin: Admin) -> str:
    return admin.config_get("maxmemory-policy").get("maxmemory-policy", "")
