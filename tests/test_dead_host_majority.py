"""A dead host that held half the masters (issue 33, item 3): 4 masters x 1 replica over 3 hosts puts the masters of
shards 1 and 4 on h1 (and shard 3's replica). h1's processes SIGKILLed and its folders deleted, its address edited:
2 of 4 masters answer, no majority, so the cluster can never elect their replicas (apply used to exit 3 "wait for the
cluster to promote a replica" forever). The plan now says it promotes them itself (promote-replica: CLUSTER FAILOVER
TAKEOVER on the replica holding the most), apply does, then replaces the host. Acknowledged writes are lost only in
the kill's window: those the dead masters acknowledged after a WAIT barrier and before the SIGKILL. Real servers on
loopback, both flavors; once with opsctl killed right after its first TAKEOVER, the other replica past the time the
cluster would elect it (the re-run forces its promotion)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from opsctl.base.poll import Pending, wait_for
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, write_barrier
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
        assert write_barrier(node_client(loaded, name), 1), name
    return began


def rerun_after_a_takeover(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec, orphans: list[str],
                           address: str) -> str:
    """opsctl SIGKILLed right after its first TAKEOVER, once every orphaned replica's link has been down past its
    election limit (review 1, finding 1): 3 of 4 masters answer now, a majority, yet the cluster never elects the
    other shard's replica (it asks no more: its data is too old), and a re-run used to say to wait for it, forever.
    It now plans a CLUSTER FAILOVER FORCE of it (a vote the majority passes) and converges."""
    wait_for(lambda: cut_off_past(loaded, orphans, ELECTION_LIMIT_S), CONDITION_BOUND,
             "the orphaned replicas' link to be down past their election limit", interval=0.1)
    assert killed_apply(spec, ("at", "promote-replica-asked")) == -signal.SIGKILL
    steps = plan_json(capsys, spec)["steps"]
    assert [(s["kind"], s["mode"]) for s in steps] == [("promote-replica", "force")], steps
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    assert code == 0, err + out
    return "the re-run forced the other promotion"


# The killed variant's settings: repl-ping-replica-period 1 s, node timeout 2 s, validity factor 1: a replica asks for
# an election no more once its link is down 1 + 2 x (1 + 1) = 5 s (the node timeout is the data age's baseline).
PAST_ELECTION = {"cluster": {"masters": 4, "replica_validity_factor": 1}, "config": {"repl-ping-replica-period": 1}}
ELECTION_LIMIT_S = 5


def cut_off_past(loaded: LoadedSpec, replicas: list[str], limit: float) -> bool | Pending:
    """Every one of replicas has had its link to its master down for more than limit seconds."""
    down = {name: str(node_client(loaded, name).info("replication").get("master_link_down_since_seconds", ""))
            for name in replicas}
    late = {name: since for name, since in down.items() if not since.isdigit() or int(since) <= limit}
    return Pending(", ".join(f"{n} down {s} s" for n, s in late.items())) if late else True


@pytest.mark.parametrize("killed", [False, True], ids=["apply", "killed-after-takeover"])
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_host_holding_half_the_masters_is_healed(tmp_path, capsys, flavor, killed) -> None:
    settings = PAST_ELECTION if killed else {"cluster": {"masters": 4}}
    with deployed(tmp_path, capsys, "cluster", flavor, **settings) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        on_h1 = [n for n in loaded.layout.servers if n.host == "h1"]
        masters = [n.name for n in on_h1 if n.role == "master"]
        assert len(masters) == 2, on_h1  # the premise: h1 holds half the masters
        old = next(h["address"] for h in data["hosts"] if h["name"] == "h1")
        survivors = [n.name for n in loaded.layout.servers if n.host != "h1"]
        with cluster_writer(spec, loaded) as (writer, before):
            barrier = replicated_barrier(loaded, masters)
            dead, killed_at = kill_host(spec, "h1")
            wait_for(lambda: flagged(loaded, survivors, old), CONDITION_BOUND,
                     "the survivors to flag h1's nodes", interval=0.05)
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
            orphans = [r for m in masters if (shard := loaded.layout.shard_of(m)) for r in shard.replicas]
            rerun = rerun_after_a_takeover(capsys, spec, loaded, orphans, old) if killed else ""
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
