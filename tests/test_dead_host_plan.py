"""A dead host that held half the masters, the planner's part (issue 33, item 3): recorded facts of a 4-master,
1-replica cluster over 3 hosts whose h1 (the masters of shards 1 and 4, shard 3's replica) was SIGKILLed with its
disk and given a new address. No majority left: the plan promotes the orphaned replicas first (promote-replica,
said in text and JSON, round-tripped through a saved plan); a majority left: the wait refusal as before; a shard
with no member left: refused, naming the shard and the restore. Pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opsctl.apply.planfile import parse_plan
from opsctl.apply.planning import plan_text
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.cluster.deadnodes import _election_limit
from opsctl.observe.cluster_state import even_slot_ranges
from opsctl.observe.replies import ClusterNodeLine, RoleInfo
from opsctl.plan.facts import NodeFacts
from opsctl.plan.planner import PROMOTE_FIRST, make_plan
from opsctl.plan.steps import PromoteReplica
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.load import LoadedSpec
from tests.support import make_spec
from tests.test_planner import desired, load_dict

NEW_ADDRESS = "127.250.250.4"
OFFSETS = {2: 9000, 8: 7000}  # how far each orphaned replica got into its dead master's stream


def _fleet(dead: set[int], configs: dict[int, dict[str, int]] | None = None) -> tuple[LoadedSpec, dict[str, NodeFacts]]:
    """The spec with h1 readdressed (node k's own config: configs[k]), and every node's facts: the nodes k in dead
    were at h1's old address (gone), the others answer; a replica of a dead master has its link down and its offset
    kept."""
    data = make_spec("cluster", cluster={"masters": 4})
    old = data["hosts"][0]["address"]
    nodes = {f"{data['name']}-{k}": {"config": config} for k, config in (configs or {}).items()}
    loaded = load_dict({**data, "hosts": [{**data["hosts"][0], "address": NEW_ADDRESS}, *data["hosts"][1:]],
                        **({"nodes": nodes} if nodes else {})})
    servers = loaded.layout.servers
    slots = even_slot_ranges(4)

    def ident(k: int) -> str:
        return f"d{k}" if k in dead else f"n{k}"

    def endpoint(k: int) -> tuple[str, int]:
        node = servers[k - 1]
        return (old if k in dead and node.host == "h1" else node.address), node.port

    lines = []
    for k in range(1, 9):
        master = k % 2 == 1
        flags = {"master" if master else "slave"} | ({"fail?"} if k in dead else set())
        address, port = endpoint(k)
        lines.append(ClusterNodeLine(ident(k), address, port, port + 10000, frozenset(flags),
                                     None if master else ident(k - 1), 1, "disconnected" if k in dead else "connected",
                                     (slots[k // 2],) if master else ()))
    facts = {}
    for k, node in enumerate(servers, start=1):
        if k in dead:
            facts[node.name] = NodeFacts(node.name, False)  # not running, no record: gone with its machine
            continue
        view = tuple(ClusterNodeLine(**{**line.__dict__, "flags": line.flags | {"myself"}}) if line.id == ident(k)
                     else line for line in lines)
        master_gone = k % 2 == 0 and k - 1 in dead
        role = RoleInfo("master") if k % 2 else RoleInfo("replica", master=endpoint(k - 1),
                                                         link="connect" if master_gone else "connected")
        info = {"master_replid": f"r{k // 2}", "master_repl_offset": str(OFFSETS.get(k, 5000)),
                "master_link_status": "down" if master_gone else "up"}
        facts[node.name] = NodeFacts(node.name, True, reachable=True, info=info, role=role, cluster_nodes=view)
    return loaded, facts


def test_no_majority_left_plans_the_promotions_first() -> None:
    loaded, facts = _fleet({1, 6, 7})
    plan = make_plan(loaded, desired(loaded), facts, "d")
    names = [n.name for n in loaded.layout.servers]
    assert [(type(s), s.node, s.shard) for s in plan.steps] == [(PromoteReplica, names[1], 1),
                                                                  (PromoteReplica, names[7], 4)]
    assert plan.replan and plan.notes == (PROMOTE_FIRST,)
    first = plan.steps[0]
    assert isinstance(first, PromoteReplica) and first.dead == "d1" and first.slots == "0-4095"
    assert "2 of 4 slot-owning masters answer: no majority" in first.reason and "offset 9000" in first.reason
    text = plan_text(plan)
    assert f"promote-replica {names[1]} (shard 1, in place of {first.was})" in text and "then: " in text, text
    assert parse_plan(plan.to_dict(), "plan.json") == plan  # a saved plan runs the same steps


def test_a_majority_left_waits_for_the_clusters_own_election() -> None:
    loaded, facts = _fleet({1, 6})  # only shard 1's master went: 3 of 4 answer
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert "3 of 4 slot-owning masters answer, a majority" in refused.value.detail
    assert "wait for the cluster to promote a replica" in refused.value.hint


def test_a_shard_with_no_member_left_is_refused_naming_the_restore() -> None:
    loaded, facts = _fleet({1, 2, 6, 7})  # shard 1's replica gone too (no record: its machine with it)
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert refused.value.exit_code == 3 and "shard 1: slots 0-4095" in refused.value.summary
    assert "restore that shard from a backup" in refused.value.hint


def test_a_replica_that_heard_its_master_lately_is_not_promoted() -> None:
    """master-down, binding as in a forced failover: a replica whose link is up and heard the master within its ping
    period says it runs (cut off from opsctl only); the plan refuses instead of making two masters."""
    loaded, facts = _fleet({1, 6, 7})
    name = loaded.layout.servers[1].name
    info = {**facts[name].info, "master_link_status": "up", "master_last_io_seconds_ago": "1"}
    facts[name] = NodeFacts(**{**facts[name].__dict__, "info": info})
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert "master-down" in refused.value.detail and "heard from it 1 s ago" in refused.value.detail
    assert "its host is not gone" in refused.value.hint and "12 s" in refused.value.hint  # ping period 10 s + 2 s


def test_a_down_replica_that_comes_back_is_named_before_the_restore() -> None:
    """The dead master's only replica is down but comes back (its record kept): no member answers, and the refusal
    names starting it before restoring from a backup."""
    loaded, facts = _fleet({1, 6, 7})
    name = loaded.layout.servers[1].name
    facts[name] = NodeFacts(name, False, record=NodeRecord("abc"))
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert "no member left" in refused.value.summary and f"if {name}" in refused.value.hint, refused.value


def _promoted_first(loaded: LoadedSpec, facts: dict[str, NodeFacts], down_s: str) -> None:
    """As a run leaves it that promoted shard 1's replica (TAKEOVER) and stopped: n2 a master of 0-4095 in every
    view, d1 without slots; shard 4's replica's link down for down_s seconds."""
    def moved(line: ClusterNodeLine) -> ClusterNodeLine:
        if line.id == "n2":
            return replace(line, flags=(line.flags - {"slave"}) | {"master"}, master_id=None,
                           slots=(even_slot_ranges(4)[0],))
        return replace(line, slots=()) if line.id == "d1" else line
    for name, f in facts.items():
        if f.cluster_nodes is not None:
            facts[name] = replace(f, cluster_nodes=tuple(moved(line) for line in f.cluster_nodes))
    replica4 = loaded.layout.servers[7].name
    facts[replica4] = replace(facts[replica4], info={**facts[replica4].info, "master_link_down_since_seconds": down_s})


def test_past_the_election_limit_a_majority_gets_a_forced_promotion() -> None:
    """Review 1, finding 1: after one promotion a majority answers again, but shard 4's replica has been cut off
    longer than the cluster lets it ask for a vote (ping 10 s + node timeout 2 s x (validity factor 10 + 1) = 32 s):
    it is never elected, and waiting was a dead end. Now: a FORCE promotion (a vote without the data-age check)."""
    loaded, facts = _fleet({1, 6, 7})
    _promoted_first(loaded, facts, "3600")
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert [(type(s), s.node, s.shard) for s in plan.steps] == [(PromoteReplica, loaded.layout.servers[7].name, 4)]
    step = plan.steps[0]
    assert isinstance(step, PromoteReplica) and step.mode == "force" and "CLUSTER FAILOVER FORCE" in step.reason
    assert "3 of 4 slot-owning masters answer" in step.reason
    assert parse_plan(plan.to_dict(), "plan.json") == plan


def test_within_the_election_limit_a_majority_still_waits() -> None:
    """The same fleet while the replica may still ask (30 s < 32 s): the cluster's own election, as before; the
    refusal names the limit past which apply promotes it itself."""
    loaded, facts = _fleet({1, 6, 7})
    _promoted_first(loaded, facts, "30")
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert "wait for the cluster to promote a replica" in refused.value.hint and "32 s" in refused.value.hint


def test_the_limit_is_the_replicas_own_settings() -> None:
    """node timeout and validity factor from the spec: 1 s x (1 + 1) + ping 10 s = 12 s."""
    data = make_spec("cluster", cluster={"masters": 4, "node_timeout_ms": 1000, "replica_validity_factor": 1})
    loaded = load_dict(data)
    assert _election_limit(loaded, loaded.layout.servers[7]) == 12.0


def test_a_saved_plan_with_an_unknown_promotion_mode_is_refused() -> None:
    loaded, facts = _fleet({1, 6, 7})
    saved = make_plan(loaded, desired(loaded), facts, "d").to_dict()
    saved["steps"][0]["mode"] = "takeover now"
    with pytest.raises(OpsctlError) as refused:
        parse_plan(saved, "plan.json")
    assert "mode 'takeover now' is not one of takeover, force" in str(refused.value)


def test_a_dead_master_that_answers_at_its_old_endpoint_is_not_promoted_over() -> None:
    """Review 1, finding 3: the shell's probe of the old endpoint (a fact named by it) answers: the host is cut off
    from its replicas only, and the promotion is refused (it was assumed silent, never tried)."""
    loaded, facts = _fleet({1, 6, 7})
    was = next(line.endpoint for line in facts[loaded.layout.servers[1].name].cluster_nodes or () if line.id == "d1")
    facts[was] = NodeFacts(was, True, reachable=True, role=RoleInfo("master"))
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert f"{was} answers as master" in refused.value.detail and "answers opsctl" in refused.value.hint
    facts[was] = NodeFacts(was, False, error="Connection refused")  # probed and silent: promoted as before
    assert len(make_plan(loaded, desired(loaded), facts, "d").steps) == 2


def test_the_ping_period_is_the_dead_masters_own() -> None:
    """Review 1, finding 7: repl-ping-replica-period is the master's and per node; shard 1's master overrides it
    to 30 s, so its replica that heard it 20 s ago still hears it (the first orphan's replica's 10 s said gone)."""
    loaded, facts = _fleet({1, 6, 7}, {1: {"repl-ping-replica-period": 30}})
    name = loaded.layout.servers[1].name
    info = {**facts[name].info, "master_link_status": "up", "master_last_io_seconds_ago": "20"}
    facts[name] = replace(facts[name], info=info)
    with pytest.raises(RefusedError) as refused:
        make_plan(loaded, desired(loaded), facts, "d")
    assert "heard from it 20 s ago" in refused.value.detail and "32 s" in refused.value.hint


def test_a_shard_the_cluster_healed_itself_after_the_first_promotion_is_done_not_refused() -> None:
    """Two orphaned shards, no majority: the first promotion gives the masters their majority back and the cluster
    elects the second shard's master itself before its step runs (seen live under load). The second step finds its
    replica following that new master, which serves the gone one's slots: done, not "roles changed"."""
    from opsctl.apply.shape_steps import _elected_meanwhile

    def line(node_id: str, master_id: str | None, slots: tuple[tuple[int, int], ...] = ()) -> ClusterNodeLine:
        flags = frozenset({"master"} if master_id is None else {"slave"}) | ({"myself"} if node_id == "me" else set())
        return ClusterNodeLine(node_id, "127.0.0.1", 7000, 17000, flags, master_id, 0, "connected", slots)

    step = PromoteReplica("t-14", "why", 2, "dead", "127.0.0.3:7001", "5462-9557")
    wanted = set(range(5462, 9558))
    healed = [line("me", "new"), line("new", None, ((5462, 9557),)), line("dead", None, ())]
    assert _elected_meanwhile(healed, healed[0], step, wanted) == healed[1]
    elsewhere = [line("me", "other"), line("other", None, ((0, 5461),))]
    assert _elected_meanwhile(elsewhere, elsewhere[0], step, wanted) is None  # follows a master of another shard
    orphan = [line("me", "dead"), line("dead", None, ((5462, 9557),))]
    assert _elected_meanwhile(orphan, orphan[0], step, wanted) is None  # still the gone master's: promote it
