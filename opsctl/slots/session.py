"""Connections to every master taking part in a slot operation, their ids, slots and versions. I/O shell."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opsctl.base.errors import NodeRefused, OpsctlError, RefusedError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import Pending, wait_for
from opsctl.base.record import Versioned
from opsctl.net.connection import Connection, connection_to
from opsctl.net.connector import Connector
from opsctl.net.fanout import Borrowed
from opsctl.net.observer import Observer, to_facts, wait_converged
from opsctl.observe.cluster_state import observed_problems, slot_map
from opsctl.observe.replies import ClusterNodeLine, Command, NodeObservation, RespError, myself, server_of
from opsctl.server.versions import has_capability, parse_version
from opsctl.slots.batching import engine_timeout_s
from opsctl.slots.members import cluster_members, find_node, shard_members
from opsctl.slots.moveguard import flagged_ids, shard_master
from opsctl.slots.ranges import expand
from opsctl.spec.layout import Node

T = TypeVar("T")
STREAM_CHUNK = 32  # commands packed and sent at a time by stream()


# The slot modules' name for a node's error reply among a pipeline's replies: one type (an Exception, as the
# key mover tests replies).
ReplyError = RespError


@dataclass
class Peer:
    """A master taking part in a slot operation: its node, its id, and its handle (replies stay bytes: key names
    are binary), with the engine's timeout."""

    node: Node
    handle: Connection
    id: str

    @property
    def name(self) -> str:
        return self.node.name

    def command(self, name: str) -> str:
        """A command's name as this node knows it (the spec's renames)."""
        return self.handle.command(name)


def pipe(peer: Peer, commands: Sequence[Command]) -> list[Any]:
    """One round trip; error replies come back as RespError values."""
    return peer.handle.pipeline(commands) if commands else []


def stream(peer: Peer, commands: Sequence[Command], chunk: int = STREAM_CHUNK,
           timeout: float | None = None) -> list[Any]:
    """Like pipe, but packed and sent in chunks; timeout: each reply's wait, when longer than the connection's."""
    return peer.handle.pipeline(commands, chunk, timeout) if commands else []


def keyed(peer: Peer, command: str, subcommand: str, keys: Sequence[bytes]) -> list[Any]:
    """`command subcommand key` for every key (`MEMORY USAGE k1`, ...) in one round trip, packed in one buffer
    (opsctl.net.resp), not one command at a time, for 100k keys and more."""
    return peer.handle.keyed(command, subcommand, keys)


def checked(peer: Peer, commands: Sequence[Command], doing: str) -> list[Any]:
    """pipe, whose first error reply becomes NodeRefused naming the node and the command."""
    replies = pipe(peer, commands)
    for cmd, reply in zip(commands, replies, strict=True):
        if isinstance(reply, RespError):
            words = " ".join(str(c) for c in cmd[:4])
            raise NodeRefused(f"{doing} failed on {peer.name} ({peer.node.endpoint})", f"{words}: {reply}",
                              "`opsctl cluster fix -f SPEC` closes what this run opened")
    return replies


class Session:
    """Engine connections (bytes) plus an Observer for looking again after each mutation."""

    def __init__(self, connector: Connector, nodes: Iterable[Node]) -> None:
        self.connector = connector
        self.loaded = connector.loaded
        self.nodes = list(nodes)
        self.observer = Observer(connector, self.nodes, timeout=5.0)
        self.engine_timeout = engine_timeout_s(self.loaded.spec.cluster_or_default().node_timeout_ms)
        self.pool = Borrowed()  # a share of the process's I/O threads (net.fanout)
        self.seen: dict[str, NodeObservation] = {}
        self.peers: dict[str, Peer] = {}
        self._probes: dict[str, Connection] = {}
        self._probes_lock = threading.Lock()
        self.refresh()

    def refresh(self) -> dict[str, NodeObservation]:
        self.seen = self.observer.observe()
        for name, obs in self.seen.items():
            me = myself(obs.cluster_nodes or [])
            if me is not None and (name not in self.peers or self.peers[name].id != me.id):
                node = next(n for n in self.nodes if n.name == name)
                if name in self.peers:
                    self.peers[name].handle.close()
                self.peers[name] = Peer(node, connection_to(self.connector, node, self.engine_timeout), me.id)
        return self.seen

    def me(self, name: str) -> ClusterNodeLine | None:
        obs = self.seen.get(name)
        return myself(obs.cluster_nodes or []) if obs else None

    def masters(self) -> list[Peer]:
        return [p for name, p in self.peers.items() if (me := self.me(name)) is not None and me.is_master]

    def owned(self) -> dict[str, list[int]]:
        """Each reachable master's slots, as it sees them itself."""
        return {p.name: expand(me.slots if (me := self.me(p.name)) else ()) for p in self.masters()}

    def views(self) -> dict[str, list[ClusterNodeLine]]:
        return {n: o.cluster_nodes for n, o in self.seen.items() if o.cluster_nodes}

    def current_master(self, name: str) -> str | None:
        """The master now serving name's shard: name itself, or the replica the cluster promoted."""
        members = [m for m in shard_members(self.loaded, name) if m in self.peers]
        return shard_master(members, {m: self.me(m) for m in members}, flagged_ids(self.views()))

    def shard_masters(self) -> list[str | None]:
        """Each shard's master now, in shard order, as apply decides it (plan.masters.current_master), where it
        answers as a master; None where it does not, or where the look cannot tell which it is (apply refuses)."""
        from opsctl.plan.masters import current_master  # only `cluster fix` needs it: not every slot command's start

        layout, facts = self.loaded.layout, to_facts(self.seen)
        masters: list[str | None] = []
        for shard in layout.shards:
            try:
                master = current_master(shard, layout, facts)
            except RefusedError:
                masters.append(None)
                continue
            me = self.me(master)
            masters.append(master if master in self.peers and me is not None and me.is_master else None)
        return masters

    def name_of(self, node_id: str) -> str | None:
        """A node id as some node's view shows it -> our name for it (also for a node that stopped answering)."""
        for view in self.views().values():
            for line in view:
                if line.id == node_id:
                    node = find_node(self.loaded, line.endpoint)
                    return node.name if node else None
        return None

    def peer(self, name: str) -> Peer:
        if name not in self.peers:
            raise OpsctlError(f"{name} is not a reachable cluster node", self.seen[name].error if name in self.seen
                              else "", "`opsctl cluster check -f SPEC` shows the state")
        return self.peers[name]

    def atomic(self) -> bool:
        """Whether every reachable server supports atomic slot migration."""
        versions = [server_of(o.info) for o in self.seen.values() if o.reachable]
        return bool(versions) and all(v is not None and has_capability(v[0], v[1], "atomic_slot_migration")
                                      for v in versions)

    def has_slot_ranges(self, name: str) -> bool:
        """Whether name's server takes CLUSTER ADDSLOTSRANGE/DELSLOTSRANGE, by the version it reports (during a
        rolling version change the spec names the new one), else by the spec's."""
        obs = self.seen.get(name)
        reported = server_of(obs.info) if obs is not None else None
        server = self.loaded.spec.server
        flavor, version = reported or (server.flavor, parse_version(server.version))
        return has_capability(flavor, version, "slot_range_commands")

    def parallel(self, fn: Callable[[Peer], T], peers: Sequence[Peer]) -> list[T]:
        return [f.result() for f in [self.pool.submit(fn, p) for p in peers]]

    def probe(self, node: Node, timeout: float) -> Connection:
        """A short-timeout connection to node kept for the session (one that failed is opened again)."""
        with self._probes_lock:
            if node.name not in self._probes:
                self._probes[node.name] = connection_to(self.connector, node, timeout)
            return self._probes[node.name]

    def close(self) -> None:
        for link in self._probes.values():
            link.close()
        self.observer.close()
        self.pool.shutdown(wait=True)
        for peer in self.peers.values():
            peer.handle.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


CONVERGE_TIMEOUT = 60.0


MAX_FAILOVERS = 3  # failovers of a move's shards one run follows before it stops and says so


@frozen
class DescribedMove(Versioned):
    """One move of a slot operation: slots (ranges as text) from source to target, with the keys and bytes it is
    estimated to carry."""

    source: str
    target: str
    slots: str
    slot_count: int
    est_keys: int
    est_bytes: int

    def fields(self) -> dict[str, str | int]:
        """The move as the slots-start event lists it."""
        return {"source": self.source, "target": self.target, "slots": self.slots, "slot_count": self.slot_count,
                "est_keys": self.est_keys, "est_bytes": self.est_bytes}


@frozen
class SlotsSummary(Versioned):
    """What the moves did: the slots-done event's counters (its kind first, as the JSON always had it) and the
    engine that moved the keys."""

    event: str
    slots_done: int
    slots_total: int
    keys: int
    bytes: int
    keys_per_sec: float
    seconds: float
    eta: float | None
    mode: str


@frozen
class SlotsOutcome(Frozen):
    """cluster reshard, rebalance and fix: the moves (made, or in a dry run to be made), their summary (None: none
    was run), notes, and rebalance --by a load's readable plan (slots.byload.plan_dict)."""

    moves: tuple[DescribedMove, ...] = ()
    summary: SlotsSummary | None = None
    dry_run: bool = False
    notes: tuple[str, ...] = ()
    plan: Mapping[str, Any] = field(default_factory=dict)  # (its shape is plan_dict's, not yet a record)


def open_session(connector: Connector) -> Session:
    """A session over the cluster as it is (slots.members.cluster_members): looked at once, and once more
    only when it knows retired nodes."""
    servers = connector.loaded.layout.servers
    session = Session(connector, servers)
    members = cluster_members(connector.loaded, list(session.views().values()))
    if len(members) == len(servers):
        return session
    session.close()
    return Session(connector, members)


def wait_stable(session: Session, timeout: float = CONVERGE_TIMEOUT) -> None:
    """Until every node agrees; with nodes down (a master killed and failed over), until the nodes that
    answer agree on one slot map with no slot open: `apply` restarts the others. The session's last look
    (callers refresh it just before) counts as the first poll."""
    if all(o.reachable for o in session.seen.values()) and not observed_problems(session.seen):
        return
    seen = session.observer.observe(info_section="replication")
    if all(o.reachable for o in seen.values()):
        wait_converged(session.observer, timeout)
        return
    wait_for(lambda: _answering_agree(session), timeout, "the nodes that answer to agree on the slot map")


def _answering_agree(session: Session, open_ok: bool = False) -> bool | Pending:
    """The nodes that answer agree on one slot map and (unless open_ok) show no open slot."""
    views = {n: o.cluster_nodes for n, o in session.observer.observe(info_section="server").items()
             if o.cluster_nodes}
    maps = {slot_map(v) for v in views.values()}
    if len(maps) > 1:
        return Pending(f"{len(maps)} different slot maps among {len(views)} nodes")
    if open_ok:
        return True
    busy = [n for n, v in views.items() if (me := myself(v)) is not None and (me.migrating or me.importing)]
    return Pending(f"{', '.join(busy)} still show open slots") if busy else True


def wait_one_slot_map(session: Session, timeout: float = CONVERGE_TIMEOUT) -> None:
    """Until the nodes that answer agree on who serves each slot (open slots allowed), then look again: after a
    failover, a master that was stalled claims its old slots until gossip tells it about the newer epoch."""
    wait_for(lambda: _answering_agree(session, open_ok=True), timeout,
             "the nodes that answer to agree on which master serves each slot")
    session.refresh()
