"""Node ports inside the machine's ephemeral port range. Pure."""

from __future__ import annotations

from opsctl.render.directives import listen_ports
from opsctl.spec.layout import Node, exporter_port
from opsctl.spec.load import LoadedSpec


def ephemeral_port_warning(loaded: LoadedSpec, first: int, last: int) -> str | None:
    """A warning naming the nodes that listen inside [first, last], the range outgoing connections take their
    source port from: such a connection (a client, another node's cluster bus) can hold the port when the node
    restarts and binds it, and the node then fails to start with "Address already in use"."""
    clashing = [f"{node.name} ({', '.join(str(p) for p in inside)})" for node in loaded.layout.nodes
                if (inside := [p for p in _bound(loaded, node) if first <= p <= last])]
    if not clashing:
        return None
    more = f" and {len(clashing) - 3} more" if len(clashing) > 3 else ""
    verb = "listens" if len(clashing) == 1 else "listen"
    return (f"{', '.join(clashing[:3])}{more} {verb} inside this machine's ephemeral port range {first}-{last} "
            "(net.ipv4.ip_local_port_range): an outgoing connection can hold such a port when the node restarts "
            f"and binds it; pick ports below the range{_offsets_note(loaded)}")


def _bound(loaded: LoadedSpec, node: Node) -> list[int]:
    """The ports bound for node: its own (listen_ports) and, with metrics.exporter, its exporter's."""
    spec = loaded.spec
    return listen_ports(spec, node) + ([exporter_port(node, spec.metrics.port_offset)] if spec.metrics.exporter else [])


def _offsets_note(loaded: LoadedSpec) -> str:
    spec = loaded.spec
    notes = [f"cluster bus ports are port + {spec.cluster_or_default().bus_port_offset} (cluster.bus_port_offset)"
             ] if spec.topology == "cluster" else []
    if spec.metrics.exporter:
        notes.append(f"exporter ports port + {spec.metrics.port_offset} (metrics.port_offset)")
    return f" ({', '.join(notes)})" if notes else ""
