"""The write fence, pure part: its value, how to see it in a CONFIG GET reply, what lifting it restores.

An old master is fenced during a Sentinel or plain-replication failover: `min-replicas-to-write` far above any
replica count makes it answer NOREPLICAS to every write, and that outlives opsctl (the I/O lives in
opsctl.failover.fence).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # spec_values renders; fenced, which status and health ask, needs none of it
    from opsctl.spec.layout import Node
    from opsctl.spec.load import LoadedSpec

FENCE = "1000000"  # min-replicas-to-write no real shard reaches: every write gets NOREPLICAS
TO_WRITE, MAX_LAG = "min-replicas-to-write", "min-replicas-max-lag"
DEFAULTS = {TO_WRITE: "0", MAX_LAG: "10"}

__all__ = ["FENCE", "MAX_LAG", "TO_WRITE", "fenced", "is_fence", "spec_values"]


def fenced(config: Mapping[str, str] | None) -> bool:
    """Does this CONFIG GET reply show the fence?"""
    return (config or {}).get(TO_WRITE) == FENCE


def is_fence(name: str, value: str | None) -> bool:
    """Is this directive's live or on-disk value the fence? Then it is not drift for a CONFIG SET or a rewritten file
    to undo: finishing the failover lifts it (back to spec_values), and lifting it earlier makes two masters."""
    return name == TO_WRITE and value == FENCE


def spec_values(loaded: LoadedSpec, node: Node) -> dict[str, str]:
    """min-replicas-to-write and -max-lag as the spec renders them (persistence.min_replicas_*; the server's defaults
    where it renders none): what lifting the fence restores."""
    from opsctl.plan.desired import rendered_values

    return rendered_values(loaded, node, DEFAULTS)
