"""A lost topology lock is never kept quiet: a run that loses it during its last step fails saying so (it used
to report success), and `tls rotate` checks it before each node (it reloaded every node whatever happened)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from opsctl.apply.tls_rotation import rotate
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Event
from opsctl.migrate.cutover import CutoverOptions, check_locks, cut_over
from opsctl.migrate.migration import MigrateOptions, _watch
from opsctl.migrate.shard import ShardRun
from opsctl.net.connector import Connector
from opsctl.net.quorum import LEASE_ENV
from opsctl.net.topolock import topology_lock
from opsctl.runtime.opening import make_runtime
from opsctl.slots.fix import _close_entry, _demote, _unassign, claim
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec

pytestmark = pytest.mark.integration
LEASE = "6"  # the shortest $OPSCTL_LOCK_LEASE: the pause test waits one lease


def test_a_run_that_loses_its_lock_during_its_last_step_says_so(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A restart of one node has one step; the run is paused (SIGSTOP) past its lease while it runs, so another
    run could have taken the topology meanwhile. Before: exit 0, 'Restarted'. Said as a loss during the step when
    the pause came before the restarted node was marked, else as one that overlapped its last change."""
    with deployed(tmp_path, capsys, "standalone", "valkey", hosts=1) as (spec, _loaded):
        env = {**os.environ, PASSWORD_ENV: PASSWORD, LEASE_ENV: LEASE}
        restart = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "restart", "-f", str(spec),
                                    "--auto-approve", "--allow-downtime"],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert restart.stderr is not None
            seen = []
            for line in restart.stderr:
                seen.append(line)
                if "[1/1]" in line:
                    break
            restart.send_signal(signal.SIGSTOP)
            # the fault's duration, so a sleep: the run stopped past its lease. Not waited for by its marker: the one
            # node is mid-restart, down or freshly started, and holds none
            time.sleep(float(LEASE) + 1.5)
            restart.send_signal(signal.SIGCONT)
            err = "".join(seen) + restart.stderr.read()
            assert restart.wait(60) == 1, err
        finally:
            restart.kill()
            restart.wait()
        assert "this run lost the topology lock: it was paused for" in err, err
        # the pause is caught once the node started (the step marks it, checking the lock) or at the end
        assert ("its last change overlapped the loss" in err or "failed: this run lost the topology lock" in err), err
        assert "Traceback" not in err, err


def test_tls_rotate_checks_the_lock_before_each_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The run is counted as paused past its lease right after its first node reloaded: no other node is
    touched, and the error says the lock was lost."""
    with deployed(tmp_path, capsys, "replication", "redis", tls={"enabled": True, "generate": True}) as (spec, _):
        rt = make_runtime(read_spec(spec))
        said: list[str] = []
        try:
            with pytest.raises(OpsctlError, match="lost the topology lock") as lost, \
                    topology_lock(rt.connector, lease=30.0) as lock:

                def say(note: Event) -> None:  # rotate's notes: one line per node reloaded
                    said.append(note.line())
                    lock._renewed_at -= 60  # what a SIGSTOP of a minute looks like to the lock

                rotate(rt, "certs", say)
        finally:
            rt.provider.close()
        assert len(said) == 1 and ": reloaded, presents" in said[0], said
        assert "before its next change" in (lost.value.detail or "")


@contextmanager
def _lost_lock(tmp_path: Path) -> Iterator[Connector]:
    """Without servers: a run's connector whose lock counts itself lost (what a SIGSTOP of a minute looks like),
    and ends held (the block's end would say the loss again)."""
    loaded = read_spec(write_spec(tmp_path, make_spec("replication")))  # nothing runs on its ports
    connector = Connector(loaded)
    with topology_lock(connector, lease=6.0, nowhere=lambda names: names) as lock:
        lock._stop.set()
        assert lock._renewer is not None
        lock._renewer.join()
        lock._renewed_at -= 60
        yield connector
        lock.lost = None
        lock._renewed_at += 60


def test_migrate_checks_the_lock_while_it_streams_and_before_its_fence(tmp_path: Path) -> None:
    """A lost lock stops each look at the lag, each batch a shard writes to the target, and the cutover before it
    fences the source. Before: migrate never checked it (hours of writes, then the fence)."""
    with _lost_lock(tmp_path) as connector:
        target = SimpleNamespace(connector=connector)
        shard = ShardRun("shard-0", [], connector, lambda: None, None, tmp_path, 0, 0.0,  # type: ignore[arg-type]
                         check_locks=partial(check_locks, connector, connector))
        for step in (lambda: _watch(connector, target, [], [], tmp_path, MigrateOptions(), print, None),
                     lambda: cut_over(connector, target, [], lambda: None, CutoverOptions(), None),
                     lambda: shard._copied(10)):
            with pytest.raises(OpsctlError, match="lost the topology lock"):
                step()


def test_cluster_fix_checks_the_lock_before_each_change(tmp_path: Path) -> None:
    """Closing a journaled move, merging a split shard (demote), claiming and unassigning slots: each stops on a
    lost lock before touching a node. Before: only when the lock was taken."""
    with _lost_lock(tmp_path) as connector:
        session = SimpleNamespace(connector=connector)
        for step in (lambda: _close_entry(session, None, None, print, True), lambda: _demote(session, None, None),
                     lambda: claim(session, None, [1]), lambda: _unassign(session, None, [1])):
            with pytest.raises(OpsctlError, match="lost the topology lock"):
                step()
