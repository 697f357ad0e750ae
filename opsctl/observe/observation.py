"""What one node said in one look, parsed: the record every observer fills and NodeFacts is made from."""

from __future__ import annotations

from dataclasses import dataclass, field

from opsctl.observe.parse import ClusterNodeLine, RoleInfo
from opsctl.spec.layout import Node


@dataclass
class NodeObservation:
    """What one node said. info holds INFO merged with CLUSTER INFO (cluster_state, ...) for cluster nodes."""

    node: Node
    reachable: bool
    error: str = ""
    info: dict[str, str] = field(default_factory=dict)
    role: RoleInfo | None = None
    cluster_nodes: list[ClusterNodeLine] | None = None
    config: dict[str, str] | None = None
    fence: dict[str, str] | None = None  # CONFIG GET min-replicas-to-write, read where config is not
