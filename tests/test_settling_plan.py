"""What a run killed part way leaves settling, with nothing else to do (issue 22, item 8): a cluster node that
gossip has not brought to every node yet, a sentinel reset that has not counted the fleet again. The plan waits
for it (wait-converged) instead of being empty while status says the fleet is unhealthy. Pure."""

from __future__ import annotations

from opsctl.plan.facts import NodeFacts
from opsctl.plan.planner import _recounting, _unaware
from tests.support import make_spec
from tests.test_dead_nodes import line
from tests.test_planner import load_dict


def test_a_cluster_node_not_known_to_every_node_yet_is_waited_for() -> None:
    layout = load_dict(make_spec("cluster", hosts=3)).layout
    ids = {n.name: f"id{i}" for i, n in enumerate(layout.servers)}
    everyone = tuple(line(ids[n.name], n.endpoint, "master") for n in layout.servers)

    def facts(*missing: tuple[str, str]) -> dict[str, NodeFacts]:
        out = {}
        for n in layout.servers:
            view = tuple(v if v.id != ids[n.name] else line(v.id, n.endpoint, "myself", "master") for v in everyone
                         if (n.name, v.id) not in {(who, ids[other]) for who, other in missing})
            out[n.name] = NodeFacts(n.name, True, reachable=True, cluster_nodes=view)
        return out

    assert _unaware(layout, facts()) == []
    newest = layout.servers[-1].name
    assert _unaware(layout, facts((layout.servers[1].name, newest))) == [newest]


def test_a_sentinel_counting_fewer_than_run_is_waited_for() -> None:
    loaded = load_dict(make_spec("sentinel", hosts=3))
    layout = loaded.layout

    def facts(replicas: int, sentinels: int) -> dict[str, NodeFacts]:
        out = {n.name: NodeFacts(n.name, True, reachable=True) for n in layout.servers}
        for n in layout.sentinels:
            out[n.name] = NodeFacts(n.name, True, reachable=True,
                                    info={"master0": f"name=m,status=ok,slaves={replicas},sentinels={sentinels}"})
        return out

    count = len(layout.shards[0].replicas)
    assert _recounting(layout, facts(count, 3)) == []
    assert _recounting(layout, facts(count + 1, 3)) == []  # more: a reset's business (stale_sentinels)
    assert _recounting(layout, facts(count - 1, 3)) == [n.name for n in layout.sentinels]
    assert _recounting(layout, facts(count, 2)) == [n.name for n in layout.sentinels]
