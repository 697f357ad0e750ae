"""Review 2 of the topology lock (issue 33 item 7), its safety and liveness: a marker that goes at once (a restart,
CLIENT KILL) loses the holder its lock at once, not one lease later, and a run that took a node while the holder's
marker was gone is never outranked by epochs; a lock taken while some servers ran nowhere keeps as any lock over the
servers that ran; a negative idle (the server's wall clock stepped back) is a live marker; the lease clock counts a
system suspend; a long Lua script on one node does not lose a lock the others keep.
Two TopologyLock objects in one process stand for two runs; a patched _renamed/_marked stands for one side of a
split (the nodes it names do not answer that run)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.base.poll import wait_for
from opsctl.net.connector import Connector
from opsctl.net.quorum import parse_markers
from opsctl.net.topolock import TopologyLock, mark_started, stopping, topology_lock
from opsctl.runtime.opening import make_runtime
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed
from tests.support import CONDITION_BOUND, admin_for, free_base_port, make_spec, write_spec


def _lost(lock: TopologyLock) -> str | None:
    try:
        lock.check()
    except OpsctlError as exc:
        return exc.summary
    return None


@contextmanager
def _held(loaded: LoadedSpec, nodes: list[Node] | None = None, lease: float = 6.0,
          nowhere: Callable[[list[str]], Collection[str]] | None = None) -> Iterator[TopologyLock]:
    lock = TopologyLock(Connector(loaded), nodes if nodes is not None else loaded.layout.servers, lease=lease)
    lock.acquire(None if nowhere is None else lambda names: nowhere(list(names)))
    try:
        yield lock
    finally:
        lock.release()


def _cut_off(lock: TopologyLock, names: Collection[str], unmarkable: Collection[str] = ()) -> None:
    """This run's side of a split: the named nodes no longer answer it (its renewals and new markings time out);
    unmarkable: nodes it cannot mark again either (a connection it holds there still tells it of a close)."""
    renamed, marked = lock._renamed, lock._marked
    lock._renamed = lambda name, timeout: None if name in names else renamed(name, timeout)  # type: ignore[method-assign]
    lock._marked = (lambda node, timeout, strict:  # type: ignore[method-assign]
                    None if node.name in {*names, *unmarkable} else marked(node, timeout, strict))


def _kill_marker(loaded: LoadedSpec, lock: TopologyLock, node: Node) -> None:
    """What the node's restart does to the run's marker there: its connection closed by the server."""
    with admin_for(loaded, node) as admin:
        admin.call("CLIENT", "KILL", "ID", lock.held[node.name].client_id)


def test_a_negative_idle_is_a_live_marker() -> None:
    """CLIENT LIST's idle is the server's wall clock: stepped back, it is negative. Before: the marker was ignored
    (`idle.isdigit()`), so a live holder's lock read as free on that host."""
    listing = "id=7 addr=127.0.0.1:5 name=opsctl-lock:t1:3:o@h/pid1:30 idle=-2 flags=N\nid=8 name=x idle=abc"
    markers = parse_markers(listing, "a")
    assert [(m.idle, m.epoch, m.client_id, m.live) for m in markers] == [(0, 3, "7", True)]
    assert parse_markers("id=9 name=opsctl-lock:t1:3:o@h/pid1:30 idle=1-2", "a") == []


def test_the_lease_counts_a_system_suspend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A laptop closed mid-apply: CLOCK_MONOTONIC stands still, CLOCK_BOOTTIME goes on. Before: time.monotonic(),
    so an hour's suspend was no pause."""
    if getattr(time, "CLOCK_BOOTTIME", None) is None:
        pytest.skip("no CLOCK_BOOTTIME on this system: the lock counts on monotonic")
    loaded = read_spec(write_spec(tmp_path, make_spec("replication")))  # nothing runs on its ports
    lock = TopologyLock(Connector(loaded), loaded.layout.servers, lease=2.0)
    lock.acquire(lambda names: names)
    try:
        lock._stop.set()  # no renewal: the check alone
        assert lock._renewer is not None
        lock._renewer.join()
        lock.check()
        real = time.clock_gettime
        monkeypatch.setattr(time, "clock_gettime",
                            lambda clock: real(clock) + (3600 if clock == time.CLOCK_BOOTTIME else 0))
        assert "it was paused for 3600s" in (_lost(lock) or "")
    finally:
        lock.release()


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_marker_gone_at_once_loses_the_lock_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       flavor: str) -> None:
    """One server: the run's marker killed (what the server's restart does), a second run takes the lock at once
    (the node has no marker) with epoch 1, the first one's epoch too. Before: the first run dropped the node and
    kept its lock for a whole lease (`epoch > self.epoch` only), both holding it."""
    with deployed(tmp_path, capsys, "standalone", flavor, hosts=1) as (_spec, loaded):
        node = loaded.layout.servers[0]
        with _held(loaded) as first:
            _kill_marker(loaded, first, node)
            with _held(loaded) as second:
                assert second.epoch == first.epoch == 1 and list(second.held) == [node.name]
                summary = wait_for(lambda: _lost(first), first.lease - 1.5, "the first run to count its lock lost",
                                   interval=0.05)
                assert f"holds {node.name} (epoch 1" in summary, summary
                second.check()
                assert not first.held  # withdrawn: it refuses no one


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_marker_killed_while_the_lock_is_taken_is_marked_again(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 flavor: str) -> None:
    """Three servers, one out of reach: between marking the two others and granting them, one's marker is killed as
    Sentinel kills a replica's clients when it reconfigures it after a failover (CLIENT KILL TYPE normal). The node
    is marked again at once and the lock held (2 of 3). Before: the grant round dropped it, leaving 1 of 3, and the
    run lost its lock before its first change (the healing apply after a Sentinel failover, loaded CI)."""
    with deployed(tmp_path, capsys, "replication", flavor) as (_spec, loaded):
        servers = loaded.layout.servers
        lock = TopologyLock(Connector(loaded), servers, lease=6.0)
        _cut_off(lock, {servers[0].name})
        grant = lock._grant_round

        def killed_first(stale: object) -> None:
            with admin_for(loaded, servers[2]) as admin:
                admin.call("CLIENT", "KILL", "TYPE", "normal")
            grant(stale)  # type: ignore[arg-type]

        lock._grant_round = killed_first  # type: ignore[method-assign,assignment]
        lock.acquire()
        try:
            lock.check()
            assert sorted(lock.held) == sorted(n.name for n in servers[1:]) and lock.epoch >= 1
            with admin_for(loaded, servers[2]) as admin:
                mine = [m for m in parse_markers(str(admin.call("CLIENT", "LIST")), servers[2].name) if m.live]
            assert [(m.client_id, m.epoch) for m in mine] == [(lock.held[servers[2].name].client_id, lock.epoch)]
        finally:
            lock.release()


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_markers_gone_or_cut_off_and_a_lock_taken_beside_new_servers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """Three servers. (1) One marker killed and another node cut off, with the killed one out of reach too: fewer
    than 2 of 3 keep it, one of them gone at once: lost within a renewal, not a lease (before: a lease).
    (2) Three new servers that run nowhere (a scale-out): granted by the 3 that run, and kept over them; cut off
    from 2 of them, lost within a lease (before: needed was 0, so it was never lost to a split)."""
    with deployed(tmp_path, capsys, "replication", flavor) as (_spec, loaded):
        servers = loaded.layout.servers
        with _held(loaded) as lock:
            assert lock.needed == 2
            _cut_off(lock, {servers[1].name}, unmarkable={servers[2].name})
            _kill_marker(loaded, lock, servers[2])
            summary = wait_for(lambda: _lost(lock), lock.lease - 1.5, "the lock lost at once", interval=0.05)
            assert f"its marker on {servers[2].name} went" in summary and "fewer than 2" in summary, summary

        first = servers[0]
        base = free_base_port([first.address], 3, bus=False)
        new = [replace(first, name=f"new{i}", port=base + i) for i in range(3)]
        with _held(loaded, [*servers, *new], lease=4.0, nowhere=lambda names: names) as lock:
            assert len(lock.held) == 3 and lock.needed == 2  # kept over the 3 that ran
            _cut_off(lock, {servers[1].name, servers[2].name})
            summary = wait_for(lambda: _lost(lock), lock.lease + 4, "the lock lost to a split", interval=0.05)
            assert "fewer than 2 of its 6 servers confirmed it" in summary, summary


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_long_script_on_one_node_keeps_the_lock_the_others_confirm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """EVAL "while true do end" past busy-reply-threshold on one of three servers: CLIENT answers -BUSY there.
    On Redis the node grants nothing meanwhile; the two others keep the lock past a whole lease, and once the script is
    killed the node is marked again (the run's own old marker there killed, not read as another run's). Before:
    the -BUSY of marking again was a refusal that lost the lock."""
    with deployed(tmp_path, capsys, "replication", flavor) as (_spec, loaded):
        busy = loaded.layout.servers[2]
        with admin_for(loaded, busy) as admin:
            admin.config_set("busy-reply-threshold", "100")  # lua-time-limit before 7.0
        with _held(loaded, lease=3.0) as lock:
            script = threading.Thread(target=_spin, args=(loaded, busy), daemon=True)
            script.start()
            try:
                wait_for(lambda: _busy(loaded, busy), CONDITION_BOUND,
                         "the script running past the threshold", interval=0.05)
                since, dropped = lock._renewed_at, set()

                def a_lease_confirmed() -> bool | None:
                    dropped.update({busy.name} - set(lock.held))
                    return lock._confirmed_at > since + lock.lease + 0.5 or None

                wait_for(a_lease_confirmed, 3 * lock.lease, "a lease of confirmed rounds", interval=0.05)
                lock.check()
                # the premise on Redis 7.0; Valkey 9 lets CLIENT through a busy script (it grants on)
                assert dropped == ({busy.name} if flavor == "redis" else set()), dropped
            finally:
                _kill_script(loaded, busy)
                script.join(10)
            wait_for(lambda: busy.name in lock.held or None, CONDITION_BOUND, "the node marked again", interval=0.05)
            lock.check()
            with admin_for(loaded, busy) as admin:
                mine = [m for m in parse_markers(str(admin.call("CLIENT", "LIST")), busy.name) if m.live]
            assert [m.client_id for m in mine] == [lock.held[busy.name].client_id], mine


def _spin(loaded: LoadedSpec, node: Node) -> None:
    with admin_for(loaded, node, timeout=120) as admin, suppress(Exception):  # ends killed: an error reply
        admin.call("EVAL", "while true do end", "0")


def _busy(loaded: LoadedSpec, node: Node) -> bool | None:
    with admin_for(loaded, node) as admin:
        try:
            admin.call("PING")
        except Exception as exc:
            return "BUSY" in str(exc) or None
    return None


def _kill_script(loaded: LoadedSpec, node: Node) -> None:
    def killed() -> bool | None:
        with admin_for(loaded, node) as admin:
            try:
                admin.call("SCRIPT", "KILL")
            except Exception as exc:  # NOTBUSY: no script runs (any more)
                return "NOTBUSY" in str(exc) or None
            return True
    wait_for(killed, CONDITION_BOUND, "the script killed", interval=0.1)


def _answers(loaded: LoadedSpec, node: Node) -> bool | None:
    try:
        with admin_for(loaded, node, timeout=1.0) as admin:
            return admin.call("PING") is not None or None
    except Exception:  # not up yet (refused, or loading)
        return None


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_runs_own_stops_leave_the_count_and_a_started_server_is_marked_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """(1) A run that stops 2 of 3 servers itself (destroy, a scale-in) keeps its lock past a lease: they run
    nowhere (before: its own stops counted against it). (2) Every server stopped: two runs both take the lock (the
    limit docs/slots.md names); the first to start a server marks it at once, and the other, marking it, loses its
    lock (before: marked only at a renewer's round, whichever came first)."""
    with deployed(tmp_path, capsys, "replication", flavor) as (_spec, loaded):
        servers, rt = loaded.layout.servers, make_runtime(loaded)
        try:
            first = Connector(loaded)
            with topology_lock(first, lease=3.0) as lock:
                stopping(first, [n.name for n in servers[1:]])
                for node in servers[1:]:
                    rt.provider.stop(node)
                assert list(lock.held) == [servers[0].name] and lock.needed == 1
                since = lock._renewed_at
                wait_for(lambda: lock._confirmed_at > since + lock.lease + 0.5 or None, 3 * lock.lease,
                         "a lease of confirmed rounds", interval=0.05)
                lock.check()
                for node in servers[1:]:
                    rt.provider.start(node)
                for node in servers[1:]:
                    wait_for(lambda n=node: _answers(loaded, n), CONDITION_BOUND, f"{node.name} answering")
                mark_started(first, [n.name for n in servers[1:]])
                assert len(lock.held) == 3 and lock.needed == 2

            rt.provider.stop(servers[0])
            for node in servers[1:]:
                rt.provider.stop(node)
            second = Connector(loaded)
            with topology_lock(first, nowhere=lambda names: names) as a:
                with pytest.raises(OpsctlError, match="lost the topology lock") as lost, \
                        topology_lock(second, nowhere=lambda names: names) as b:
                    for lock in (a, b):  # the renewers stand still: only the marking at start is seen
                        lock._stop.set()
                        assert lock._renewer is not None
                        lock._renewer.join()
                    assert not a.held and not b.held and a.needed == b.needed == 0
                    rt.provider.start(servers[0])
                    wait_for(lambda: _answers(loaded, servers[0]), CONDITION_BOUND, "the server answering")
                    mark_started(first, [servers[0].name])
                    assert list(a.held) == [servers[0].name]
                    mark_started(second, [servers[0].name])
                a.check()
            assert f"holds {servers[0].name} (epoch 1" in lost.value.summary, lost.value.summary
        finally:
            rt.provider.close()


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_run_that_takes_over_stale_markers_waits_a_lease_before_its_first_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """A holder hangs (its renewer stopped: its markers go stale, its connections stay open, a step of it may still
    be under way). The run that takes over kills the stale markers and renews a whole lease before it returns, so
    such a step has a lease to end. Before: it returned at once (a margin of about 0 s)."""
    with deployed(tmp_path, capsys, "standalone", flavor, hosts=1) as (_spec, loaded):
        node = loaded.layout.servers[0]
        with _held(loaded, lease=3.0) as hung:
            hung._stop.set()
            assert hung._renewer is not None
            hung._renewer.join()

            def stale() -> bool | None:
                with admin_for(loaded, node) as admin:
                    seen = parse_markers(str(admin.call("CLIENT", "LIST")), node.name)
                return any(m.owner == hung.owner and not m.live for m in seen) or None

            wait_for(stale, CONDITION_BOUND, "the hung run's marker stale", interval=0.1)
            taker, said = TopologyLock(Connector(loaded), loaded.layout.servers, lease=3.0), []
            began = time.monotonic()
            taker.acquire(warn=said.append)
            try:
                assert time.monotonic() - began >= taker.lease, said
                assert len(said) == 1 and f"took the topology lock over from {hung.owner}" in said[0], said
                assert "waiting 3s before the first change" in said[0], said
                taker.check()
                assert list(taker.held) == [node.name] and taker.epoch == 2
            finally:
                taker.release()
