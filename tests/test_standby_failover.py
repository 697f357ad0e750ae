"""A source failover and a standby failover while a standby follows (issue 36, docs/standby.md "Failovers while
following"): a 3-master cluster with a replica per master under a writer, followed by a standby cluster of the same
shape. While `opsctl follow` streams, (a) the primary's shard 1 fails over (graceful CLUSTER FAILOVER on its
replica), then (b) the standby's shard 2. The link follows both: lag reports go on, every shard attaches again
from its journaled offset (never a copy from scratch: no source server counts another full sync). The promoted
standby master refuses a client's write (the fence is every node's, rendered and set live) and takes the
follower's. Then the link is SIGKILLed, INCRs are made, the primary's old shard-1 master dies (its spec's first
master: the resumed link reads the source's clock on a server that answers), and the same `follow` resumes: the
markers, replicated to the promoted standby master with their batches, apply each INCR once. `status` says the
standby healthy (cluster ok with the promoted replica) and its link streaming every shard, as text and as JSON;
`opsctl switchover` lifts the standby's fence on its live masters first (the promoted one, not the spec's):
every acknowledged write on the standby (values, and as many keys as the primary holds), no marker left, the
promoted standby master takes a client's write; a fleet's status says the standby switched over."""

from __future__ import annotations

import json
import os
import re
import signal
from contextlib import ExitStack, suppress
from typing import Any

import pytest
import redis

from opsctl.base.poll import wait_for
from opsctl.render.exporteruser import FOLLOWER_USER, follower_secret
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import run
from tests.support import CONDITION_BOUND, PASSWORD, owned_key
from tests.test_archive_follow import fail_over
from tests.test_standby_live import Follow, primary_and_standby
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

WITH_REPLICAS = {"cluster": {"masters": 3, "replicas_per_master": 1}}
INCRS = 20  # made while the link is killed, after both failovers


def _full_syncs(loaded: LoadedSpec) -> dict[str, int]:
    """Each source server's count of full syncs it served (a copy from scratch would add one)."""
    counts = {}
    for node in loaded.layout.servers:
        with suppress(redis.ConnectionError):
            counts[node.name] = int(_client(node.address, node.port).info("stats")["sync_full"])
    return counts


def _client(address: str, port: int, **auth: Any) -> redis.Redis:
    return redis.Redis(host=address, port=port, **(auth or {"password": PASSWORD}), decode_responses=True,
                       socket_timeout=5)


def _streamed_on(follow: Follow, writer: Writer, standby: Any, what: str) -> None:
    """A lag report with every shard streaming after now, and a write acknowledged after now on the standby."""
    mark = len(follow.events)
    writer.wait_for_more(200)
    key = list(writer.acked)[-1]
    follow.streaming(after=mark)
    wait_for(lambda: standby.get(key) == writer.acked[key] or None, CONDITION_BOUND,
             f"a write made after {what} on the standby")


def _phases(follow: Follow) -> set[str]:
    """The shards' phases in the lag reports after the first with every shard streaming."""
    reports = [e["shards"] for e in follow.events if e.get("event") == "migrate-lag"]
    first = next(i for i, r in enumerate(reports) if all(s["phase"] == "stream" for s in r.values()))
    return {s["phase"] for r in reports[first:] for s in r.values()}


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_source_and_a_standby_failover_while_following(tmp_path, capsys, flavor) -> None:
    with ExitStack() as stack:
        p, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("cluster", flavor, WITH_REPLICAS), ("cluster", flavor, WITH_REPLICAS)))
        primary, standby = cluster_client(p_loaded), cluster_client(s_loaded)
        writer = stack.enter_context(Writer(lambda: cluster_client(p_loaded)))
        writer.wait_for_writes(300)
        follow = Follow(s)
        follow.streaming()
        syncs = _full_syncs(p_loaded)
        first_master = p_loaded.layout.node(p_loaded.layout.shards[0].master)

        fail_over(p, 1)  # (a) the primary's shard 1: its replica promoted, the old master its replica
        primary.incr("bumps")
        _streamed_on(follow, writer, standby, "the source's failover")

        address, port = fail_over(s, 2)  # (b) the standby's shard 2
        promoted = _client(address, port)
        key = owned_key(promoted)
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions"):
            promoted.set(key, "client")  # still fenced: a client's write refused on the promoted master
        as_follower = _client(address, port, username=FOLLOWER_USER, password=follower_secret(s_loaded).reveal())
        assert as_follower.set(key, "follower") and as_follower.delete(key) == 1  # the follower's taken
        primary.incr("bumps")
        _streamed_on(follow, writer, standby, "the standby's failover")
        assert _phases(follow) <= {"stream", "attach"}  # attached again after each failover, never copying

        follow.proc.send_signal(signal.SIGKILL)
        follow.wait()
        killed = follow
        for _ in range(INCRS):
            primary.incr("bumps")
        dead = _client(first_master.address, first_master.port)  # a replica since (a)
        assert _full_syncs(p_loaded) == syncs, "a source server served another full sync"
        os.kill(int(dead.info("server")["process_id"]), signal.SIGKILL)
        wait_for(lambda: _refuses(dead), CONDITION_BOUND, "the old master gone")
        follow = Follow(s)
        follow.streaming()
        wait_for(lambda: standby.get("bumps") == str(INCRS + 2) or None, CONDITION_BOUND,
                 "the INCRs on the standby, once",
                 last_reason=lambda: f"bumps = {standby.get('bumps')}")
        _streamed_on(follow, writer, standby, "the resume")
        assert _phases(follow) <= {"stream", "attach"}

        def status() -> str:
            code, out, err = run(capsys, "status", "-f", str(s))
            return f"exit {code}\n{out}{err}"

        def sane() -> bool | None:  # healthy with a promoted replica, the link following every shard
            said = status()
            return (said.startswith("exit 0\n") and "cluster ok" in said and all(
                f"shard-{i} stream lag" in said for i in (1, 2, 3))) or None
        wait_for(sane, CONDITION_BOUND, "status showing the standby healthy and following", last_reason=status)
        code, out, err = run(capsys, "status", "-f", str(s), "--output", "json")  # the same as a record
        link = json.loads(out)["standby"]
        assert link["state"] == "following" and link["primary"] == str(p) and sorted(link["shards"]) == [
            "shard-1", "shard-2", "shard-3"], out + err
        assert all(r["phase"] == "stream" and r["lag_bytes"] != -1 for r in link["shards"].values()), out
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions"):
            promoted.set(key, "client")  # the promoted master refuses a client while following
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 0 and "cutover done" in out, out + err
        assert follow.wait() == 0, follow.stderr()
        writer.wait_for_refusal()  # the primary fenced
        writer.stop()
        notes = [e["text"] for each in (killed, follow) for e in each.events if e.get("event") == "note"]
        lifted = next(n for n in notes if n.startswith("switchover:")).split("its masters first: ")[1].rstrip(")")
        assert s_loaded.layout.find(f"{address}:{port}").name in lifted.split(", "), notes  # by the live role:
        assert s_loaded.layout.shards[1].master not in lifted.split(", "), notes  # the promoted one, not the spec's
        _, fleet, err = run(capsys, "status", "-f", str(s.parent), "--output", "json")  # a fleet: per topology
        assert [t["standby"]["state"] for t in json.loads(fleet)["topologies"]] == ["switched-over"], fleet + err
        assert not [n for n in notes if "start over" in n or "from scratch" in n], notes
        now = _full_syncs(p_loaded)
        assert {n: c for n, c in syncs.items() if n in now} == now, "a source server served another full sync"
        assert writer.verify(standby) == []  # every acknowledged write, its value
        counted = re.search(r"(\d+) keys \((\d+) on the source\)", out)
        assert counted and counted.group(1) == counted.group(2) and int(counted.group(1)) >= len(writer.acked), out
        assert standby.get("bumps") == str(INCRS + 2)
        assert not [k for k in standby.scan_iter("opsctl-migrate:*")], "markers left on the standby"
        assert promoted.set(key, "after") and promoted.get(key) == "after"  # the promoted master takes writes
        with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
            primary.set("after", "1")


def _refuses(client: redis.Redis) -> bool | None:
    try:
        client.ping()
    except redis.ConnectionError:
        return True
    return None
