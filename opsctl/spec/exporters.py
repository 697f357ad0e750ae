"""Where each node's redis_exporter listens (the node's address at its port + metrics.port_offset) and the spec
rule that it can be bound: one place for the port, read by validation, the targets and the provider."""

from __future__ import annotations

from opsctl.base.endpoints import MAX_PORT
from opsctl.spec.layout import Layout, Node
from opsctl.spec.model import PLAINTEXT_PORT_OFFSET

EXPORTER_PORT_OFFSET = 1000  # metrics.port_offset's default


def exporter_port(node: Node, offset: int = EXPORTER_PORT_OFFSET) -> int:
    """The port of the node's exporter: beside the node, so each node on a host gets its own."""
    return node.port + offset


def exporter_port_problems(layout: Layout, offset: int = EXPORTER_PORT_OFFSET, plaintext: bool = False) -> list[str]:
    """Exporter ports that cannot be bound: past 65535, or on an address where a node, a cluster bus or (plaintext:
    tls.plaintext_port) a node's plaintext port listens."""
    taken: dict[tuple[str, int], str] = {}
    for node in layout.nodes:
        for address in node.listens_on:  # a node binds every port on each of its addresses
            taken[(address, node.port)] = f"{node.name}'s port"
            if node.bus_port is not None:  # a cluster server's only: replication nodes and Sentinels have no bus
                taken[(address, node.bus_port)] = f"{node.name}'s cluster bus port"
            if plaintext:
                taken[(address, node.port + PLAINTEXT_PORT_OFFSET)] = f"{node.name}'s plaintext port"
    problems = []
    for node in layout.nodes:
        port = exporter_port(node, offset)
        if (too_high := _above_range(node, offset)) is not None:
            problems.append(too_high)
        elif (clash := taken.get((node.address, port))) is not None:
            problems.append(f"{node.name}: exporter port {port} on {node.address} is {clash}")
    return problems


def exporter_ports_above_range(layout: Layout, offset: int = EXPORTER_PORT_OFFSET) -> list[str]:
    """The exporter ports past 65535: no target can name one, whoever runs the exporters."""
    return [problem for node in layout.nodes if (problem := _above_range(node, offset)) is not None]


def _above_range(node: Node, offset: int) -> str | None:
    port = exporter_port(node, offset)
    return f"{node.name}: exporter port {port} (port {node.port} + {offset}) is above {MAX_PORT}" \
        if port > MAX_PORT else None
