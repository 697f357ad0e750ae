"""A lock held by the topology itself: one marked connection per node (CLIENT SETNAME `opsctl-lock:<owner>:<lease>`),
renewed every third of the lease, stale once the server says it idled longer. Why: the state-dir flock covers one
state dir, and a key would be data. Set first, then list: two runs may both refuse, never both proceed. See
docs/slots.md, "One run per topology".
"""

from __future__ import annotations

import getpass
import math
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.text import as_text
from opsctl.net.connector import Connector, port_accepts
from opsctl.net.fanout import WIDTH, fan_out
from opsctl.net.rawpipe import PIPE_ERRORS, NodeRefused, RawPipe
from opsctl.net.resp import Reply
from opsctl.spec.layout import Node

PREFIX = "opsctl-lock"
LEASE_SECONDS = 30.0
LEASE_ENV = "OPSCTL_LOCK_LEASE"
LEASE_RANGE = (2.0, 3600.0)
RETRY_UNHELD = 1.0
CONNECT_TIMEOUT = 2.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.@/+=-]")


class Held(NamedTuple):
    """A marked node: the raw connection that holds the marker (no redis-py: slot commands do not load it),
    and that connection's client id there. Not NodePipes: the connection is the marker, so it is never pooled or
    opened again behind the lock's back (a new one would hold no marker)."""

    pipe: RawPipe
    client_id: str


def _reply(pipe: RawPipe, *words: str) -> Reply:
    """One CLIENT subcommand on the marker's connection; an error reply (CLIENT disabled in hardening, or an ACL
    without it) raises NodeRefused."""
    return pipe.ask("CLIENT", *words)


@frozen
class Marker(Frozen):
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


def lease_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """The lease: $OPSCTL_LOCK_LEASE seconds (2 to 3600), else 30. A shorter lease lets a hung run's lock
    expire sooner; every run of one topology should use the same."""
    text = environ.get(LEASE_ENV)
    if text is None:
        return LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = LEASE_RANGE
    if not low <= value <= high:
        raise OpsctlError(f"{LEASE_ENV}={text[:40]!r} is not a lease opsctl accepts",
                          hint=f"give seconds from {low:.0f} to {high:.0f} (default {LEASE_SECONDS:.0f}), or unset it")
    return value


def lost_error(reason: str, finished: bool = False) -> OpsctlError:
    """finished: the loss was found once the run's last change was made (it may have overlapped another run)."""
    when = ("its last change overlapped the loss, and nothing was left to stop" if finished
            else "this run stopped before its next change")
    return OpsctlError(f"this run lost the topology lock: {reason}",
                       f"another opsctl run may have changed the topology meanwhile; {when}",
                       "look at `opsctl status -f SPEC` (and `opsctl cluster check` for a cluster), then run the "
                       "same command again: it goes on from the live state")


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

    def __init__(self, connector: Connector, nodes: Sequence[Node], lease: float | None = None) -> None:
        self.connector, self.loaded, self.nodes = connector, connector.loaded, list(nodes)
        self.lease = lease_seconds() if lease is None else lease
        self.owner = owner_label()
        self.held: dict[str, Held] = {}  # node -> (admin, its connection, my client id)
        self.lost: str | None = None
        self._renewed_at = time.monotonic()  # when the last renewal was sent: the servers' idle counts from it
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lock = threading.Lock()

    def acquire(self, unanswered_ok: bool = False) -> None:
        """Mark every answering node. unanswered_ok: no node answering is no refusal (a topology not started
        yet, under the caller's state-dir lock): its nodes are marked as they start."""
        try:
            self._acquire(unanswered_ok)
        except BaseException:
            self.release()
            raise
        self._renewer = threading.Thread(target=self._renew, name="topology-lock", daemon=True)
        self._renewer.start()

    def _acquire(self, unanswered_ok: bool) -> None:
        self._renewed_at = time.monotonic()
        self._hold_all(self.nodes, CONNECT_TIMEOUT)
        if self.nodes and not self.held and not unanswered_ok:
            raise OpsctlError("cannot take the topology lock: no server of the topology answered",
                              f"tried {', '.join(n.name for n in self.nodes)}",
                              "`opsctl status -f SPEC` shows which nodes are down; a run that holds no marker "
                              "could interleave with another run, so opsctl does not go on without one")
        seen = [m for name, held in list(self.held.items()) for m in self._markers(name, held.pipe)]
        live, stale = live_others(seen, {n: h.client_id for n, h in self.held.items()})
        if live:
            first = live[0]
            raise RefusedError(f"another opsctl run holds this topology: {first.owner}",
                               f"its lock marker is a client named {PREFIX}:... on "
                               f"{', '.join(sorted({m.node for m in live}))}, renewed {first.idle}s ago "
                               f"(lease {first.lease}s)",
                               "wait until that run finishes (or stop it); a run that died releases the lock at "
                               f"once, one that hangs within {self.lease:.0f}s")
        for marker in stale:
            self._kill(marker)

    def _hold_all(self, nodes: Sequence[Node], timeout: float) -> None:
        """Mark nodes side by side (a 60-node start is marked in one round trip's time, not 60), then keep
        every marker set: the first refusal is raised only once none of them can be left unrecorded."""
        results = fan_out(lambda node: self._marked(node, timeout), nodes)
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, tuple):
                self.held[node.name] = result
        refusal = next((r for r in results if isinstance(r, OpsctlError)), None)
        if refusal is not None:
            raise refusal

    def _marked(self, node: Node, timeout: float) -> Held | OpsctlError | None:
        """One node's marker connection; None when the node does not answer (it holds no marker, the others
        do); the refusal when it answers but refuses CLIENT."""
        if not port_accepts(*self.connector.dial(node), timeout=timeout):
            return None
        try:
            pipe = RawPipe(self.connector, node, timeout)
        except PIPE_ERRORS:
            return None
        try:
            client_id = str(_reply(pipe, "ID"))
            self._name(pipe)
        except NodeRefused as exc:
            pipe.close()
            return self._refused(node.name, exc)
        except PIPE_ERRORS:
            pipe.close()
            return None
        return Held(pipe, client_id)

    @staticmethod
    def _refused(name: str, exc: NodeRefused) -> OpsctlError:
        """CLIENT refused on a node (acquire withdraws the markers set so far)."""
        return OpsctlError(f"cannot take the topology lock on {name}: CLIENT was refused", exc.detail,
                           "opsctl needs CLIENT ID, SETNAME, LIST and KILL on its admin connection: do not "
                           "disable CLIENT in hardening (renaming it is fine)")

    def _name(self, pipe: RawPipe) -> None:
        _reply(pipe, "SETNAME", marker_name(self.owner, self.lease))

    def _markers(self, name: str, pipe: RawPipe) -> list[Marker]:
        """The markers on one node; a node that stopped answering since it was marked is dropped (it holds
        no marker any more, the others do)."""
        try:
            reply = _reply(pipe, "LIST")
        except NodeRefused as exc:
            raise self._refused(name, exc) from None
        except PIPE_ERRORS:
            self.held.pop(name, None)
            pipe.close()
            return []
        return parse_markers(as_text(reply), name)

    def _kill(self, marker: Marker) -> None:
        try:
            _reply(self.held[marker.node].pipe, "KILL", "ID", marker.client_id)
        except (NodeRefused, *PIPE_ERRORS):
            pass  # gone already

    def _renew(self) -> None:
        while not self._stop.wait(self._interval()):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._renew_once()
                except OpsctlError as exc:  # CLIENT refused on a node marked again
                    self._lose(exc.summary)
                if self.lost is not None:
                    return

    def _interval(self) -> float:
        unheld = len(self.held) < len(self.nodes)
        return min(self.lease / 3, RETRY_UNHELD) if unheld else self.lease / 3

    def _renew_once(self) -> None:
        started = time.monotonic()
        paused = started - self._renewed_at
        if paused > self.lease:
            self._lose(f"it was paused for {paused:.0f}s, longer than the lock's lease ({self.lease:.0f}s)")
            return
        for name, held in list(self.held.items()):
            try:
                self._name(held.pipe)
            except (NodeRefused, *PIPE_ERRORS):
                self._drop(name)  # a restarted node: marked again below once it answers
        self._renewed_at = started
        # bounded, so that nodes that do not answer (a host down) cannot delay the next renewal past the lease
        budget = time.monotonic() + self.lease / 6
        unheld = [n for n in self.nodes if n.name not in self.held]
        for first in range(0, len(unheld), WIDTH):
            if time.monotonic() > budget:
                return  # the others next round
            batch = unheld[first:first + WIDTH]
            self._hold_all(batch, min(CONNECT_TIMEOUT, self.lease / 6))
            for node in [n for n in batch if n.name in self.held]:
                held = self.held[node.name]
                live, _ = live_others(self._markers(node.name, held.pipe), {node.name: held.client_id})
                if live:
                    self._lose(f"{live[0].owner} holds {node.name}, which this run marked again after it "
                               "(re)started")
                    return

    def _drop(self, name: str) -> None:
        self.held.pop(name).pipe.close()

    def _lose(self, reason: str) -> None:
        """Counted as lost: the markers are withdrawn (a zombie must not refuse the run that took over)."""
        self.lost = reason
        for name in list(self.held):
            self._drop(name)

    def check(self, finished: bool = False) -> None:
        """OpsctlError when this run lost the lock (see the module docstring); called before each change, and
        once the run is done (finished): a loss during its last change is said, not kept quiet."""
        paused = time.monotonic() - self._renewed_at
        if self.lost is None and paused > self.lease:
            self.lost = f"it was paused for {paused:.0f}s, longer than the lock's lease ({self.lease:.0f}s)"
        if self.lost is not None:
            raise lost_error(self.lost, finished)

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._lock:
            for name in list(self.held):
                self._drop(name)


_RUNS: weakref.WeakKeyDictionary[Connector, TopologyLock] = weakref.WeakKeyDictionary()  # the lock a run holds
_RUNS_LOCK = threading.Lock()


@contextmanager
def topology_lock(connector: Connector, nodes: Sequence[Node] | None = None, lease: float | None = None,
                  unanswered_ok: bool = False) -> Iterator[TopologyLock]:
    """Hold the topology's lock for the block (RefusedError, exit 3, naming the owner, when another run holds
    it). nodes: the servers to mark, by default every server of the spec. The run that owns connector holds
    it already: that lock, checked (OpsctlError when lost). unanswered_ok: see TopologyLock.acquire."""
    with _RUNS_LOCK:
        outer = _RUNS.get(connector)
    if outer is not None:
        outer.check()
        yield outer
        return
    lock = TopologyLock(connector, nodes if nodes is not None else connector.loaded.layout.servers, lease)
    lock.acquire(unanswered_ok)
    with _RUNS_LOCK:
        _RUNS[connector] = lock
    try:
        yield lock
        lock.check(finished=True)  # the block ended without an error: was the lock held all through its last step?
    finally:
        with _RUNS_LOCK:
            _RUNS.pop(connector, None)
        lock.release()


def check_held(connector: Connector) -> None:
    """Before a topology-changing step: OpsctlError when the run that owns connector lost its lock; nothing
    when it holds none (a command that takes no topology lock)."""
    with _RUNS_LOCK:
        lock = _RUNS.get(connector)
    if lock is not None:
        lock.check()
