"""Read one node for the non-scan checks: CONFIG GET, harmless probes of dangerous commands, an anonymous
PING, ACL GETUSER default, INFO, SLOWLOG. Thin I/O over a raw pipe (opsctl.net.rawpipe); the judging is in
opsctl.audit.nodechecks.
"""

from __future__ import annotations

from typing import Any

from opsctl.audit import nodechecks as nc
from opsctl.net.connector import Connector
from opsctl.net.rawpipe import PIPE_ERRORS, RawPipe, link_error
from opsctl.net.resp import encode, text
from opsctl.observe.findings import Finding
from opsctl.observe.replies import RespError, parse_info, parse_pairs
from opsctl.render.directives import Directive, NodePaths, server_sections
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec

NO_PATHS = NodePaths("", "", "", "", "")


def expected_directives(loaded: LoadedSpec, node: Node) -> list[Directive]:
    sections = server_sections(loaded, node, NO_PATHS, "***", daemonize=True)
    return [d for section in sections for d in section.directives]


def config_get(pipe: RawPipe, pattern: str) -> dict[str, str]:
    reply = text(pipe.ask("CONFIG", "GET", pattern))
    return parse_pairs(reply) if isinstance(reply, list) else {}


def _error_of(pipe: RawPipe, command: str, *args: str) -> str | None:
    """Run a command under exactly this name (no rename); the error text, or None when it ran."""
    pipe.send(encode([command, *args]))
    reply = pipe.read(1)[0]
    return reply.message if isinstance(reply, RespError) else None


def anonymous_error(connector: Connector, node: Node) -> str | None:
    """What an unauthenticated PING gets (through the connector's route and TLS), or None when it works.
    Asked once: a node that refuses an anonymous client may close the connection on purpose."""
    try:
        with RawPipe.on_socket(connector.socket(node, timeout=3.0, auth=False), node.name) as pipe:
            reply = pipe.call("PING")
    except PIPE_ERRORS as exc:  # protected mode or AUTH-required handshakes close the connection
        return link_error(exc)
    return reply.message if isinstance(reply, RespError) else None


def default_flags(pipe: RawPipe) -> list[str] | None:
    reply = text(pipe.call("ACL", "GETUSER", "default"))
    if isinstance(reply, list) and "flags" in reply:
        flags = reply[reply.index("flags") + 1]
        return [str(f) for f in flags] if isinstance(flags, list) else None
    return None


def config_findings(connector: Connector, node: Node, pipe: RawPipe) -> list[Finding]:
    loaded = connector.loaded
    spec = loaded.spec
    live = config_get(pipe, "*")
    out = nc.config_drift(node.name, expected_directives(loaded, node), live)
    checked = nc.probes(spec.hardening.disabled_commands, loaded.renames)
    results = {p.command: _error_of(pipe, p.command, *p.args) for p in checked}
    out += nc.probe_findings(node.name, results, checked)
    out += nc.auth_findings(node.name, anonymous_error(connector, node), default_flags(pipe),
                            spec.auth.mode == "acl")
    return out


def memory_facts(node: Node, pipe: RawPipe) -> dict[str, Any]:
    info = parse_info(str(text(pipe.ask("INFO", "all"))))
    maxclients = int(config_get(pipe, "maxclients").get("maxclients", "0"))
    return nc.memory_row(node.name, info, maxclients)


def slowlog(node: Node, pipe: RawPipe, count: int = 128) -> list[dict[str, Any]]:
    entries = text(pipe.ask("SLOWLOG", "GET", str(count)))
    listed = [e for e in entries if isinstance(e, list)] if isinstance(entries, list) else []
    return nc.slowlog_rows(node.name, listed)


def policy(pipe: RawPipe) -> str:
    return config_get(pipe, "maxmemory-policy").get("maxmemory-policy", "")
