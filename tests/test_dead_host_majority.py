"""A dead host that held half the masters (issue 33, item 3): 4 masters x 1 replica over 3 hosts puts the masters of
shards 1 and 4 on h1 (and shard 3's replica). h1's processes SIGKILLed and its folders deleted, its address edited:
2 of 4 masters answer, no majority, so the cluster can never elect their replicas (apply used to exit 3 "wait for the
cluster to promote a replica" forever). The plan now says it promotes them itself (promote-replica: CLUSTER FAILOVER
TAKEOVER on the replica holding the most), apply does, then replaces the host. Acknowledged writes are lost only in
the kill's window: those the dead masters acknowledged after a WAIT barrier and before the SIGKILL. Real servers on
loopback, both flavors; once with opsctl killed right after its first TAKEOVER."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
import yaml

from opsctl.base.poll import Pending, wait_for
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.test_dead_host import flagged, kill_host, known_endpoints, node_client
from tests.test_drain_host import record_files
from tests.test_shape_killed import cluster_kept, cluster_writer, converged, killed_apply
from tests.writer import cluster_client

pytestmark = pytest.mark.integration


def replicated_barrier(loaded: LoadedSpec, masters: list[str]) -> float:
    """A write on each master, WAITed for by its replica: every write it acknowledged before is on the replica too
    (one ordered stream). When the barrier began: a write acknowledged before that is WAIT-acknowledged."""
    began = time.monotonic()
    for name in masters:
        client = node_client(loaded, name)
        for n in range(1000):  # a key of one of its slots: the others answer MOVED
            try:
                client.set(f"barrier:{{{n}}}", "1")
                break
            except redis.ResponseError:
                continue
        assert client.execute_command("WAIT", 1, 10_000) == 1
    return began


def rerun_after_a_takeover(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec, survivors: list[str],
                           address: str) -> str:
    """opsctl SIGKILLed right after its first TAKEOVER: 3 of 4 masters answer now, a majority, so the cluster elects
    the other shard's replica by itself; a re-run either finds it done or says to wait for it (never a second
    TAKEOVER beside an election), then converges."""
    assert killed_apply(spec, ("at", "promote-replica-asked")) == -signal.SIGKILL
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    assert code == 0 or (code == 3 and "wait for the cluster to promote a replica" in err), err + out
    wait_for(lambda: served(loaded, survivors[0], address), 30, "the cluster to promote the other replica",
             interval=0.05)
    return "the re-run finished" if code == 0 else "the re-run said to wait for the cluster's election"


def served(loaded: LoadedSpec, survivor: str, address: str) -> bool | Pending:
    """No node at the dead address serves slots in the survivor's view."""
    lines = str(node_client(loaded, survivor).execute_command("CLUSTER", "NODES")).splitlines()
    serving = [w[1] for w in (line.split() for line in lines) if w[1].startswith(address + ":") and len(w) > 8]
    return Pending(f"{', '.join(serving)} still serve slots") if serving else True


@pytest.mark.parametrize("killed", [False, True], ids=["apply", "killed-after-takeover"])
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_host_holding_half_the_masters_is_healed(tmp_path, capsys, flavor, killed) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor, cluster={"masters": 4}) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        on_h1 = [n for n in loaded.layout.servers if n.host == "h1"]
        masters = [n.name for n in on_h1 if n.role == "master"]
        assert len(masters) == 2, on_h1  # the premise: h1 holds half the masters
        old = next(h["address"] for h in data["hosts"] if h["name"] == "h1")
        survivors = [n.name for n in loaded.layout.servers if n.host != "h1"]
        with cluster_writer(spec, loaded) as (writer, before):
            barrier = replicated_barrier(loaded, masters)
            dead, killed_at = kill_host(spec, "h1")
            wait_for(lambda: flagged(loaded, survivors, old), 30, "the survivors to flag h1's nodes", interval=0.05)
            spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": old.rsplit(".", 1)[0] + ".4"}
                                                              if h["name"] == "h1" else h for h in data["hosts"]]}))
            plan = plan_json(capsys, spec)
            promotions = [s for s in plan["steps"] if s["kind"] == "promote-replica"]
            assert plan["replan"] and len(promotions) == len(plan["steps"]) == 2, plan
            assert {s["shard"] for s in promotions} == {loaded.layout.shard_of(m).index for m in masters}
            assert all("no majority" in s["reason"] for s in promotions), promotions
            code, out, _ = run(capsys, "plan", "-f", str(spec))
            assert code == 2 and "promote-replica" in out and "then: " in out, out
            started = time.monotonic()
            rerun = rerun_after_a_takeover(capsys, spec, loaded, survivors, old) if killed else ""
            converged(capsys, spec, set())
            took = time.monotonic() - started
            writer.wait_for_writes(len(writer.acked) + 200)
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        lost = cluster_kept(spec, writer, before, killed_at, masters=4)
        lost_keys = [key for key, _ in writer.lost(cluster_client(read_spec(spec)))]
        assert all(barrier < when[k] <= killed_at for k in lost_keys), lost_keys  # only the kill's window
        assert not any(e.startswith(old + ":") for e in known_endpoints(spec))  # the dead ids forgotten
        assert sorted(n for n in record_files(spec) if read_spec(spec).layout.node(n).host == "h1") == dead
        window = sum(1 for t in writer.ack_times if barrier < t <= killed_at)
        with os.fdopen(os.dup(2), "w") as err:
            how = f", killed after the takeover: {rerun}" if killed else ""
            print(f"\ndead host with half the masters [{flavor}{how}]: "
                  f"writes acknowledged {len(writer.acked)}, lost {lost} of the {window} acknowledged between the "
                  f"WAIT barrier and the SIGKILL ({(killed_at - barrier) * 1000:.0f} ms), apply {took:.1f} s, "
                  f"longest write gap {writer.max_gap_ms:.0f} ms", file=err)
