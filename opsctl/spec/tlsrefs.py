"""Which certificate files a node uses (node override > host > tls section). Pure."""

from __future__ import annotations

from opsctl.spec.layout import Node
from opsctl.spec.model import FileRef, Spec, TlsFiles


def node_refs(spec: Spec, node: Node) -> TlsFiles:
    host = next((h.tls for h in spec.hosts if h.name == node.host), None)
    override = spec.nodes[node.name].tls if node.name in spec.nodes else None
    layers = [t for t in (override, host) if t is not None]

    def pick(field: str) -> FileRef | None:
        chosen: FileRef | None = next((getattr(t, field) for t in layers if getattr(t, field) is not None),
                                      getattr(spec.tls, field))
        return chosen

    return TlsFiles(ca=pick("ca"), cert=pick("cert"), key=pick("key"))


def missing_refs(spec: Spec, node: Node) -> list[str]:
    """The files a node has none of, with given (not generated) certificates."""
    refs = node_refs(spec, node)
    return [name for name in ("ca", "cert", "key") if getattr(refs, name) is None]


def node_names(node: Node) -> tuple[str, ...]:
    """Subject alternative names of a generated node certificate: its address, then its host's name."""
    return (node.address, node.host) if node.host != node.address else (node.address,)
