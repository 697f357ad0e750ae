"""What a node's record on its host says it was deployed as, read into plain values: placement's input (opsctl.spec
.placement, opsctl.spec.replplacement). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import field
from typing import Annotated, ClassVar

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import Range, Versioned
from opsctl.spec.layout import MAX_PORT, SENTINEL_PREFIX, Layout, Node, Role, valid_host
from opsctl.spec.model import Spec

MAX_SHARD = 16384  # a cluster has no more shards than slots


@frozen
class DeployedAs(Versioned):
    """A node record's `deployed`: what the node was deployed as (host, port, role, shard: its identity) and where
    it listens (address: data, not identity; None in records from before it was kept). Each value reaches a config
    file, a plan and a scrape target as it is: ranged here."""

    host: str
    port: Annotated[int, Range(1, MAX_PORT, "a port")]
    role: str
    shard: Annotated[int, Range(1, MAX_SHARD, "a shard number")] | None = None
    address: str | None = None

    @classmethod
    def of(cls, node: Node) -> DeployedAs:
        return cls(node.host, node.port, node.role, node.shard, node.address)

    def identity(self) -> dict[str, str | int | None]:
        """What the node is (spec.layout.deployed_as's shape): its address left out, which is data."""
        return {"host": self.host, "port": self.port, "role": self.role, "shard": self.shard}

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.address is not None and not valid_host(self.address):
            yield "address", "is not an IP address or host name"


@frozen
class NodeRecord(Versioned):
    """opsctl-node.json, a node's record on its host: what opsctl last applied (digest, the directives as rendered,
    secrets masked, when), what the node was deployed as, a restart an interrupted apply still owes it, and a
    retired node's tombstone (retired; purging until its folder's purge is done, apply.slot_steps.retire). Written
    sparse (a field at its default is left out: the files of earlier versions, byte for byte); keys a later opsctl
    wrote are kept and written back. NodeRecord() is no record (no file yet), and false as the {} it replaces."""

    SPARSE: ClassVar[bool] = True
    digest: str | None = None
    directives: tuple[tuple[str, str], ...] = ()
    applied: float | None = None
    deployed: DeployedAs | None = None
    pending_restart: bool = False
    retired: bool = False
    purging: bool = False
    kept: Mapping[str, object] = field(default_factory=dict)

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.applied is not None and self.applied < 0:
            yield "applied", "is not a time (seconds since 1970)"

    def __bool__(self) -> bool:
        return self != NodeRecord()


@frozen
class Deployed(Frozen):
    """What a node's record on its host says it was deployed as; retired: a tombstone, its name kept from reuse
    (purging: its folder's purge not done yet, so placement retires it again)."""

    name: str
    host: str
    port: int
    role: str
    shard: int | None
    retired: bool = False
    address: str | None = None  # where the node listens: data, not identity (None in records from before it)
    purging: bool = False


def recorded_role(d: Deployed) -> Role:
    """The role a record says its node was deployed with, as a layout role."""
    return "sentinel" if d.role == "sentinel" else "master" if d.role == "master" else "replica"


def name_index(spec: Spec, name: str) -> int | None:
    """k of a server name <spec>-k, None for any other name."""
    found = re.fullmatch(re.escape(spec.name) + r"-(\d+)", name)
    return int(found.group(1)) if found else None


def deployed_from_records(records: Mapping[str, NodeRecord]) -> list[Deployed]:
    """The records' deployed placements (a record without one, from before placements were kept, is left out)."""
    return [Deployed(name, was.host, was.port, was.role, was.shard, record.retired, was.address,
                     record.retired and record.purging)
            for name, record in sorted(records.items()) if (was := record.deployed) is not None]


def sentinel_index(spec: Spec, name: str) -> int | None:
    """i of a sentinel name <spec>-sentinel-i, None for any other name."""
    found = re.fullmatch(re.escape(f"{spec.name}-{SENTINEL_PREFIX}-") + r"(\d+)", name)
    return int(found.group(1)) if found else None


def unpurged(deployed: Sequence[Deployed]) -> list[Deployed]:
    """Tombstones whose folder's purge a killed run left undone: retired again (never a member, name kept)."""
    return [d for d in deployed if d.retired and d.purging]


def is_node_name(spec: Spec, name: str) -> bool:
    """A server's or a sentinel's name of spec: the node folders whose records placement reads."""
    return name_index(spec, name) is not None or sentinel_index(spec, name) is not None


def running_nodes(layout: Layout, records: Mapping[str, NodeRecord]) -> list[Node]:
    """The nodes deployed now, by the records (layout placed from them): the layout's nodes that have a record and
    the retired ones of a shard the layout keeps whose record is no tombstone (drained from a host the spec lost, a
    surplus member: they run at their recorded address until the next apply removes them); not a parked shard's
    (past cluster.masters: stopped by the apply that parks it, its records kept), nor a node the next apply adds.
    With no record at all (nothing deployed yet) the layout's nodes, where the first apply puts them."""
    if not records:
        return list(layout.nodes)
    live = {name for name, record in records.items() if not record.retired}
    kept = {s.index for s in layout.shards}
    leaving = [n for n in layout.retired if n.shard is None or n.shard in kept]
    return [n for n in (*layout.nodes, *leaving) if n.name in live]


def pending_nodes(layout: Layout, records: Mapping[str, NodeRecord]) -> list[Node]:
    """The layout's nodes the next apply adds (no record yet), while something is deployed: to be added, not down."""
    return [n for n in layout.nodes if n.name not in records] if records else []
