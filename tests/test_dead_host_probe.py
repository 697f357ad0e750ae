"""The promotion of an orphaned replica looks at its master again when it runs (review 1, finding 3): the plan's
fingerprint leaves link states out, so a saved plan, or the second promotion after the first one's wait, could ask
a TAKEOVER beside a master heard again. promote-replica now re-reads the replica's INFO replication and probes the
old master's endpoint with the spec's credentials just before it asks, and refuses if either hears it. Real servers
on loopback, both flavors: a step naming a live master as gone is refused, and nothing changes."""

from __future__ import annotations

import pytest

from opsctl.apply.shape_steps import _ask_failover, promote_replica
from opsctl.base.errors import RefusedError
from opsctl.base.events import ignore
from opsctl.observe.replies import myself, parse_cluster_nodes
from opsctl.plan.steps import PromoteReplica
from opsctl.runtime.execution import Execution
from opsctl.runtime.gather import gone_probe
from opsctl.runtime.opening import make_runtime
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed
from tests.test_dead_host import node_client

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_promotion_beside_a_master_heard_again_is_refused_when_it_runs(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        shard = loaded.layout.shards[0]
        master, replica = loaded.layout.node(shard.master), shard.replicas[0]
        view = parse_cluster_nodes(str(node_client(loaded, master.name).execute_command("CLUSTER", "NODES")))
        me = myself(view)
        assert me is not None and me.slots
        step = PromoteReplica(replica, "a saved plan that took the master for gone", shard.index, me.id,
                              master.endpoint, f"{me.slots[0][0]}-{me.slots[0][1]}")
        rt = make_runtime(read_spec(spec))
        with pytest.raises(RefusedError) as refused:
            promote_replica(Execution(rt, ignore), step)
        assert f"its master at {master.endpoint} runs" in refused.value.summary, refused.value
        assert f"{replica} heard from it" in refused.value.detail and "two masters" in refused.value.detail
        assert node_client(loaded, replica).execute_command("ROLE")[0] in ("slave", b"slave")  # not asked
        assert gone_probe(rt, master.endpoint).reachable  # the probe answers with the spec's credentials
        silent = f"{master.address}:{master.bus_port}"  # the bus port: no client protocol there
        assert not gone_probe(rt, silent).reachable
        # The ask's end of a race: a replica the cluster elected between the step's look and its ask refuses
        # CLUSTER FAILOVER ("You should send CLUSTER FAILOVER to a replica"): a master now, it is done (test_day2
        # beside two CPU hogs); a replica's other refusals still raise.
        elected = PromoteReplica(master.name, "elected meanwhile", shard.index, "0" * 40, "127.0.0.1:1", step.slots)
        _ask_failover(Execution(rt, ignore), rt.connections[master.name], elected)
        assert node_client(loaded, master.name).execute_command("ROLE")[0] in ("master", b"master")
