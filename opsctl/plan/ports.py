"""Node ports inside the machine's ephemeral port range. Pure."""

from __future__ import annotations

from opsctl.render.directives import listen_ports
from opsctl.spec.load import LoadedSpec


def ephemeral_port_warning(loaded: LoadedSpec, first: int, last: int) -> str | None:
    """A warning naming the nodes that listen inside [first, last], the range outgoing connections take their
    source port from: such a connection (a client, another node's cluster bus) can hold the port when the node
    restarts and binds it, and the node then fails to start with "Address already in use"."""
    clashing = [f"{node.name} ({', '.join(str(p) for p in inside)})" for node in loaded.layout.nodes
                if (inside := [p for p in listen_ports(loaded.spec, node) if first <= p <= last])]
    if not clashing:
        return None
    more = f" and {len(clashing) - 3} more" if len(clashing) > 3 else ""
    verb = "listens" if len(clashing) == 1 else "listen"
    return (f"{', '.join(clashing[:3])}{more} {verb} inside this machine's ephemeral port range {first}-{last} "
            "(net.ipv4.ip_local_port_range): an outgoing connection can hold such a port when the node restarts "
            f"and binds it; pick ports below the range{_bus_note(loaded)}")


def _bus_note(loaded: LoadedSpec) -> str:
    if loaded.spec.topology != "cluster":
        return ""
    offset = loaded.spec.cluster_or_default().bus_port_offset
    return f" (cluster bus ports are port + {offset}: cluster.bus_port_offset)"
