"""A master dies, another node takes over (Sentinel, the cluster, or an operator), then `apply` starts the dead
one again: it must come back as a replica of the new master, never as a second writable master. The writer
addresses the old master directly, as a client with a stale address would (issue 14, case 4)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from opsctl.base.poll import wait_for
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, admin_for, cluster_check
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration


def _client(loaded: LoadedSpec, name: str) -> redis.Redis:
    node = loaded.layout.node(name)
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=1.0,
                       socket_connect_timeout=0.5, decode_responses=True)


def _role(loaded: LoadedSpec, name: str) -> str | None:
    try:
        return str(_client(loaded, name).execute_command("ROLE")[0])
    except redis.RedisError:
        return None


def _kill(tmp_path: Path, loaded: LoadedSpec, name: str, writer: Writer | None = None) -> int:
    """SIGKILL name's server. With a writer on it: how many writes the dead server had acknowledged, those the
    writer recorded before its first failed write after the kill. Counted in the writer's own order (it writes
    one at a time), not by the clock: it records an ack only once it runs again after the reply, so the dead
    server's last ack can be recorded after the kill (CI, a quiet machine: one such write counted as lost)."""
    failed = len(writer.errors) if writer is not None else 0
    os.kill(int((tmp_path / ".opsctl" / loaded.spec.name / name / "server.pid").read_text()), signal.SIGKILL)
    if writer is None:
        return 0
    wait_for(lambda: len(writer.errors) > failed or None, CONDITION_BOUND, "the writer to see the server gone")
    # the error's time is printed to the ms; the writer sleeps 10 ms after a failure before it writes again
    first_failure = float(writer.errors[failed].split()[0]) + 0.001
    return sum(1 for at in writer.ack_times if at < first_failure)


def _lost_after_restart(writer: Writer, client: redis.Redis | object, acked_before_kill: int) -> list[str]:
    """Acknowledged writes lost, less those the killed server acknowledged: that asynchronous replication
    window belongs to the kill, not to the restart (printed, for the record)."""
    before = set(list(writer.acked)[:acked_before_kill])
    lost = [key for key, _ in writer.lost(client)]
    window = [k for k in lost if k in before]
    print(f"lost in the replication window at the kill: {len(window)}; acknowledged: {len(writer.acked)}")
    return [k for k in lost if k not in before]


def _apply_with_writer_on(tmp_path, capsys, spec: Path, loaded: LoadedSpec, old: str, new: str
                          ) -> tuple[Writer, int]:
    """Kill old while a writer hammers its address; once new is master, apply; the writer goes on a moment."""
    with Writer(lambda: _client(loaded, old)) as writer:
        writer.wait_for_writes(300)
        killed_at = _kill(tmp_path, loaded, old, writer)
        wait_for(lambda: _role(loaded, new) == "master" or None, CONDITION_BOUND, f"{new} to be promoted")
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert _role(loaded, old) == "slave", "the old master came back as a master"
        writer.wait_for_tries(20)  # the restarted old master was written to (refused, as a replica must)
    return writer, killed_at


def _settled(capsys, spec: Path) -> None:
    deadline = time.monotonic() + CONDITION_BOUND
    while run(capsys, "status", "-f", str(spec))[0] != 0:
        assert time.monotonic() < deadline, "status stays degraded"
        time.sleep(0.2)
    assert plan_json(capsys, spec)["steps"] == []


def test_sentinel_apply_starts_the_crashed_master_as_a_replica(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        old = loaded.layout.shards[0].master

        def promoted() -> str | None:
            masters = [n for n in loaded.layout.shards[0].replicas if _role(loaded, n) == "master"]
            return masters[0] if masters else None

        with Writer(lambda: _client(loaded, old)) as writer:
            writer.wait_for_writes(300)
            killed_at = _kill(tmp_path, loaded, old, writer)
            new = wait_for(promoted, CONDITION_BOUND, "Sentinel to promote a replica")
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            assert "starts as a replica of" in out
            assert _role(loaded, old) == "slave", "the old master came back as a master"
            writer.wait_for_tries(20)  # the restarted old master was written to (refused, as a replica must)
        assert _lost_after_restart(writer, _client(loaded, new), killed_at) == []
        _settled(capsys, spec)


def test_replication_apply_starts_the_crashed_master_as_a_replica(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        old, new, other = loaded.layout.shards[0].members
        node = loaded.layout.node(new)
        with Writer(lambda: _client(loaded, old)) as writer:
            writer.wait_for_writes(300)
            killed_at = _kill(tmp_path, loaded, old, writer)
            with admin_for(loaded, node) as admin:  # the operator promotes by hand (renamed commands)
                admin.call("REPLICAOF", "NO", "ONE")
            with admin_for(loaded, loaded.layout.node(other)) as admin:
                admin.call("REPLICAOF", node.address, str(node.port))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            assert _role(loaded, old) == "slave", "the old master came back as a master"
            writer.wait_for_tries(20)  # the restarted old master was written to (refused, as a replica must)
        assert _lost_after_restart(writer, _client(loaded, new), killed_at) == []
        _settled(capsys, spec)


def test_replication_apply_refuses_to_follow_a_promoted_replica_that_lacks_its_siblings_data(tmp_path, capsys
                                                                                           ) -> None:
    """new was promoted by hand before the writes, other took them from old, then old crashed: following new
    would empty other and old (its data on disk) by a full sync from a master without them. Refused, nothing
    done: other keeps its keys, old stays down."""
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        old, new, other = loaded.layout.shards[0].members
        with admin_for(loaded, loaded.layout.node(new)) as admin:
            admin.call("REPLICAOF", "NO", "ONE")
        writes = _client(loaded, old)
        for i in range(300):
            writes.set(f"k:{i}", i)
        assert writes.execute_command("WAIT", 1, 5000) == 1
        _kill(tmp_path, loaded, old)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3, out + err
        assert f"{new} would take over as master (0 keys" in err and f"{other} (300 keys" in err, err
        assert _client(loaded, other).dbsize() == 300 and _role(loaded, old) is None


def test_cluster_apply_restarts_a_crashed_master_that_rejoins_as_a_replica(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey", cluster={"node_timeout_ms": 1000}) as (spec, loaded):
        shard = loaded.layout.shards[0]
        old, new = shard.master, shard.replicas[0]
        writer, killed_at = _apply_with_writer_on(tmp_path, capsys, spec, loaded, old, new)
        assert _lost_after_restart(writer, cluster_client(loaded), killed_at) == []
        wait_for(lambda: cluster_check(loaded.layout.servers[0].endpoint).returncode == 0 or None, CONDITION_BOUND,
                 "check")
        _settled(capsys, spec)


def test_sentinel_apply_right_after_the_crash_starts_the_master_fenced(tmp_path, capsys) -> None:
    """apply races Sentinel's failover: the sentinels still name the dead master, so it starts fenced and takes
    writes only once no failover of it is in flight (or becomes a replica if one promoted a replica)."""
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        old = loaded.layout.shards[0].master
        with Writer(lambda: _client(loaded, old)) as writer:
            writer.wait_for_writes(300)
            killed_at = _kill(tmp_path, loaded, old, writer)
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            assert "starts fenced" in out or "starts as a replica of" in out, out
            writer.wait_for_tries(20)  # the restarted old master was written to (fenced or a replica)
        _settled(capsys, spec)
        master = next(n for n in loaded.layout.shards[0].members if _role(loaded, n) == "master")
        assert _lost_after_restart(writer, _client(loaded, master), killed_at) == []
