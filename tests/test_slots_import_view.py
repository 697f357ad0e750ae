"""Issue 23, class 2, the case the partitioned Redis 7.0 reshard left for `cluster fix` (seed 12 of the soak):
slots open from a source to a target, then the source's replica takes over. Redis 7.0 ignores every owner update
for a slot it imports, so when the old source turns replica the target drops those slots from its own view: they
have no owner there, its cluster_state is fail, and every MIGRATE into it is refused (CLUSTERDOWN Hash slot not
served). `cluster fix` exited 1 after its patience, and so did every `apply`; now it mends the target's view
(SETSLOT NODE <serving source>, the IMPORTING flag kept) and finishes the move. No partition is needed: a
graceful CLUSTER FAILOVER of the source's replica leaves the same state."""

from __future__ import annotations

import pytest

from opsctl.base.poll import wait_for
from opsctl.slots.journal import Journal
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, admin_for
from tests.test_slots_reshard import preload, referee_ok
from tests.writer import cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def _call(loaded, name: str, *args: object) -> object:
    with admin_for(loaded, loaded.layout.node(name)) as admin:
        return admin.call(*args)


def _my_id(loaded, name: str) -> str:
    return str(_call(loaded, name, "CLUSTER", "MYID"))


def _state(loaded, name: str) -> str:
    info = str(_call(loaded, name, "CLUSTER", "INFO"))
    return info.split("cluster_state:", 1)[1].split()[0]


def test_fix_finishes_slots_whose_source_failed_over_while_the_target_imported_them(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "redis") as (spec, loaded):
        preload(loaded, 6000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        shard, other = loaded.layout.shards[0], loaded.layout.shards[1]
        source, target, replica = shard.master, other.master, shard.replicas[0]
        source_id, target_id = _my_id(loaded, source), _my_id(loaded, target)
        slots = [s for s in range(0, 400) if int(_call(loaded, source, "CLUSTER", "COUNTKEYSINSLOT", s))][:40]
        assert len(slots) == 40  # the first master's, each with keys
        Journal(spec.parent / ".opsctl" / loaded.spec.name).opened(source, source_id, target, target_id, slots)
        for s in slots:  # a move opened, as a run does, and interrupted
            _call(loaded, target, "CLUSTER", "SETSLOT", s, "IMPORTING", source_id)
            _call(loaded, source, "CLUSTER", "SETSLOT", s, "MIGRATING", target_id)
        _call(loaded, replica, "CLUSTER", "FAILOVER")
        wait_for(lambda: _state(loaded, target) == "fail" or None, CONDITION_BOUND,
                 "the target to lose the open slots' owner from its view")
        for s in slots:  # the run followed the failover: MIGRATING on the new source (the state the soak left)
            _call(loaded, replica, "CLUSTER", "SETSLOT", s, "MIGRATING", target_id)
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
        assert code == 0 and "finish" in out, out + err
        wait_for(lambda: _state(loaded, target) == "ok" or None, CONDITION_BOUND, "the target's cluster_state to be ok")
        referee_ok(loaded)
        assert dataset_checksum(cluster_client(loaded), "pre:*") == before
        owned = [int(_call(loaded, target, "CLUSTER", "COUNTKEYSINSLOT", s)) for s in slots]
        assert all(owned), owned  # the move finished: the keys are on the target
        assert plan_json(capsys, spec)["steps"] == []
