"""What a node's record on its host says it was deployed as, read into plain values: placement's input (opsctl.spec
.placement, opsctl.spec.replplacement). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from opsctl.base.frozen import Frozen, frozen
from opsctl.spec.layout import SENTINEL_PREFIX, Layout, Node, Role
from opsctl.spec.model import Spec

PURGING = "purging"  # a tombstone's mark until its folder was purged (apply.slot_steps.retire)


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


def deployed_from_records(records: Mapping[str, Mapping[str, object]]) -> list[Deployed]:
    """The records' deployed placements (a record without one, from before placements were kept, is left out)."""
    found = []
    for name, record in sorted(records.items()):
        was = record.get("deployed")
        if isinstance(was, Mapping) and isinstance(was.get("host"), str) and isinstance(was.get("port"), int):
            shard = was.get("shard")
            address = was.get("address")
            found.append(Deployed(name, str(was["host"]), int(str(was["port"])), str(was.get("role")),
                                  shard if isinstance(shard, int) else None, bool(record.get("retired")),
                                  address if isinstance(address, str) else None,
                                  bool(record.get("retired") and record.get(PURGING))))
    return found


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


def running_nodes(layout: Layout, records: Mapping[str, Mapping[str, object]]) -> list[Node]:
    """The nodes deployed now, by the records (layout placed from them): the layout's nodes that have a record and
    the retired ones of a shard the layout keeps whose record is no tombstone (drained from a host the spec lost, a
    surplus member: they run at their recorded address until the next apply removes them); not a parked shard's
    (past cluster.masters: stopped by the apply that parks it, its records kept), nor a node the next apply adds.
    With no record at all (nothing deployed yet) the layout's nodes, where the first apply puts them."""
    if not records:
        return list(layout.nodes)
    live = {name for name, record in records.items() if not record.get("retired")}
    kept = {s.index for s in layout.shards}
    leaving = [n for n in layout.retired if n.shard is None or n.shard in kept]
    return [n for n in (*layout.nodes, *leaving) if n.name in live]


def pending_nodes(layout: Layout, records: Mapping[str, Mapping[str, object]]) -> list[Node]:
    """The layout's nodes the next apply adds (no record yet), while something is deployed: to be added, not down."""
    return [n for n in layout.nodes if n.name not in records] if records else []
