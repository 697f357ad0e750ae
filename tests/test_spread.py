"""Moving members to even out a cluster's load over its hosts (issue 22, item 2): the fewest moves, anti-affinity
kept, masters spread, deterministic, each with its reason; a move stopped part way is finished by the next placement,
not redone; placement then places each move as a drain for load. Pure."""

from __future__ import annotations

import random

import pytest

from opsctl.base.errors import RefusedError
from opsctl.plan.facts import Facts
from opsctl.plan.shape import drained, summary
from opsctl.plan.spread import placement_moves, rebalancing, with_rebalancing
from opsctl.plan.steps import Failover, RemoveNode, StartNode, WaitConverged
from opsctl.spec.layout import Layout, cluster_layout
from opsctl.spec.model import Spec
from opsctl.spec.placement import Deployed, Move, placed_layout
from tests.test_placement import records_of, spec_with
from tests.test_planner import load_dict


def hosts(n: int) -> list[dict[str, str]]:
    return [{"name": f"h{i}", "address": f"127.0.0.{i + 1}"} for i in range(1, n + 1)]


def cluster(n_hosts: int, masters: int = 3, replicas: int = 1, rebalance: bool = True) -> Spec:
    data = spec_with(masters=masters, replicas_per_master=replicas)
    data["cluster"]["rebalance_placement"] = rebalance
    return load_dict({**data, "hosts": hosts(n_hosts)}).spec


def deployed_on(spec_hosts: int, masters: int = 3, replicas: int = 1) -> list[Deployed]:
    """What a first deploy over spec_hosts hosts leaves (the positional layout)."""
    return records_of(cluster_layout(cluster(spec_hosts, masters, replicas)))


def after(deployed: list[Deployed], moves: tuple[Move, ...]) -> dict[str, Deployed]:
    """The members once the moves are done (a replacement takes the moved member's place on the target)."""
    out = {d.name: d for d in deployed if not d.retired}
    for m in moves:
        old = out.pop(m.name)
        if m.target:
            out[f"new-{m.name}"] = Deployed(f"new-{m.name}", m.target, 0, "replica", old.shard)
    return out


def loads(spec: Spec, members: dict[str, Deployed]) -> list[int]:
    return [sum(1 for d in members.values() if d.host == h.name) for h in spec.hosts]


def apart(members: dict[str, Deployed]) -> bool:
    pairs = [(d.shard, d.host) for d in members.values()]
    return len(pairs) == len(set(pairs))


def test_two_hosts_added_to_three_masters_by_one_replica_take_one_member_each() -> None:
    spec = cluster(5)
    deployed = deployed_on(3)
    moves = placement_moves(spec, deployed)
    assert [(m.source, m.target) for m in moves] == [("h1", "h4"), ("h2", "h5")]
    assert all(d.role == "replica" for d in deployed if d.name in {m.name for m in moves})  # no failover needed
    assert moves[0].reason == f"{moves[0].name} on h1: moved to h4 to even out load (h1 2 members, h4 0)"
    done = after(deployed, moves)
    assert sorted(loads(spec, done)) == [1, 1, 1, 1, 2] and apart(done)
    assert placement_moves(spec, deployed) == moves  # deterministic
    assert placement_moves(spec, list(done.values())) == ()  # the next plan moves nothing


def test_nothing_moves_unless_asked_or_when_even() -> None:
    spec = cluster(3)
    assert placement_moves(spec, deployed_on(3)) == ()
    assert not rebalancing(cluster(5, rebalance=False))
    assert rebalancing(with_rebalancing(load_dict({**spec_with(), "hosts": hosts(5)})).spec)


def test_a_master_moves_only_when_its_host_holds_nothing_else_to_move() -> None:
    """h1 serves every master (failovers moved them there), h2 their replicas; h3 and h4 added: one member moves
    off each, off h1 a master (failed over to its replica on h2 first), off h2 then a replica, masters spread."""
    spec = cluster(4)
    name = [f"{spec.name}-{k}" for k in range(1, 7)]
    deployed = [Deployed(name[2 * s], "h2", 7101 + 2 * s, "master", s + 1) for s in range(3)] + \
        [Deployed(name[2 * s + 1], "h1", 7102 + 2 * s, "replica", s + 1) for s in range(3)]
    serving = {name[1], name[3], name[5]}
    moves = placement_moves(spec, deployed, serving)
    assert [(m.name, m.source, m.target) for m in moves] == [(name[1], "h1", "h3"), (name[2], "h2", "h4")]
    assert "(h1 3 members, h3 0)" in moves[0].reason
    plain = placement_moves(spec, deployed)  # without word from the cluster the recorded roles count
    assert [(m.source, m.target) for m in plain] == [("h1", "h3"), ("h2", "h4")] and plain[0].name == name[1]


def test_a_move_stopped_after_its_replacement_was_deployed_is_finished_not_redone() -> None:
    spec = cluster(5)
    deployed = deployed_on(3)
    moves = placement_moves(spec, deployed)
    first = placed_layout(spec, deployed, moves=moves)
    new = {n.name: n for n in first.servers if n.name not in {d.name for d in deployed}}
    assert sorted(n.host for n in new.values()) == ["h4", "h5"]
    for m in moves:  # killed once every replacement ran: the re-run retires the moved ones, places nothing new
        midway = [*deployed, *records_of(Layout(tuple(new.values())))]
        again = placement_moves(spec, midway)
        assert {a.name for a in again} == {m.name for m in moves} and all(not a.target for a in again)
        placed = placed_layout(spec, midway, moves=again)
        assert {n.name for n in placed.servers} == {n.name for n in first.servers}
        assert set(placed.moved) == {m.name for m in moves}
    started = sorted(new.values(), key=lambda n: n.name)[0]
    one = [*deployed, *records_of(Layout((started,)))]
    again = placement_moves(spec, one)  # killed after one replacement: that move finishes, the other is planned
    assert sorted((a.name, a.target) for a in again) == sorted((m.name, "" if m.shard == started.shard else m.target)
                                                               for m in moves)


def test_placement_places_a_move_as_a_drain_for_load() -> None:
    spec = cluster(5)
    deployed = deployed_on(3)
    moves = placement_moves(spec, deployed)
    placed = placed_layout(spec, deployed, moves=moves)
    assert placed.moved == tuple(sorted(m.name for m in moves))
    assert [n.name for n in drained(spec, placed)] == list(placed.moved)
    for m in moves:
        new = next(n for n in placed.servers if n.host == m.target)
        assert new.shard == m.shard and new.role == "replica" and new.name in (f"{spec.name}-7", f"{spec.name}-8")
        assert placed.reason(new.name) == f"{new.name} on {m.target}: replaces {m.name} of shard {m.shard} " \
                                          f"(moved off {m.source})"
        assert placed.reason(m.name) == f"{m.reason}: replaced by {new.name}, synced, then retired"
    for d in deployed:
        if d.name not in placed.moved:
            node = placed.node(d.name)
            assert (node.host, node.port, node.shard) == (d.host, d.port, d.shard)


def test_the_summary_counts_the_moves() -> None:
    spec = cluster(5)
    placed = placed_layout(spec, deployed_on(3), moves=placement_moves(spec, deployed_on(3)))
    new = [n.name for n in placed.servers if n.host in ("h4", "h5")]
    steps = [*(StartNode(n, "new node") for n in new), *(RemoveNode(n, "retired", True) for n in placed.moved),
             WaitConverged(placed.nodes[0].name, "wait until every node agrees")]  # a wait is no change
    facts: Facts = {}
    from opsctl.plan.facts import NodeFacts

    for n in [*placed.servers, *placed.retired]:
        facts[n.name] = NodeFacts(n.name, n.name not in new)
    assert summary(placed, facts, steps) == "2 to move, 2 to add, 2 to retire, 4 unchanged"
    assert summary(placed, facts, [Failover(placed.moved[0], "x", shard=1)]).startswith("1 to move")


@pytest.mark.parametrize("seed", range(60))
def test_property_even_apart_fewest(seed: int) -> None:
    """Random fleets (hosts added, members piled by failovers and old placements): after the moves, no shard has
    two members on a host, per-host load is within one where anti-affinity allows, and the count of moves is the
    least any plan could make when nothing blocks."""
    rng = random.Random(seed)
    n_hosts, masters, replicas = rng.randint(3, 7), rng.randint(3, 8), rng.randint(1, 2)
    spec = cluster(n_hosts, masters, replicas)
    crowded = rng.sample([h.name for h in spec.hosts], k=max(replicas + 1, rng.randint(replicas + 1, n_hosts)))
    deployed, k = [], 1
    for shard in range(1, masters + 1):
        for r, host in enumerate(rng.sample(crowded, replicas + 1)):
            deployed.append(Deployed(f"{spec.name}-{k}", host, 7100 + k, "master" if r == 0 else "replica", shard))
            k += 1
    moves = placement_moves(spec, deployed)
    assert placement_moves(spec, deployed) == moves
    done = after(deployed, moves)
    assert apart(done)
    assert placement_moves(spec, list(done.values())) == ()
    spread = loads(spec, done)
    before = loads(spec, {d.name: d for d in deployed})
    total, n = sum(before), len(before)
    q, extra = divmod(total, n)
    bound = sum(max(0, x - q) for x in before) - min(extra, sum(1 for x in before if x > q))
    if max(spread) - min(spread) <= 1:
        assert len(moves) == bound, (before, spread, moves)
    else:  # blocked: every host two below the top holds a member of each shard on the top hosts
        assert masters * (replicas + 1) > 0 and len(moves) <= bound
    for m in moves:
        assert m.reason.startswith(f"{m.name} on {m.source}: moved to {m.target} to even out load (")


def test_placement_rebalance_refuses_slot_weights_before_reading_anything(capsys) -> None:
    from opsctl.cli.main import main

    code = main(["cluster", "rebalance", "--placement", "--weight", "t-1=2", "-f", "missing.yaml", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 1 and "--placement moves members" in err and "Traceback" not in err, err


def test_a_failover_under_way_counts_the_recorded_roles() -> None:
    """Shard 3's replica on h1 was just promoted (both members still say master, a moment after CLUSTER FAILOVER,
    a run killed there): the recorded roles decide, so the re-run moves the same member as the killed run."""
    spec = cluster(4)
    name = [f"{spec.name}-{k}" for k in range(1, 7)]
    deployed = deployed_on(3)
    first = placement_moves(spec, deployed, {name[0], name[2], name[5]})  # shard 3 failed over to h1 earlier
    assert [m.name for m in first] == [name[5]]
    assert placement_moves(spec, deployed, {name[0], name[2], name[4], name[5]}) == (
        placement_moves(spec, deployed, {name[0], name[2], name[4]}))
    assert [m.name for m in placement_moves(spec, deployed, {name[0], name[2], name[4], name[5]})] == [name[5]]


def test_a_moved_master_fails_over_first_and_is_refused_while_a_failover_is_under_way() -> None:
    """The moved member serves its shard: a graceful failover first (the drain's). When its shard's other member
    says it serves the same slots too (a run killed after CLUSTER FAILOVER was asked, the old master's view not
    updated yet), refused (exit 3): slots moved off the stale master failed on real servers ("atomic slot migration
    failed"); the shell waits for one master per shard before it places, so a re-run meets this only past that."""
    from opsctl.plan.shape import drain_failovers
    from tests.test_planner import formed_cluster

    three = load_dict({**spec_with(), "hosts": hosts(3)})
    name = [f"{three.spec.name}-{k}" for k in range(1, 7)]
    before, swapped = formed_cluster(three), formed_cluster(three, swap_shard=3)  # shard 3's master: name[5], on h1
    spec = cluster(4)
    moves = placement_moves(spec, deployed_on(3), {name[0], name[2], name[5]})
    placed = placed_layout(spec, deployed_on(3), {name[0], name[2], name[5]}, moves)
    assert placed.moved == (name[5],)
    assert [type(s) for s in drain_failovers(spec, placed, swapped)] == [Failover]
    under_way = {**swapped, name[4]: before[name[4]]}  # name[4] promoted, name[5] still says it is the master
    with pytest.raises(RefusedError, match="both say they serve shard 3's slots"):
        drain_failovers(spec, placed, under_way)


def test_a_moved_members_removal_says_why_without_not_in_the_spec() -> None:
    from opsctl.plan.shape import with_placement_reasons

    spec = cluster(5)
    placed = placed_layout(spec, deployed_on(3), moves=placement_moves(spec, deployed_on(3)))
    gone = placed.moved[0]
    step = RemoveNode(gone, "not in the spec any more (3 shards): stop it, then forget it on every node", True)
    (said,) = with_placement_reasons(placed, [step])
    assert said.reason == f"{placed.reason(gone)}: stop it, then forget it on every node"
    assert "moved to h" in said.reason and "not in the spec" not in said.reason


def test_no_move_while_the_shape_changes_in_the_same_run_then_the_rest_is_evened() -> None:
    """h4, h5 and replicas_per_master 1 -> 2 in one edit: this run only adds the new replicas (on the least loaded
    hosts); the next one evens out what is left, if anything."""
    spec = cluster(5, replicas=2)
    deployed = deployed_on(3)
    assert placement_moves(spec, deployed) == ()
    placed = placed_layout(spec, deployed)
    after_run = records_of(placed)
    done = after(after_run, placement_moves(spec, after_run))
    spread = loads(spec, done)
    assert max(spread) - min(spread) <= 1 and apart(done)
