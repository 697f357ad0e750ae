"""A target failover mid-stream is followed (issue 26, item 3): a standalone Redis 7.0 under a writer streams into
a 3-master Valkey 9.1 cluster with a replica each; one target master is failed over (graceful CLUSTER FAILOVER on
its replica) while the stream runs. The migration keeps running (the writes the old master refuses with MOVED are
applied again on the new one, the markers skipping what had landed), cuts over, and every acknowledged write is in
the target, an INCR made after the failover applied once, redis-cli's check passes."""

from __future__ import annotations

import time

import pytest
import redis

from tests.lifecycle import run
from tests.support import CONDITION_BOUND, PASSWORD, cluster_check
from tests.test_migrate_live import SOURCE, Migrate, fill, pair, source_client
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

TARGET = ("cluster", "valkey", {"cluster": {"masters": 3, "replicas_per_master": 1}})


def _fail_over(loaded, shard: int) -> tuple[redis.Redis, redis.Redis]:
    """Shard's replica promoted gracefully; (the new master, the old one) once both say so."""
    layout = loaded.layout
    old_node, new_node = (layout.node(layout.shards[shard - 1].master),
                          layout.node(layout.shards[shard - 1].replicas[0]))
    old, new = (redis.Redis(host=n.address, port=n.port, password=PASSWORD, decode_responses=True)
                for n in (old_node, new_node))
    new.execute_command("CLUSTER", "FAILOVER")
    deadline = time.monotonic() + CONDITION_BOUND
    while time.monotonic() < deadline:
        if new.execute_command("ROLE")[0] == "master" and old.execute_command("ROLE")[0] == "slave":
            return new, old
        time.sleep(0.05)
    raise AssertionError("the target failover did not happen within 30 s")


def test_a_target_failover_mid_stream_is_followed(tmp_path, capsys) -> None:
    with pair(tmp_path, capsys, SOURCE, TARGET) as (s, s_loaded, t, t_loaded):
        src = source_client(s_loaded)
        fill(src)
        with Writer(lambda: source_client(s_loaded)) as writer:
            writer.wait_for_writes(300)
            migrate = Migrate(t, s)
            migrate.streaming()
            writer.wait_for_more(300)  # the stream under the writer
            _fail_over(t_loaded, 1)
            mark = len(migrate.events)
            src.execute_command("INCR", "counter")
            writer.wait_for_more(300)  # writes the stream carries to the new target master
            migrate.streaming(after=mark)  # followed: a lag report since the failover, every shard streaming
            assert migrate.proc.poll() is None, migrate.stderr()
            code, out, err = run(capsys, "migrate", "cutover", "-f", str(t))
            assert code == 0 and "cutover done" in out, out + err
        assert migrate.wait() == 0, migrate.stderr()
        done = migrate.done()
        assert done["ok"] and done["source_keys"] == done["target_keys"], done
        dst = cluster_client(t_loaded)
        assert writer.verify(dst) == [], "acknowledged writes missing in the target"
        assert dst.get("counter") == "1" and dst.get("s:5") == "v5"
        node = t_loaded.layout.servers[0]
        assert cluster_check(f"{node.address}:{node.port}").returncode == 0
