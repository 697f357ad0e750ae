"""The replication-stream reader against real servers (Valkey 9.1, Redis 7.0, ACL auth): a full copy from a replica,
commands whose end offsets match the master's master_repl_offset, a continuation from a journaled position, a
promoted replica answering CONTINUE with its new id, and a StreamGap once the backlog no longer holds the offset."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.resp import encode
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.stream import Entry, Position, Stream, StreamGap, open_stream
from tests.lifecycle import deployed
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV

pytestmark = pytest.mark.integration

ACL = {"mode": "acl", "password": {"env": PASSWORD_ENV}}


def client(loaded: LoadedSpec, node: Node) -> redis.Redis:
    return redis.Redis(host=node.address, port=node.port, username=loaded.spec.auth.admin_user, password=PASSWORD)


def offset_of(c: redis.Redis) -> int:
    return int(c.info("replication")["master_repl_offset"])


def read_until(stream: Stream, offset: int, timeout: float = CONDITION_BOUND) -> list[Entry]:
    """Entries until the stream's position reaches offset."""
    entries: list[Entry] = []
    deadline = time.monotonic() + timeout
    while stream.position.offset < offset:
        assert time.monotonic() < deadline, f"stream at {stream.position.offset}, master at {offset}"
        entries += stream.read(0.2)
    return entries


def data(entries: list[Entry]) -> list[tuple[bytes, ...]]:
    return [e.args for e in entries if e.args[0].upper() not in (b"PING", b"REPLCONF", b"SELECT")]


def upper(commands: list[tuple[bytes, ...]]) -> list[tuple[bytes, ...]]:
    return [(c[0].upper(), *c[1:]) for c in commands]


def check_offsets(entries: list[Entry], start: int) -> None:
    """Each end is the previous end plus the command's RESP size."""
    at = start
    for entry in entries:
        at += len(encode(list(entry.args)))
        assert entry.end == at


def set_once_replicas_count(c: redis.Redis, key: str, value: str) -> None:
    """SET, retried while the master refuses it with NOREPLICAS: right after apply, under load, the master may not
    count its replica as good yet (min-replicas-max-lag; a clean-checkout run met it on the first write)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            c.set(key, value)
            return
        except redis.ResponseError as exc:
            assert str(exc).startswith("NOREPLICAS") and time.monotonic() < deadline, exc
            time.sleep(0.05)


def wait_offset(c: redis.Redis, offset: int) -> None:
    deadline = time.monotonic() + 10
    while offset_of(c) < offset:
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_full_copy_offsets_resume_failover_and_gap(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   flavor: str) -> None:
    with deployed(tmp_path, capsys, "replication", flavor, hosts=2, auth=ACL) as (_spec, loaded):
        master, replica = loaded.layout.servers[0], loaded.layout.servers[1]
        connector = Connector(loaded)
        m, r = client(loaded, master), client(loaded, replica)
        set_once_replicas_count(m, "before", "snapshot")
        wait_offset(r, offset_of(m))  # the replica's snapshot holds it: the stream starts after it
        rdb = tmp_path / "snap.rdb"

        # a full copy from the replica: the snapshot file, then commands at the master's offsets
        with open_stream(connector, replica, since=None, rdb_to=rdb, timeout=10) as stream:
            assert stream.full and rdb.read_bytes().startswith(b"REDIS")
            assert stream.silent_after == 30.0  # three of the node's PINGs (repl-ping-replica-period 10)
            start = stream.start
            for i in range(50):
                m.set(f"k:{i}", i)
            m.execute_command("INCR", "counter")
            entries = read_until(stream, offset_of(m))
            check_offsets(entries, start.offset)
            assert upper(data(entries)) == [(b"SET", f"k:{i}".encode(), str(i).encode()) for i in range(50)] + [
                (b"INCR", b"counter")]
            assert stream.position == Position(start.replid, offset_of(m))
            journaled = stream.position
            stream.ack(journaled.offset)

        # continue after the journaled position: exactly the commands written since, no second copy
        m.set("after", "resume")
        m.delete("k:0")
        (tmp_path / "unused.rdb").unlink(missing_ok=True)
        with connection_to(connector, replica) as handle:  # CONFIG under the spec's rename
            handle.config_set("repl-ping-replica-period", "60")  # pings every minute: its link may be silent 3
            with open_stream(connector, replica, since=journaled, rdb_to=tmp_path / "unused.rdb", timeout=10) as stream:
                assert stream.silent_after == 180.0
            handle.config_set("repl-ping-replica-period", "10")
        with open_stream(connector, replica, since=journaled, rdb_to=tmp_path / "unused.rdb", timeout=10) as stream:
            assert not stream.full and stream.start == journaled
            entries = read_until(stream, offset_of(m))
            check_offsets(entries, journaled.offset)
            assert [a[1] for a in data(entries)] == [b"after", b"k:0"]
            journaled = stream.position
        assert not (tmp_path / "unused.rdb").exists()

        # an unknown history is a gap, and leaves no file behind
        with pytest.raises(StreamGap) as gap:
            open_stream(connector, replica, since=Position("0" * 40, journaled.offset), rdb_to=tmp_path / "x.rdb",
                        timeout=10)
        assert gap.value.reason == "history changed" and not (tmp_path / "x.rdb").exists()

        # failover: the promoted replica continues the old history under its new id
        wait_offset(r, journaled.offset)
        r.execute_command("REPLICAOF", "NO", "ONE")
        config = loaded.command_name(replica, "CONFIG")
        r.execute_command(config, "SET", "min-replicas-to-write", "0")
        m.execute_command("REPLICAOF", replica.address, replica.port)
        with open_stream(connector, replica, since=journaled, rdb_to=tmp_path / "y.rdb", timeout=10) as stream:
            assert not stream.full
            assert stream.start.offset == journaled.offset and stream.start.replid != journaled.replid
            r.set("on-new-master", 1)
            entries = read_until(stream, offset_of(r))
            assert (b"on-new-master", b"1") in [a[1:] for a in data(entries)]

        # backlog overrun: the promoted node's backlog no longer holds the old offset
        r.execute_command(config, "SET", "repl-backlog-size", "16384")
        for i in range(300):
            r.set(f"fill:{i}", "x" * 10_000)
        with pytest.raises(StreamGap) as gap:
            open_stream(connector, replica, since=journaled, rdb_to=tmp_path / "z.rdb", timeout=10)
        assert gap.value.reason == "backlog overrun" and gap.value.exit_code == 3
        assert "must start over" in gap.value.hint and not (tmp_path / "z.rdb").exists()
