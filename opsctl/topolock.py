"""A lock held by the topology itself, so two opsctl runs never interleave on one cluster, whatever state dir
(checkout, host, --state-dir) each uses. The state-dir flock (opsctl.statelock) only covers one state dir.

The marker is not a key: a key would sit in a slot that may be moving, could be evicted under maxmemory, would
fail with OOM under noeviction, and would show up as data (counts, audits, backups). Instead the run holds one
connection to every reachable node of the topology, named with CLIENT SETNAME `opsctl-lock:<owner>:<lease>`
(lease in whole seconds), and renews it every LEASE/3 seconds. A run that dies loses its connections (the
kernel closes them) and with them the lock; a run that hangs or is cut off stops renewing, and once its
connection has been idle longer than its lease a later run may take over (it kills the stale connection).
Staleness is the server's own `idle` of that connection (CLIENT LIST), never a wall clock of the holder's
machine: two operator hosts whose clocks disagree cannot see each other's live lock as expired.

Protocol: set the marker on every node first, then list every node's clients. If any other live marker is
seen, withdraw and refuse (exit 3, owner named). Two runs that start at once may both refuse, but both can
never proceed: the one that lists second always sees the other's marker on any node they share.
"""

from __future__ import annotations

import getpass
import math
import os
import re
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from opsctl.admin import Admin
from opsctl.connector import Connector
from opsctl.errors import OpsctlError, RefusedError
from opsctl.spec.layout import Node

PREFIX = "opsctl-lock"
LEASE_SECONDS = 30.0
CONNECT_TIMEOUT = 2.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.@/+=-]")


@dataclass(frozen=True)
class Marker:
    """A lock marker seen on a node: whose, its lease, seconds since its holder last renewed it (the
    server's idle of that connection), and the client id that holds it there."""

    owner: str
    lease: int
    idle: int
    client_id: str
    node: str

    @property
    def live(self) -> bool:
        return self.idle <= self.lease


def owner_label() -> str:
    """user@host/pid<pid>: what a refused run is told (no spaces: CLIENT SETNAME refuses them)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return _UNSAFE.sub("_", f"{user}@{socket.gethostname()}/pid{os.getpid()}")[:120]


def marker_name(owner: str, lease: float) -> str:
    """The client name that marks the lock; the lease rounded up (never shorter than promised)."""
    return f"{PREFIX}:{owner}:{math.ceil(lease)}"


def parse_markers(client_list: str, node: str) -> list[Marker]:
    """The lock markers in a CLIENT LIST reply. Pure."""
    out = []
    for line in client_list.splitlines():
        fields = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
        owner, _, lease = fields.get("name", "").removeprefix(f"{PREFIX}:").rpartition(":")
        idle = fields.get("idle", "")
        if fields.get("name", "").startswith(f"{PREFIX}:") and owner and lease.isdigit() and idle.isdigit():
            out.append(Marker(owner, int(lease), int(idle), fields.get("id", ""), node))
    return out


def live_others(markers: Iterable[Marker], mine: dict[str, str]) -> tuple[list[Marker], list[Marker]]:
    """(live markers of other runs, expired ones): mine maps node -> my client id there. Pure."""
    others = [m for m in markers if mine.get(m.node) != m.client_id]
    return [m for m in others if m.live], [m for m in others if not m.live]


class TopologyLock:
    """Held markers on every reachable node; see the module docstring."""

    def __init__(self, connector: Connector, nodes: Sequence[Node], lease: float = LEASE_SECONDS) -> None:
        self.connector, self.loaded, self.nodes, self.lease = connector, connector.loaded, list(nodes), lease
        self.owner = owner_label()
        self.held: dict[str, tuple[Admin, Any, str]] = {}  # node -> (admin, its connection, my client id)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lock = threading.Lock()

    def acquire(self) -> None:
        for node in self.nodes:
            self._hold(node)
        if self.nodes and not self.held:
            raise OpsctlError("cannot take the topology lock: no server of the topology answered",
                              f"tried {', '.join(n.name for n in self.nodes)}",
                              "`opsctl status -f SPEC` shows which nodes are down; a run that holds no marker "
                              "could interleave with another run, so opsctl does not go on without one")
        seen = [m for name, (admin, conn, _) in list(self.held.items()) for m in self._markers(name, admin, conn)]
        live, stale = live_others(seen, {n: h[2] for n, h in self.held.items()})
        if live:
            self.release()
            first = live[0]
            raise RefusedError(f"another opsctl run holds this topology: {first.owner}",
                               f"its lock marker is a client named {PREFIX}:... on "
                               f"{', '.join(sorted({m.node for m in live}))}, renewed {first.idle}s ago "
                               f"(lease {first.lease}s)",
                               "wait until that run finishes (or stop it); a run that died releases the lock at "
                               f"once, one that hangs within {self.lease:.0f}s")
        for marker in stale:
            self._kill(marker)
        self._renewer = threading.Thread(target=self._renew, name="topology-lock", daemon=True)
        self._renewer.start()

    def _hold(self, node: Node) -> None:
        admin = self.connector.admin(node, timeout=CONNECT_TIMEOUT)
        try:
            conn = admin.client.connection_pool.get_connection()
            conn.send_command(admin.command("CLIENT"), "ID")
            client_id = str(conn.read_response())
            self._name(admin, conn)
        except redis.ResponseError as exc:
            admin.close()
            raise self._refused(node.name, exc) from None
        except (redis.RedisError, OSError):
            admin.close()
            return  # a node that does not answer holds no marker; the others do
        self.held[node.name] = (admin, conn, client_id)

    def _refused(self, name: str, exc: redis.ResponseError) -> OpsctlError:
        """CLIENT refused on a node: the markers set so far are withdrawn."""
        self.release()
        return OpsctlError(f"cannot take the topology lock on {name}: CLIENT was refused", str(exc),
                           "opsctl needs CLIENT ID, SETNAME, LIST and KILL on its admin connection: do not "
                           "disable CLIENT in hardening (renaming it is fine)")

    def _name(self, admin: Admin, conn: Any) -> None:
        conn.send_command(admin.command("CLIENT"), "SETNAME", marker_name(self.owner, self.lease))
        conn.read_response()

    def _markers(self, name: str, admin: Admin, conn: Any) -> list[Marker]:
        """The markers on one node; a node that stopped answering since it was marked is dropped (it holds
        no marker any more, the others do)."""
        try:
            conn.send_command(admin.command("CLIENT"), "LIST")
            reply = conn.read_response()
        except redis.ResponseError as exc:
            raise self._refused(name, exc) from None
        except (redis.RedisError, OSError):
            self.held.pop(name, None)
            conn.disconnect()
            admin.close()
            return []
        return parse_markers(reply.decode() if isinstance(reply, bytes) else str(reply), name)

    def _kill(self, marker: Marker) -> None:
        admin, conn, _ = self.held[marker.node]
        try:
            conn.send_command(admin.command("CLIENT"), "KILL", "ID", marker.client_id)
            conn.read_response()
        except redis.RedisError:
            pass  # gone already

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            with self._lock:
                for name, (admin, conn, _) in list(self.held.items()):
                    try:
                        self._name(admin, conn)
                    except (redis.RedisError, OSError):
                        self.held.pop(name, None)  # a restarted node: the others still hold the lock

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._lock:
            for admin, conn, _ in self.held.values():
                conn.disconnect()
                admin.close()
            self.held.clear()


@contextmanager
def topology_lock(connector: Connector, nodes: Sequence[Node] | None = None,
                  lease: float = LEASE_SECONDS) -> Iterator[TopologyLock]:
    """Hold the topology's lock for the block (RefusedError, exit 3, naming the owner, when another run holds
    it). nodes: the servers to mark, by default every server of the spec."""
    lock = TopologyLock(connector, nodes if nodes is not None else connector.loaded.layout.servers, lease)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
