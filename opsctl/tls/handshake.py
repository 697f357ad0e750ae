"""What a node presents over TLS: one handshake for its certificate's facts, what the TLS audit sees on each
node (seen), and whether its plaintext port still answers. I/O: a socket per question."""

from __future__ import annotations

import dataclasses
import ssl

from opsctl.base.errors import AuthRefused, NodeError, OpsctlError
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.render.directives import plaintext_port
from opsctl.spec.layout import Node
from opsctl.tls.certs import CertFacts, der_facts
from opsctl.tls.judge import TlsSeen


def handshake(connector: Connector, node: Node, timeout: float = 5.0) -> tuple[CertFacts, str]:
    """The certificate node presents and the protocol version negotiated, through the connector."""
    sock = connector.socket(node, timeout)
    try:
        if not isinstance(sock, ssl.SSLSocket):
            raise OpsctlError(f"{node.name}: the connector does not speak TLS", hint="set tls.enabled in the spec")
        der = sock.getpeercert(binary_form=True)
        if der is None:
            raise OpsctlError(f"{node.name} presented no certificate")
        return der_facts(der), sock.version() or ""
    finally:
        sock.close()

def seen(connector: Connector, node: Node) -> TlsSeen:
    """What the TLS audit asks a node: its certificate and protocol, its tls-protocols, a plaintext PING."""
    try:
        cert, protocol = handshake(connector, node)
    except (OSError, OpsctlError, ValueError) as exc:
        return TlsSeen(node.name, None, "", "", None, str(exc))
    configured, plain = "", plaintext_port(connector.loaded.spec, node)
    if not node.is_sentinel:
        with connection_to(connector, node) as handle:
            live = handle.config_get("*port*") | handle.config_get("tls-protocols")
        configured = live.get("tls-protocols", "")
        plain = int(live.get("port", "0")) or None
    return TlsSeen(node.name, cert, protocol, configured, _plaintext(connector, node, plain))

def _plaintext(connector: Connector, node: Node, port: int | None) -> str | None:
    if port is None or connector.route is not None:  # an SSH route reaches the node's TLS port only
        return None
    plain = Connector(connector.loaded)  # the same spec and AUTH, no TLS
    with connection_to(plain, dataclasses.replace(node, port=port), timeout=2.0) as handle:
        try:
            handle.call("PING")
        except AuthRefused:
            return f"port {port} answers without TLS (it asks for a password)"
        except NodeError:
            return None
    return f"port {port} answers without TLS"
