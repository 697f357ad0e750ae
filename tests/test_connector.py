"""The connector is the only place that connects to nodes (design: connections in one place)."""

from __future__ import annotations

import ast
from pathlib import Path

OPSCTL = Path(__file__).parents[1] / "opsctl"
# Calls that make a client, a connection or a socket (by the called name's last part).
MAKERS = {"Redis", "StrictRedis", "RedisCluster", "Sentinel", "ConnectionPool", "Connection", "SSLConnection",
          "make_connection", "create_connection", "socket", "create_server", "wrap_socket", "SSLContext",
          "create_default_context", "from_url"}
ALLOWED = {
    "net/connector.py": "the connector",
    "net/connection.py": ("the node handle: its Connection is opsctl's, not redis-py's, and connects through the "
                          "connector"),
    "providers/remote/ssh.py": ("the SSH transport: its local tunnel listener is the connector's route, "
                                "not a node connection"),
    "providers/sockdiag.py": "a netlink socket to the local kernel (which process listens on a port), no node",
}


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):  # connector.socket(...) is the allowed way; socket.socket(...) is not
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        return "" if func.attr == "socket" and owner != "socket" else func.attr
    return func.id if isinstance(func, ast.Name) else ""


def test_only_the_connector_creates_clients_and_sockets() -> None:
    offenders = []
    for path in sorted(OPSCTL.rglob("*.py")):
        module = str(path.relative_to(OPSCTL))
        if module in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _called(node) in MAKERS:
                offenders.append(f"{module}:{node.lineno} {_called(node)}()")
            if isinstance(node, ast.Call) and _called(node) == "for_node":
                offenders.append(f"{module}:{node.lineno} for_node() (use the connector passed down)")
            if isinstance(node, ast.Attribute) and node.attr in ("_sock", "_ROUTES"):
                offenders.append(f"{module}:{node.lineno} .{node.attr}")
    assert not offenders, "connect through opsctl.net.connector.Connector instead:\n" + "\n".join(offenders)
