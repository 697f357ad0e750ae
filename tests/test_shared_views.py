"""The planner's questions over every node's CLUSTER NODES view at the cost of the distinct lines, not n² (issue 35,
the simulated 1000-node plan): views parsed as a look parses them share one object per line, lines_where asks its
question once per object and passes healthy views over; its answers are the plain comprehension's, for shared and
for unshared views; the dead-node and lost-master checks find a failed node in parsed views; the cluster judgement
(status) of parsed views is that of the same views built apart."""

from __future__ import annotations

from opsctl.cluster.deadnodes import dead_nodes, lost_masters
from opsctl.observe.cluster_state import cluster_problems
from opsctl.observe.replies import ClusterNodeLine, distinct_lines, lines_where, parse_cluster_nodes
from opsctl.plan.facts import NodeFacts
from opsctl.spec.layout import Layout, Node, Shard

N = 40


def node_id(i: int) -> str:
    return f"{i:040x}"


def line(i: int, me: int, failed: frozenset[int] = frozenset()) -> str:
    """Node i's line as node me lists it: masters 0..N/2-1 serve a slot range each, the rest replicate them."""
    flags = ",".join([*(["myself"] if i == me else []), "master" if i < N // 2 else "slave",
                      *(["fail"] if i in failed else [])])
    master = "-" if i < N // 2 else node_id(i - N // 2)
    slots = f" {i * 100}-{i * 100 + 99}" if i < N // 2 else ""
    return f"{node_id(i)} 10.0.0.{i}:7000@17000 {flags} {master} 0 0 {i} connected{slots}"


def views(failed: frozenset[int] = frozenset()) -> list[list[ClusterNodeLine]]:
    """Every node's view, parsed as a look parses it (the failed ones give none: down)."""
    return [parse_cluster_nodes("\n".join(line(i, me, failed) for i in range(N)))
            for me in range(N) if me not in failed]


def test_parsed_views_share_their_lines_and_the_question_is_asked_once_per_line() -> None:
    seen = views()
    asked: list[ClusterNodeLine] = []

    def keep(item: ClusterNodeLine) -> bool:
        asked.append(item)
        return "fail" in item.flags

    assert list(lines_where(seen, keep)) == []
    assert len(asked) == len(distinct_lines(seen)) == 2 * N  # each node's own line and its line as others list it
    assert len(asked) < N * N // 10


def test_the_answers_are_the_plain_comprehension_s() -> None:
    shared = views(frozenset({3, 25}))
    unshared = [[ClusterNodeLine(**{f: getattr(x, f) for f in ClusterNodeLine.__dataclass_fields__}) for x in view]
                for view in shared]  # built one object per view and line (as tests build facts)
    for seen in (shared, unshared, [*shared[:2], None, [], *shared[2:]]):
        def keep(item: ClusterNodeLine) -> bool:
            return item.is_failing or item.id == node_id(7)

        plain = [x for view in seen for x in view or () if keep(x)]
        assert list(lines_where(seen, keep)) == plain
        assert {x.id for x in distinct_lines(seen)} == {x.id for view in seen for x in view or ()}


def test_a_failed_master_gone_with_its_host_is_found_in_parsed_views() -> None:
    """Node 3 (a master) and node 25 (a replica) fail at addresses the spec no longer has: both are dead, the
    master also lost (its slots served by no one that answers)."""
    failed = frozenset({3, 25})
    nodes = tuple(Node(f"t-{i}", f"h{i}", f"10.1.0.{i}", 7000, "master" if i < N // 2 else "replica",
                       i % (N // 2) + 1) for i in range(N))
    layout = Layout(nodes, tuple(Shard(s + 1, f"t-{s}", (f"t-{s + N // 2}",)) for s in range(N // 2)))
    seen = views(failed)
    facts = {f"t-{me}": NodeFacts(f"t-{me}", True, reachable=True, cluster_nodes=tuple(view))
             for me, view in zip((m for m in range(N) if m not in failed), seen, strict=True)}
    assert dead_nodes(layout, facts) == {node_id(25): "10.0.0.25:7000"}  # a master serving slots is not forgotten
    assert list(lost_masters(layout, facts)) == [node_id(3)]


def test_the_cluster_judgement_of_parsed_views_is_that_of_views_built_apart() -> None:
    """cluster_problems skips the views that see every role right and reads endpoints once per object: with a failed
    node and a view that sees a replica under another master, its findings are those of the same views built apart
    (one object per view and line: every line asked)."""
    texts = {me: [line(i, me, frozenset({25})) for i in range(N)] for me in range(N) if me != 25}
    texts[4][30] = texts[4][30].replace(f" {node_id(10)} ", f" {node_id(11)} ")  # 4 sees 30 under the wrong master
    shared = {f"t-{me}": parse_cluster_nodes("\n".join(lines)) for me, lines in texts.items()}
    apart = {name: [ClusterNodeLine(**{f: getattr(x, f) for f in ClusterNodeLine.__dataclass_fields__})
                    for x in view] for name, view in shared.items()}
    found = [p.render() for p in cluster_problems(shared, {})]
    assert found == [p.render() for p in cluster_problems(apart, {})]
    assert any(p.startswith("t-4: sees 10.0.0.30:7000 (t-30) as a replica of 10.0.0.11:7000 (t-11)") for p in found)
    assert any("as fail" in p for p in found)
