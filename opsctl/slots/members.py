"""Nodes that run but are no longer in the spec (after `cluster.masters` or `replicas_per_master` went down). Pure.

Names are stable (shard s owns <name>-k for k in ((s-1)*(R+1), s*(R+1)]), so a bigger layout of the same
spec names every node a larger spec had: retired nodes are found by endpoint in what the cluster reports.
"""

from __future__ import annotations

from collections.abc import Iterable

from opsctl.observe.replies import ClusterNodeLine
from opsctl.spec.layout import Layout, Node, cluster_layout
from opsctl.spec.load import LoadedSpec

MAX_EXTRA_SHARDS = 64


def wider_layout(loaded: LoadedSpec, extra_shards: int = MAX_EXTRA_SHARDS) -> Layout:
    masters = loaded.spec.cluster_or_default().masters
    return cluster_layout(loaded.spec, masters=masters + extra_shards)


def find_node(loaded: LoadedSpec, ref: str) -> Node | None:
    """A server by name or address:port, in the spec's layout, among its retired nodes, or among the nodes a larger
    spec would have."""
    node = loaded.layout.find(ref)
    if node is not None or loaded.spec.topology != "cluster":
        return node
    return Layout(loaded.layout.retired).find(ref) or wider_layout(loaded).find(ref)


def retired_nodes(loaded: LoadedSpec, views: Iterable[Iterable[ClusterNodeLine]]) -> list[Node]:
    """Servers the running cluster knows that the spec's layout no longer has (in layout order)."""
    current = {n.endpoint for n in loaded.layout.servers}
    seen = {line.endpoint for view in views for line in view if line.endpoint not in current}
    if not seen:
        return []
    recorded = [n for n in loaded.layout.retired if n.endpoint in seen]
    rest = seen - {n.endpoint for n in recorded}
    names = {n.name for n in recorded}
    return [*recorded, *(n for n in wider_layout(loaded).servers if n.endpoint in rest and n.name not in names)]


def cluster_members(loaded: LoadedSpec, views: Iterable[Iterable[ClusterNodeLine]]) -> list[Node]:
    """The cluster as it is: the spec's servers, then the retired nodes it still knows (a scale-in not drained
    yet). Every run that judges or moves the cluster looks at these; a retired node votes and must agree too."""
    return [*loaded.layout.servers, *retired_nodes(loaded, views)]


def shard_members(loaded: LoadedSpec, name: str) -> tuple[str, ...]:
    """The names of the nodes of name's shard (itself only when it has none): a move follows the shard."""
    shard = loaded.layout.shard_of(name)
    if shard is not None:
        return tuple(shard.members)
    if any(n.name == name for n in loaded.layout.retired):  # a retired node: its shard's members in the layout
        index = Layout(loaded.layout.retired).node(name).shard
        same = [n.name for n in loaded.layout.retired if n.shard == index]
        kept = next((s.members for s in loaded.layout.shards if s.index == index), ())
        return (*same, *kept) if len(same) > 1 or kept else (name,)
    shard = wider_layout(loaded).shard_of(name)  # the wider one only if needed
    return tuple(shard.members) if shard is not None else (name,)
