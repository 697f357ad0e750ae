"""`opsctl failover --mode force` in a replication topology whose master is gone (SIGKILL): the replica holding the
most is promoted, the others follow it, `opsctl apply` brings the old master back as its replica. The writer is
the referee: what is lost is only what the dead master acknowledged and no replica had received (asynchronous
replication's window, measured here)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from opsctl.base.poll import wait_for
from opsctl.failover.actions import KILL_AT
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, admin_for, cluster_check
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration


def _client(loaded: LoadedSpec, name: str) -> redis.Redis:
    node = loaded.layout.node(name)
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=2.0,
                       decode_responses=True)


def _kill(tmp_path: Path, loaded: LoadedSpec, name: str) -> None:
    os.kill(int((tmp_path / ".opsctl" / loaded.spec.name / name / "server.pid").read_text()), signal.SIGKILL)


def _gone(pid: int) -> bool:
    """The process exited (a zombie counts: its parent here is the test, which started the servers)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def _links_down(loaded: LoadedSpec, *names: str) -> None:
    """Until each replica has seen its master's link go down (what the failover's checks read)."""
    wait_for(lambda: all(_client(loaded, n).info("replication")["master_link_status"] == "down" for n in names)
             or None, CONDITION_BOUND, f"{', '.join(names)} to see the master's link down")


def _role(loaded: LoadedSpec, name: str) -> str:
    role = _client(loaded, name).execute_command("ROLE")
    return str(role[0]) if role[0] == "master" else f"{role[0]}:{role[2]}"


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_master_is_replaced_by_the_replica_holding_the_most(tmp_path, capsys, flavor: str) -> None:
    with deployed(tmp_path, capsys, "replication", flavor) as (spec, loaded):
        shard = loaded.layout.shards[0]
        old, (first, second) = shard.master, shard.replicas
        with Writer(lambda: _client(loaded, old)) as writer:
            writer.wait_for_writes(500)
            killed_at = time.monotonic()
            _kill(tmp_path, loaded, old)
            _links_down(loaded, first, second)
        failover = ("failover", "-f", str(spec), "--shard", "1")

        code, out, err = run(capsys, *failover, "--yes")
        assert code == 3 and "[FAIL] master-reachable" in out and "--mode force --yes" in out, out + err
        code, out, err = run(capsys, *failover, "--yes", "--force-checks")  # nothing linked: nothing to hand over
        assert code == 3 and "no replica to promote" in err and "--mode force --yes" in err, out + err
        assert "internal error" not in err
        code, out, err = run(capsys, *failover, "--mode", "takeover", "--yes")
        assert code == 1 and "--mode takeover is not for a replication topology" in err, out + err
        code, out, err = run(capsys, *failover, "--mode", "force", "--dry-run")
        assert code == 0 and "[pass] master-down" in out and "would: REPLICAOF NO ONE" in out, out + err
        assert [_role(loaded, n) for n in (first, second)] == ["slave:" + str(loaded.layout.node(old).port)] * 2

        code, out, err = run(capsys, *failover, "--mode", "force", "--yes", "--report", str(tmp_path / "r.json"))
        assert code == 0, out + err
        report = json.loads((tmp_path / "r.json").read_text())
        new = report["new_master"]
        assert report["outcome"] == "succeeded" and report["attempts"][0]["mode"] == "promote"
        assert new in (first, second) and _role(loaded, new) == "master"
        other = first if new == second else second
        assert _role(loaded, other) == f"slave:{loaded.layout.node(new).port}"
        assert PASSWORD not in out + err + (tmp_path / "r.json").read_text()

        lost = writer.lost(_client(loaded, new))
        acked_at = dict(zip(writer.acked, writer.ack_times, strict=True))
        # the window: what the master acknowledged in its last moment and had not streamed yet (loopback: ms)
        assert all(killed_at - acked_at[key] < 0.5 for key, _ in lost), lost[:5]
        with capsys.disabled():
            print(f"\n{flavor}: {len(lost)} of {len(writer.acked)} acknowledged writes lost to the kill")

        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert _role(loaded, old) == f"slave:{loaded.layout.node(new).port}"
        assert plan_json(capsys, spec)["steps"] == []
        sizes = {n: _client(loaded, n).dbsize() for n in shard.members}
        assert len(set(sizes.values())) == 1, sizes


def test_a_promotion_killed_after_its_replicaof_is_finished_by_apply(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        shard = loaded.layout.shards[0]
        master = _client(loaded, shard.master)
        master.mset({f"k:{i}": i for i in range(200)})
        assert master.execute_command("WAIT", len(shard.replicas), 10000) == len(shard.replicas)
        _kill(tmp_path, loaded, shard.master)
        killed = subprocess.run([sys.executable, "-m", "opsctl.cli.main", "failover", "-f", str(spec), "--shard", "1",
                                 "--mode", "force", "--yes"], env={**os.environ, KILL_AT: "promoted"},
                                capture_output=True, text=True, timeout=120, check=False)
        assert killed.returncode == -9, killed.stdout + killed.stderr
        promoted = [n for n in shard.replicas if _role(loaded, n) == "master"]
        assert len(promoted) == 1

        code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--mode", "force", "--yes")
        assert code == 3 and "[FAIL] master-down" in out and "`opsctl apply` points the others" in out, out + err
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        port = loaded.layout.node(promoted[0]).port
        assert {n: _role(loaded, n) for n in shard.members if n != promoted[0]} == \
            {n: f"slave:{port}" for n in shard.members if n != promoted[0]}
        assert plan_json(capsys, spec)["steps"] == []
        assert {_client(loaded, n).dbsize() for n in shard.members} == {200}


def test_a_cluster_master_that_is_gone_is_replaced_by_force(tmp_path, capsys) -> None:
    """The cluster did not fail over by itself (here: its replica has cluster-replica-no-failover, as one cut off
    past its validity factor would refuse): --mode force promotes it without a link to the dead master."""
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        shard = loaded.layout.shards[1]
        old, replica = shard.master, shard.replicas[0]
        with admin_for(loaded, loaded.layout.node(replica)) as admin:
            admin.call("CONFIG", "SET", "cluster-replica-no-failover", "yes")
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(500)
            killed_at = time.monotonic()
            _kill(tmp_path, loaded, old)
            _links_down(loaded, replica)
            code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "2", "--yes")
            assert code == 3 and "[FAIL] target-linked" in out and "--mode force --yes" in out, out + err
            code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "2", "--mode", "force", "--yes")
            assert code == 0 and "[pass] most-data" in out and f"({old} left out" in out, out + err
            writer.wait_for_writes(len(writer.acked) + 300)
        lost = writer.lost(cluster_client(loaded))
        acked_at = dict(zip(writer.acked, writer.ack_times, strict=True))
        assert all(killed_at - acked_at[key] < 0.5 for key, _ in lost), lost[:5]
        check = cluster_check(loaded.layout.node(replica).endpoint)
        assert check.returncode == 0, check.stdout + check.stderr
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert _role(loaded, old) == f"slave:{loaded.layout.node(replica).port}"
        check = cluster_check(loaded.layout.node(old).endpoint)
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_stalled_master_is_stopped_before_its_replica_is_promoted(tmp_path, capsys) -> None:
    """Silent is not dead: a master stalled (SIGSTOP) that resumed after the promotion would be a second master
    taking writes. While its replicas heard from it within its ping period (6 s here, 2 s of grace) it may run,
    cut off from opsctl only: refused, --force-checks or not. After that, the forced promotion stops its process
    through the provider first."""
    with deployed(tmp_path, capsys, "replication", "redis", config={"repl-ping-replica-period": 6}) as (spec, loaded):
        shard = loaded.layout.shards[0]
        master = _client(loaded, shard.master)
        master.mset({f"k:{i}": i for i in range(100)})
        assert master.execute_command("WAIT", len(shard.replicas), 10000) == len(shard.replicas)
        pid = int((tmp_path / ".opsctl" / loaded.spec.name / shard.master / "server.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--mode", "force", "--yes",
                                 "--force-checks")
            assert code == 3 and "heard from it" in out + err and "cannot override" in out + err, out + err
            assert not _gone(pid) and all(_role(loaded, n) != "master" for n in shard.replicas)
            replica = _client(loaded, shard.replicas[0])
            wait_for(lambda: int(replica.info("replication")["master_last_io_seconds_ago"]) > 8 or None,
                     CONDITION_BOUND, "the replica to have heard nothing for the ping period and its grace")
            code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--mode", "force", "--yes")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        assert code == 0 and "[pass] master-down" in out, out + err
        assert f"{shard.master} ran without answering" in out and "stopped, so it cannot take writes again" in out
        assert _gone(pid), f"the stalled master (pid {pid}) still runs"
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert plan_json(capsys, spec)["steps"] == []
        assert {_client(loaded, n).dbsize() for n in shard.members} == {100}
