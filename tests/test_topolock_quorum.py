"""Issue 33 item 7: the topology lock is granted by a strict majority of the servers. Servers that do not answer
(silent: a port nothing listens on, or a server stopped with SIGSTOP, which accepts and never replies, as a split
does) grant nothing: a majority acts, a minority is refused (exit 3, naming the count and --force-lock), and
--force-lock goes on with a warning. A holder that loses its majority loses its lock one lease later; runs started
at once never both hold it; `apply` with most servers silent refuses until --force-lock, while servers the provider
finds stopped (running nowhere) grant no run anything and are left out of the count."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.base.errors import EXIT_REFUSED, OpsctlError, RefusedError
from opsctl.base.poll import wait_for
from opsctl.net.connector import AuthRefused, Connector
from opsctl.net.quorum import Tally, enough_without, keeping, majority, marker_name, next_epoch, parse_markers, too_few
from opsctl.net.topolock import TopologyLock, _answered_but_refused, topology_lock
from opsctl.runtime.opening import make_runtime
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, run
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV, admin_for, free_base_port

RACE = """
import sys
from opsctl.base.errors import RefusedError
from opsctl.net.connector import AuthRefused, Connector
from opsctl.net.topolock import topology_lock
from opsctl.state.specfile import read_spec
connector = Connector(read_spec(sys.argv[1]))
sys.stdin.readline()  # all start together
try:
    with topology_lock(connector) as lock:
        print("held", len(lock.held), flush=True)
        sys.stdin.readline()  # held until the test has counted
except RefusedError as exc:
    print("refused", exc.summary, flush=True)
"""


def test_servers_that_run_nowhere_are_left_out_of_the_majority() -> None:
    """A first apply, a topology destroy stopped, a scale-out's new servers: the provider finds them running
    nowhere, so what answers needs to be a majority of the rest only; a silent server that may run still counts."""
    servers = ("a", "b", "c", "d", "e", "f")
    doubled = Tally(servers[:3], servers[:3], servers)  # 3 run, 3 new ones not deployed yet
    assert not doubled.enough and doubled.silent == ("d", "e", "f")
    assert enough_without(doubled, {"d", "e", "f"}) and enough_without(doubled, {"e", "f"})  # 3 of 4
    assert not enough_without(doubled, set())  # 3 of 6: the silent ones may run on the other side
    assert enough_without(Tally((), (), servers), servers)  # nothing runs: nothing to split
    assert not enough_without(Tally((), (), servers), servers[:5])
    assert enough_without(Tally(("a",), ("a", "b"), servers[:3]), {"c"}) is False  # b answered and refused: it counts


def test_a_majority_takes_it_and_the_servers_left_are_no_majority() -> None:
    assert [majority(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]
    assert [keeping(n) for n in range(1, 8)] == [1, 1, 2, 2, 3, 3, 4]
    for total in range(1, 100):  # what a holder keeps leaves no majority to another run, and two majorities meet
        assert total - keeping(total) < majority(total) and 2 * majority(total) > total
    servers = ("a", "b", "c", "d", "e", "f")
    assert Tally(servers[:4], servers[:4], servers).enough and not Tally(servers[:3], servers[:5], servers).enough
    refused = too_few(Tally(servers[:2], servers[:3], servers))
    assert refused.exit_code == EXIT_REFUSED
    assert "2 of 6 servers granted it (a majority is 4); 3 answered" in refused.detail
    assert "no answer from d, e, f" in refused.detail and "other side of a network split" in refused.detail
    assert "--force-lock" in refused.hint
    listing = "\n".join(f"id={i} name={marker_name('t1', epoch, 'o@h/pid1', 30)} idle={idle}"
                        for i, (epoch, idle) in enumerate([(3, 0), (7, 99), (0, 0)]))
    assert next_epoch(parse_markers(listing, "a")) == 8  # stale ones count: the run it takes over from
    assert next_epoch([]) == 1


def test_a_server_that_refuses_the_password_or_tls_is_said_so_not_counted_as_silent() -> None:
    """Counted as silent, a wrong password read as a split: `a majority ... does not answer`, exit 3."""
    auth = _answered_but_refused("n1", AuthRefused("n1 refused opsctl's AUTH", "-WRONGPASS invalid username-password"))
    assert auth is not None and auth.summary == "authentication failed for n1" and "auth.password" in auth.hint
    assert auth.exit_code == 1
    tls = _answered_but_refused("n1", ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"))
    assert tls is not None and tls.summary == "no TLS answer from n1" and "tls.enabled" in tls.hint
    assert _answered_but_refused("n1", ConnectionRefusedError(111, "Connection refused")) is None
    assert _answered_but_refused("n1", TimeoutError("timed out")) is None


def _silent(loaded: LoadedSpec, count: int) -> list[Node]:
    """Servers that do not answer: ports on the first server's address that nothing listens on."""
    first = loaded.layout.servers[0]
    base = free_base_port([first.address], count, bus=False)
    return [replace(first, name=f"silent{i}", port=base + i) for i in range(count)]


def _owners(loaded: LoadedSpec) -> set[str]:
    owners: set[str] = set()
    for node in loaded.layout.servers:
        with admin_for(loaded, node) as admin:
            owners |= {m.owner for m in parse_markers(str(admin.call("CLIENT", "LIST")), node.name) if m.live}
    return owners


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_majority_acts_a_minority_is_refused_and_force_lock_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """Three servers answer of five (a majority), then of six (none); then the same with real servers stopped."""
    with deployed(tmp_path, capsys, "replication", flavor) as (spec, loaded):
        servers, silent = loaded.layout.servers, _silent(loaded, 3)
        with topology_lock(Connector(loaded), [*servers, *silent[:2]], lease=4.0) as lock:
            assert sorted(lock.held) == sorted(n.name for n in servers)
            assert lock.epoch == 1 and lock.needed == 3  # of 5: the two others are no majority
            with pytest.raises(RefusedError, match="another opsctl run holds this topology") as held, \
                    topology_lock(Connector(loaded)):
                pytest.fail("a second run took a held lock")
            assert f"{lock.owner}" in held.value.summary and "epoch 1" in held.value.detail
            assert "0 of 3 servers granted it" in held.value.detail
            lock.check()

        with pytest.raises(RefusedError, match="a majority of its servers does not answer") as refused, \
                topology_lock(Connector(loaded), [*servers, *silent], lease=4.0):
            pytest.fail("a minority took the lock")
        assert "3 of 6 servers granted it (a majority is 4); 3 answered" in refused.value.detail
        assert "no answer from silent0, silent1, silent2" in refused.value.detail
        assert "--force-lock" in refused.value.hint
        assert not _owners(loaded)  # withdrawn

        capsys.readouterr()
        with topology_lock(Connector(loaded), [*servers, *silent], lease=4.0, force=True) as forced:
            warned = capsys.readouterr().err
            assert "warning: --force-lock" in warned and "3 of 6 servers granted it" in warned, warned
            assert "another opsctl run may act there at the same time" in warned
            assert len(forced.held) == 3 and forced.needed == 0
            assert _owners(loaded) == {forced.owner}
            forced.check()
            with pytest.raises(RefusedError, match="another opsctl run holds this topology"), \
                    topology_lock(Connector(loaded), force=True):  # --force-lock never passes a live marker
                pytest.fail("--force-lock took a held lock")

        # most servers stopped, which the provider sees (no process): they grant no run anything, so the one that
        # answers is a majority of the rest and apply starts them without --force-lock
        rt = make_runtime(loaded)
        try:
            for node in servers[1:]:
                rt.provider.stop(node)
        finally:
            rt.provider.close()
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and "--force-lock" not in err, err + out
        # most servers silent while their processes run (stalled, or cut off as a split does): refused, naming
        # --force-lock, and nothing is stopped or started
        rt = make_runtime(loaded)
        try:
            pids = [rt.provider.process_state(node).pid for node in servers[1:]]
        finally:
            rt.provider.close()
        assert all(pids), pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert code == 3 and "1 of 3 servers granted it (a majority is 2)" in err and "--force-lock" in err, err
        assert "Traceback" not in err and "stopped" not in out, err + out
        assert wait_for(lambda: run(capsys, "status", "-f", str(spec))[0] == 0 or None, CONDITION_BOUND,
                        "healthy again")


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_holder_that_loses_its_majority_stops_before_its_next_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """Two of three servers stop answering (SIGSTOP: connections open, no reply, as across a split): within one
    lease the holder counts its lock lost, before their markers go stale there and another run could take them."""
    with deployed(tmp_path, capsys, "replication", flavor) as (_spec, loaded):
        rt = make_runtime(loaded)
        pids = [rt.provider.process_state(n).pid for n in loaded.layout.servers[1:]]
        rt.provider.close()
        assert all(pids)
        lock = TopologyLock(Connector(loaded), loaded.layout.servers, lease=2.0)
        lock.acquire()
        try:
            for pid in pids:
                os.kill(pid or 0, signal.SIGSTOP)

            def lost() -> str | None:
                try:
                    lock.check()
                except OpsctlError as exc:
                    return exc.summary
                return None

            summary = wait_for(lost, CONDITION_BOUND, "the lock to count itself lost", interval=0.05)
            assert "fewer than 2 of its 3 servers confirmed it" in summary, summary
            assert "the majority may be on the other side of a network split" in summary
        finally:
            for pid in pids:
                os.kill(pid or 0, signal.SIGCONT)
            lock.release()


@pytest.mark.integration
def test_runs_started_at_once_from_other_state_dirs_never_both_hold_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four runs, released together, three times: at most one holds the lock; every other is refused."""
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, _loaded):
        env = {**os.environ, PASSWORD_ENV: PASSWORD}
        for _ in range(3):
            runs = [subprocess.Popen([sys.executable, "-c", RACE, str(spec)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True) for _ in range(4)]
            try:
                for proc in runs:
                    assert proc.stdin is not None
                    proc.stdin.write("go\n")
                for proc in runs:
                    assert proc.stdin is not None
                    proc.stdin.flush()
                said = [proc.stdout.readline().strip() for proc in runs if proc.stdout is not None]
                for proc in runs:
                    assert proc.stdin is not None
                    proc.stdin.close()
                    assert proc.wait(30) == 0
            finally:
                for proc in runs:
                    proc.kill()
                    proc.wait()
            holders = [line for line in said if line.startswith("held")]
            assert len(holders) <= 1 and all(line == "held 3" for line in holders), said
            assert all(line.startswith("refused another opsctl run holds this topology") for line in said
                       if not line.startswith("held")), said
