"""Connections to every master taking part in a slot operation, their ids, slots and versions. I/O shell."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from opsctl.admin import Admin
from opsctl.connector import Connector
from opsctl.errors import OpsctlError
from opsctl.observe.collect import Command, NodeObservation, Observer, checked_pipeline, raw_pipeline, round_trip
from opsctl.observe.parse import ClusterNodeLine, myself, server_of
from opsctl.slots.endpoints import flagged_ids, shard_master
from opsctl.slots.ranges import expand
from opsctl.slots.scale import find_node, shard_members
from opsctl.spec.layout import Node
from opsctl.versions import has_capability

T = TypeVar("T")
STREAM_CHUNK = 32  # commands packed and sent at a time by stream()
ENGINE_TIMEOUT = 300.0  # socket timeout of engine connections: longer than any MIGRATE timeout we send


@dataclass
class Peer:
    node: Node
    admin: Admin  # bytes replies: key names are binary
    id: str

    @property
    def name(self) -> str:
        return self.node.name


def pipe(peer: Peer, commands: Sequence[Command]) -> list[Any]:
    """One round trip; error replies come back as exception objects."""
    return raw_pipeline(peer.admin, commands) if commands else []


def stream(peer: Peer, commands: Sequence[Command], chunk: int = STREAM_CHUNK) -> list[Any]:
    """Like pipe, but packed and sent in chunks (see raw_pipeline)."""
    return raw_pipeline(peer.admin, commands, chunk) if commands else []


def keyed(peer: Peer, command: str, subcommand: str, keys: Sequence[bytes]) -> list[Any]:
    """`command subcommand key` for every key (`MEMORY USAGE k1`, ...) in one round trip, packed in one buffer
    (opsctl.resp): redis-py packs one command at a time, microseconds each, for 100k keys and more."""
    from opsctl.resp import encode_keyed

    if not keys:
        return []
    packed = encode_keyed(peer.admin.command(command).encode(), keys, subcommand.encode())
    return round_trip(peer.admin, lambda conn: conn.send_packed_command([packed]), len(keys))


def checked(peer: Peer, commands: Sequence[Command], doing: str) -> list[Any]:
    return checked_pipeline(peer.admin, commands, doing, "`opsctl cluster fix -f SPEC` closes what this run opened",
                            pipe(peer, commands))


class Session:
    """Engine connections (bytes) plus an Observer for looking again after each mutation."""

    def __init__(self, connector: Connector, nodes: Iterable[Node]) -> None:
        self.connector = connector
        self.loaded = connector.loaded
        self.nodes = list(nodes)
        self.observer = Observer(connector, self.nodes, timeout=5.0)
        self.pool = ThreadPoolExecutor(max_workers=max(4, min(32, len(self.nodes))))
        self.seen: dict[str, NodeObservation] = {}
        self.peers: dict[str, Peer] = {}
        self._probes: dict[str, Admin] = {}
        self._probes_lock = threading.Lock()
        self.refresh()

    def refresh(self) -> dict[str, NodeObservation]:
        self.seen = self.observer.observe()
        for name, obs in self.seen.items():
            me = myself(obs.cluster_nodes or [])
            if me is not None and (name not in self.peers or self.peers[name].id != me.id):
                node = next(n for n in self.nodes if n.name == name)
                self.peers[name] = Peer(node, self.connector.admin(node, ENGINE_TIMEOUT, decode=False), me.id)
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

    def parallel(self, fn: Callable[[Peer], T], peers: Sequence[Peer]) -> list[T]:
        return [f.result() for f in [self.pool.submit(fn, p) for p in peers]]

    def probe_admin(self, node: Node, timeout: float) -> Admin:
        """A short-timeout connection to node kept for the session (a timed-out one is dropped and redone)."""
        with self._probes_lock:
            if node.name not in self._probes:
                self._probes[node.name] = self.connector.admin(node, timeout=timeout)
            return self._probes[node.name]

    def close(self) -> None:
        for admin in self._probes.values():
            admin.close()
        self.observer.close()
        self.pool.shutdown(wait=True)
        for peer in self.peers.values():
            peer.admin.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
