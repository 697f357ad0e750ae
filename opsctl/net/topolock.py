"""A lock the topology itself grants, by majority: one marked connection per server (CLIENT SETNAME, the rule in
opsctl.net.quorum), renewed every third of the lease, stale once the server says it idled longer. Why: the state-dir
flock covers one state dir, and a key would be data.

Invariant: a run acts only while it holds the lock opsctl.net.quorum defines: granted by a strict majority of the
topology's servers, kept renewed (confirmed within its lease) on enough that the rest are no majority.
Taking it: mark every server in one pipelined round trip each (set, then list), all at once; another run's live
marker, or grants from no majority, and the markers are withdrawn and the run refused (exit 3). Keeping it: a
renewal round that reaches too few does not count, so a run cut off with a minority counts its lock lost one
lease after its last good round, before its markers on the majority's side go stale there (idle past the lease)
and another run may take them; a marker that goes at once (a restart, CLIENT KILL) frees its node at once, so
when that leaves too few the lock is lost at once; marking a node again, another granted run's marker loses it.
Servers the provider finds running nowhere (not deployed yet, or stopped) grant no run anything: a majority of the
others is enough, and kept over them and each server marked since; the run's own stops leave the count, and a
server it starts is marked at once. --force-lock: a warning saying what it risks.
See docs/slots.md, "One run per topology", and docs/runbooks/partitions.md.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from opsctl.base.errors import (
    AUTH_HINT,
    TLS_HINT,
    AuthRefused,
    NodeRefused,
    OpsctlError,
    auth_failed,
    error_text,
    is_auth_failure,
    is_tls_failure,
)
from opsctl.base.events import Emit, Note, on_stderr
from opsctl.net import quorum
from opsctl.net.connector import Connector, port_accepts
from opsctl.net.fanout import WIDTH, fan_out
from opsctl.net.quorum import Marker, Tally, keeping, lease_seconds, live_others, majority, marker_name
from opsctl.net.rawpipe import PIPE_ERRORS, RawPipe, refused
from opsctl.observe.replies import RespError, as_text
from opsctl.spec.layout import Node

RETRY_UNHELD = 1.0
CONNECT_TIMEOUT = 2.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.@/+=-]")
_HARD_REFUSAL = re.compile(r"(ERR )?unknown (sub)?command|NOPERM", re.IGNORECASE)  # CLIENT disabled or not allowed
_CLOCK: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def _now() -> float:
    """CLOCK_BOOTTIME (Linux; else monotonic): it counts a suspend, so a laptop closed mid-apply is a pause."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


class Held(NamedTuple):
    """A marked node: the raw connection that holds the marker and its client id there. Not NodePipes: the
    connection is the marker, never pooled or opened again behind the lock's back (a new one holds no marker)."""

    pipe: RawPipe
    client_id: str


class Silent(NamedTuple):
    """A marker connection to a node that stopped replying in time, kept open (see TopologyLock._drop)."""

    since: float
    node: str
    held: Held


class Claim(NamedTuple):
    """A node just marked: its held connection and the markers listed there right after."""

    held: Held
    seen: list[Marker]


def owner_label() -> str:
    """user@host/pid<pid>: what a refused run is told (no spaces: CLIENT SETNAME refuses them)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return _UNSAFE.sub("_", f"{user}@{socket.gethostname()}/pid{os.getpid()}")[:120]


def _answered_but_refused(name: str, exc: BaseException) -> OpsctlError | None:
    """A node that answers but refuses opsctl's password or TLS is said as such (what every command says of it),
    not counted as silent: that would read as a split. None: it does not answer."""
    words = f"{exc.summary}: {exc.detail}" if isinstance(exc, OpsctlError) else error_text(exc)
    if isinstance(exc, AuthRefused) or is_auth_failure(exc):
        return OpsctlError(auth_failed(name), words, AUTH_HINT)
    if is_tls_failure(exc):
        return OpsctlError(f"no TLS answer from {name}", words, TLS_HINT)
    return None


Nowhere = Callable[[Sequence[str]], Collection[str]]  # of these silent servers, those that run nowhere


def _on_stderr(text: str) -> None:
    on_stderr(Note(text))


class TopologyLock:
    """Markers held on the servers that granted them; see the module docstring."""

    def __init__(self, connector: Connector, nodes: Sequence[Node], lease: float | None = None) -> None:
        self.connector, self.loaded, self.nodes = connector, connector.loaded, list(nodes)
        self.lease = lease_seconds(os.environ) if lease is None else lease
        self.owner = owner_label()
        self.topology = _UNSAFE.sub("_", self.loaded.spec.name)[:60]
        self.epoch = 0  # 0 while taking it: a marker that grants nothing yet
        self.needed = keeping(len(self.nodes))  # 0: a forced lock that has not reached a majority yet
        # the servers needed is counted over: all, or (taken while the rest ran nowhere) those that ran and each
        # one marked since; forced: needs nothing until it reaches a majority of them all
        self._counted = {n.name for n in self.nodes}
        self._forced = False
        self._stopped: set[str] = set()  # servers this run stopped itself (and did not start since): they run nowhere
        self.held: dict[str, Held] = {}  # node -> its marker connection and my client id there
        self._silent: list[Silent] = []  # connections to nodes that stopped replying
        self._removed: list[str] = []  # nodes whose marker went this round (refused, closed, not granted)
        self.lost: str | None = None
        self._taken_from: Marker | None = None  # a stale marker of a run that was granted, killed when taking it
        self._renewed_at = _now()  # when the last renewal round was sent
        self._confirmed_at = self._renewed_at  # when the last round enough servers confirmed was sent
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lock = threading.Lock()

    def acquire(self, nowhere: Nowhere | None = None, force: bool = False,
                warn: Callable[[str], None] = _on_stderr) -> None:
        """Take the lock (RefusedError, exit 3, when another run holds it or no majority grants it). nowhere: of the
        servers that did not answer, those the provider finds running nowhere, asked only when the grants are too few
        (a first apply, a stopped topology, a scale-out: those servers are marked as they start). force:
        --force-lock, go on with fewer grants, warning so."""
        try:
            self._acquire(nowhere, force, warn)
        except BaseException:
            self.release()
            raise
        self._renewer = threading.Thread(target=self._renew, name="topology-lock", daemon=True)
        self._renewer.start()
        if self._taken_from is not None:
            self._outwait(self._taken_from, warn)

    def _outwait(self, stale: Marker, warn: Callable[[str], None]) -> None:
        """Taken over from a run whose markers went stale (cut off, hung): a change it had under way goes on past
        its loss, so this run renews one lease more before its first change: such a change has a lease to end."""
        warn(f"note: took the topology lock over from {stale.owner}, whose markers went stale: waiting "
             f"{self.lease:.0f}s before the first change, so that a change that run had under way can end")
        try:
            self._stop.wait(self.lease)
            self.check()
        except BaseException:
            self.release()
            raise

    def _acquire(self, nowhere: Nowhere | None, force: bool, warn: Callable[[str], None]) -> None:
        self._renewed_at = self._confirmed_at = _now()
        seen = self._hold_all(self.nodes, CONNECT_TIMEOUT, strict=True)
        live, stale = live_others(seen, self._mine())
        taken = {m.node for m in live}
        tally = Tally(tuple(n for n in self.held if n not in taken), tuple(self.held),
                      tuple(n.name for n in self.nodes))
        if live:
            raise quorum.held_elsewhere(live, tally, self.lease)
        if not tally.enough:
            stopped = nowhere(tally.silent) if nowhere is not None else ()
            if nowhere is not None and quorum.enough_without(tally, stopped):
                # the rest run nowhere: nothing a split could hide; kept over those that ran, as any lock is
                self._counted = set(quorum.counted_without(tally, stopped))
                self.needed = keeping(len(self._counted))
            elif force:
                self._forced, self.needed = True, 0
                warn(quorum.forced_warning(tally))
            else:
                raise quorum.too_few(tally)
        self.epoch = quorum.next_epoch(seen)
        self._taken_from = next((m for m in stale if m.epoch >= 1), None)
        self._removed = []
        self._grant_round(stale)
        if self._removed:  # a marker gone between its set and its grant (Sentinel's CLIENT KILL TYPE normal when it
            # reconfigures a replica after a failover): marked again at once, as a renewal does; a run that took the
            # node since is seen there, and one that ended since ran before this run's first change
            self._mark_unheld(_now() + CONNECT_TIMEOUT, CONNECT_TIMEOUT, set(self._removed))
        self._lose_if_removed()
        self.check()  # a marker removed while it was granted: lost before the first change

    def _mine(self) -> dict[str, str]:
        return {n: h.client_id for n, h in self.held.items()}

    def _hold_all(self, nodes: Sequence[Node], timeout: float, strict: bool) -> list[Marker]:
        """Mark nodes side by side (a 60-node start is marked in one round trip's time, not 60), keep every marker
        set, and return what was listed there: the first refusal is raised only once none of them can be left
        unrecorded. strict (taking the lock): a refusal of opsctl's AUTH, TLS or CLIENT is raised; else (marking
        again while held) it only grants nothing this round."""
        results = fan_out(lambda node: self._marked(node, timeout, strict), nodes)
        seen: list[Marker] = []
        for node, result in zip(nodes, results, strict=True):
            if isinstance(result, Claim):
                self.held[node.name] = result.held
                seen += result.seen
        refusal = next((r for r in results if isinstance(r, OpsctlError)), None)
        if refusal is not None:
            raise refusal
        return seen

    def _marked(self, node: Node, timeout: float, strict: bool) -> Claim | OpsctlError | None:
        """One node marked and listed in one pipelined round trip; None when the node does not answer or grants
        nothing now (-BUSY from a long script, -LOADING: it holds no marker of this run); strict, the refusal when
        it answers but refuses opsctl's AUTH, TLS or CLIENT (unknown or NOPERM)."""
        if not port_accepts(*self.connector.dial(node), timeout=timeout):
            return None
        try:
            pipe = RawPipe(self.connector, node, timeout)
        except PIPE_ERRORS as exc:
            return _answered_but_refused(node.name, exc) if strict else None
        try:
            replies = pipe.call_all([("CLIENT", "ID"), ("CLIENT", "SETNAME", self._name()), ("CLIENT", "LIST")])
            for reply in replies:
                refused(reply, f"{node.name} refused CLIENT")
        except NodeRefused as exc:
            pipe.close()
            hard = strict and _HARD_REFUSAL.match(exc.detail or "")
            return quorum.client_refused(node.name, exc.detail or "") if hard else None
        except PIPE_ERRORS:
            pipe.close()
            return None
        return Claim(Held(pipe, str(replies[0])), quorum.parse_markers(as_text(replies[2]), node.name))

    def _name(self) -> str:
        return marker_name(self.topology, self.epoch, self.owner, self.lease)

    def _grant_round(self, stale: Sequence[Marker]) -> None:
        """Once granted: every held marker renamed with the epoch and the stale markers killed, one pipelined
        round trip per node, all at once. A node that fails here is dropped (marked again by the renewer)."""
        def send(name: str) -> bool:
            kills = [("CLIENT", "KILL", "ID", m.client_id) for m in stale if m.node == name]
            try:
                reply = self.held[name].pipe.call_all([("CLIENT", "SETNAME", self._name()), *kills])[0]
            except PIPE_ERRORS:
                return False
            return not isinstance(reply, RespError)

        for name, ok in zip(list(self.held), fan_out(send, list(self.held)), strict=True):
            if not ok:
                self._drop(name)

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
        unheld = len(self.held) < len(self._running())
        return min(self.lease / 3, RETRY_UNHELD) if unheld else self.lease / 3

    def _renew_once(self) -> None:
        started = _now()
        paused = started - self._renewed_at
        if paused > self.lease:
            self._lose(f"it was paused for {paused:.0f}s, longer than the lock's lease ({self.lease:.0f}s)")
            return
        self._renewed_at = started
        self._removed = []
        self._close_stale()
        # side by side and bounded, so that nodes that do not answer (a split drops packets) cost one timeout
        timeout = min(CONNECT_TIMEOUT, self.lease / 6)
        names = list(self.held)
        for name, ok in zip(names, fan_out(lambda n: self._renamed(n, timeout), names), strict=True):
            if not ok:
                self._drop(name, silent=ok is None)  # a restarted node, or one cut off: marked again once it answers
        self._mark_unheld(_now() + self.lease / 6, timeout)
        if self.lost is not None:
            return
        self._recount()
        if len(self.held) >= self.needed:  # a node marked again this round, no other run's marker there, counts
            self._confirmed_at = started
        self._lose_if_removed()

    def _recount(self) -> None:
        """needed after a round: a lock that reached a majority of all the servers keeps as any; one taken over
        the servers that ran counts each server it marked since; a forced one needs nothing until then."""
        running = self._running()
        if len(self.held) >= majority(len(running)):
            self._counted, self._forced = {n.name for n in running}, False
        elif not self._forced:
            self._counted = (self._counted | set(self.held)) - self._stopped
        self.needed = 0 if self._forced else keeping(len(self._counted))

    def _lose_if_removed(self) -> None:
        """A marker that went at once (a restart, CLIENT KILL, a refused rename) frees its node for other runs at
        once, not one lease later as a silent one does: when that leaves fewer marked than needed, lost now. Not
        with one server: its run's own restart of it would always lose the lock; there another run may hold it from
        the server's stop until this run marks it again once it started (about a second; docs/slots.md)."""
        if self._removed and len(self.held) < self.needed and len(self.nodes) > 1:
            self._lose(f"its marker on {', '.join(sorted(set(self._removed)))} went (a restart, a CLIENT KILL, a "
                       f"refusal), which leaves {len(self.held)} of its {len(self.nodes)} servers marked, fewer "
                       f"than {self.needed}: another run may have taken the lock since")

    def _renamed(self, name: str, timeout: float) -> bool | None:
        """True: renewed; None: no reply in time, or an error reply (-BUSY from a long script): not renewed this
        round, its connection kept open (see _drop); False: closed (the marker went with it)."""
        pipe = self.held[name].pipe
        try:
            pipe.settimeout(timeout)
            refused(pipe.call("CLIENT", "SETNAME", self._name()), f"{name} refused CLIENT SETNAME")
        except (TimeoutError, NodeRefused):
            return None
        except PIPE_ERRORS:
            return False
        return True

    def _running(self) -> list[Node]:
        return [n for n in self.nodes if n.name not in self._stopped]

    def stopping(self, names: Collection[str]) -> None:
        """The run is about to stop these servers itself: they will run nowhere, so they leave the count (a destroy
        that stops most servers keeps its lock) and their markers are withdrawn now, not found gone by a renewal."""
        with self._lock:
            self._stopped |= set(names)
            for name in [n for n in self.held if n in names]:
                self.held.pop(name).pipe.close()
            if self.lost is None:
                self._recount()

    def mark_now(self, names: Collection[str]) -> None:
        """The named servers marked now, as the renewer would at its next round (servers this run just started)."""
        with self._lock:
            self._stopped -= set(names)
            if self.lost is None:
                self._removed = []
                self._mark_unheld(_now() + CONNECT_TIMEOUT, CONNECT_TIMEOUT, names)
            if self.lost is None:
                self._recount()

    def _mark_unheld(self, budget: float, timeout: float, only: Collection[str] | None = None) -> None:
        """Mark the servers this run holds no marker on (restarted, started, back from a split), by the same
        set-then-list round as taking the lock; a server with another run's live marker grants nothing, and loses
        this run its lock when that run was granted it (epoch 1 or more, whatever the epochs compare: one that took
        a restarted node saw no marker there) or this run no longer holds a majority (that run may be granted)."""
        unheld = [n for n in self._running() if n.name not in self.held and (only is None or n.name in only)]
        for first in range(0, len(unheld), WIDTH):
            if _now() > budget:
                return  # the others next round
            live = self._others_on(self._hold_all(unheld[first:first + WIDTH], timeout, strict=False))
            for marker in live:
                if marker.node in self.held:
                    self._drop(marker.node)  # not granted: that run withdraws, or holds it
            for marker in live:
                if marker.epoch >= 1 or len(self.held) < majority(len(self._running())):
                    self._lose(f"{marker.owner} holds {marker.node} (epoch {marker.epoch}, this run's is "
                               f"{self.epoch}), which this run marked again after it (re)started or answered")
                    return

    def _others_on(self, seen: list[Marker]) -> list[Marker]:
        """The live markers of other runs in seen; the stale ones killed, and so are this run's own on a node it
        just marked again (the connection it kept open when the node went silent: not another run's)."""
        old = {(s.node, s.held.client_id) for s in self._silent}
        live, stale = live_others([m for m in seen if (m.node, m.client_id) not in old], self._mine())
        for marker in [*stale, *(m for m in seen if (m.node, m.client_id) in old)]:
            if marker.node in self.held:
                with contextlib.suppress(*PIPE_ERRORS):  # a node gone: dropped at the next renewal
                    self.held[marker.node].pipe.call("CLIENT", "KILL", "ID", marker.client_id)
        return live

    def _drop(self, name: str, silent: bool = False) -> None:
        """Stop counting a node. silent (it did not reply in time): its connection is kept open until the run
        releases its lock, so its marker there goes stale on the server's clock (the timing the invariant counts
        on) instead of vanishing at once when a late close gets through to it."""
        held = self.held.pop(name)
        if silent:
            self._silent.append(Silent(_now(), name, held))
        else:
            self._removed.append(name)
            held.pipe.close()

    def _close_stale(self) -> None:
        """The silent connections whose markers went stale by now (no command reached them since): closed."""
        cutoff = _now() - self.lease - 1
        for entry in [entry for entry in self._silent if entry.since < cutoff]:
            self._silent.remove(entry)
            entry.held.pipe.close()

    def _lose(self, reason: str) -> None:
        """Counted as lost: the markers are withdrawn (a zombie must not refuse the run that took over)."""
        self.lost = reason
        self._close_all()

    def _close_all(self) -> None:
        for name in list(self.held):
            self._drop(name)
        while self._silent:
            self._silent.pop().held.pipe.close()

    def check(self, finished: bool = False) -> None:
        """OpsctlError when this run lost the lock (see the module docstring); called before each change, and
        once the run is done (finished): a loss during its last change is said, not kept quiet."""
        now = _now()
        paused, unconfirmed = now - self._renewed_at, now - self._confirmed_at
        if self.lost is None and paused > self.lease:
            self.lost = f"it was paused for {paused:.0f}s, longer than the lock's lease ({self.lease:.0f}s)"
        elif self.lost is None and unconfirmed > self.lease:
            self.lost = (f"for {unconfirmed:.0f}s (its lease is {self.lease:.0f}s) fewer than {self.needed} of its "
                         f"{len(self.nodes)} servers confirmed it ({len(self.held)} now): the majority may be on "
                         "the other side of a network split")
        if self.lost is not None:
            raise quorum.lost_error(self.lost, finished)

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._lock:
            self._close_all()


_RUNS: weakref.WeakKeyDictionary[Connector, TopologyLock] = weakref.WeakKeyDictionary()  # the lock a run holds
_RUNS_LOCK = threading.Lock()


@contextmanager
def topology_lock(connector: Connector, nodes: Sequence[Node] | None = None, lease: float | None = None,
                  nowhere: Nowhere | None = None, force: bool = False,
                  emit: Emit = on_stderr) -> Iterator[TopologyLock]:
    """Hold the topology's lock for the block (RefusedError, exit 3, when another run holds it or no majority of
    the servers grants it). nodes: the servers that grant it, by default every server of the spec. The run that
    owns connector holds it already: that lock, checked (OpsctlError when lost). nowhere, force (--force-lock): see
    TopologyLock.acquire; its warnings (forced, taken over) are notes to emit."""
    if (outer := _owned(connector)) is not None:
        outer.check()
        yield outer
        return
    lock = TopologyLock(connector, nodes if nodes is not None else connector.loaded.layout.servers, lease)
    lock.acquire(nowhere, force, lambda text: emit(Note(text)))
    with _RUNS_LOCK:
        _RUNS[connector.run] = lock
    try:
        yield lock
        lock.check(finished=True)  # the block ended without an error: was the lock held all through its last step?
    finally:
        with _RUNS_LOCK:
            _RUNS.pop(connector.run, None)
        lock.release()


def _owned(connector: Connector) -> TopologyLock | None:
    """The lock the run that owns connector holds, if any."""
    with _RUNS_LOCK:
        return _RUNS.get(connector.run)


def check_held(connector: Connector) -> None:
    """Before a topology-changing step: OpsctlError when the run that owns connector lost its lock; nothing
    when it holds none (a command that takes no topology lock)."""
    if (lock := _owned(connector)) is not None:
        lock.check()


def mark_started(connector: Connector, names: Collection[str]) -> None:
    """Right after the run that owns connector started these servers (before anything else is done with them): each
    marked at once, not at the renewer's next round, and OpsctlError when another run's live marker is there. Two
    runs that both took the lock while every server ran nowhere are told apart here (docs/slots.md). Nothing when
    the run holds no lock."""
    if (lock := _owned(connector)) is not None:
        lock.mark_now(names)
        lock.check()


def stopping(connector: Connector, names: Collection[str]) -> None:
    """Before the run that owns connector stops these servers itself (destroy, a restart, a scale-in): see
    TopologyLock.stopping. Nothing when the run holds no lock."""
    if (lock := _owned(connector)) is not None:
        lock.stopping(names)
