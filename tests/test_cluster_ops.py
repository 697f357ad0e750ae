"""form_cluster on real Valkey 9.1 and Redis 7.0, judged by redis-cli --cluster check; observe() with a node down;
`opsctl cluster check` exit codes and output."""

from __future__ import annotations

import json
import time

import pytest

from opsctl.base.errors import ConvergenceError, RefusedError
from opsctl.cli.main import main
from opsctl.cluster.ops import (
    config_epochs,
    expected_lines,
    first_meets,
    form_cluster,
    loads_from_disk,
    missing_or_stale,
    replica_meets,
    setup_commands,
    slot_plan,
    stale_senders,
)
from opsctl.net.connector import Connector
from opsctl.net.observer import observe, wait_cluster_converged
from opsctl.observe.replies import parse_cluster_nodes
from opsctl.state.specfile import read_spec
from tests.fixtures.servers import launch, servers  # noqa: F401  (fixture)
from tests.support import cluster_check, make_spec, write_spec


def test_slot_commands_are_single_round_trips():
    assert setup_commands(3, [(0, 5460), (5461, 5461)], True) == [("CLUSTER", "SET-CONFIG-EPOCH", 3),
                                                                  ("CLUSTER", "ADDSLOTSRANGE", 0, 5460, 5461, 5461)]
    assert setup_commands(3, [(0, 2)], False)[1] == ("CLUSTER", "ADDSLOTS", 0, 1, 2)  # Redis 6.2
    assert setup_commands(1, [], True) == [("CLUSTER", "SET-CONFIG-EPOCH", 1)]  # a replica: no slots
    assert loads_from_disk(["repl-diskless-load", "disabled"])
    assert not loads_from_disk(["repl-diskless-load", "swapdb"]) and not loads_from_disk([])


def test_every_replica_s_config_epoch_is_below_every_master_s(tmp_path):
    loaded = read_spec(write_spec(tmp_path, make_spec("cluster", cluster={"masters": 3, "replicas_per_master": 2})))
    layout = loaded.layout
    epochs = config_epochs(layout)
    masters = {shard.master for shard in layout.shards}
    assert sorted(epochs.values()) == list(range(1, 10))  # distinct: equal epochs of two masters collide
    assert max(e for n, e in epochs.items() if n not in masters) < min(e for n, e in epochs.items() if n in masters)


def test_meets_and_slot_plan(tmp_path):
    """Masters meet each other and each replica its own master first; replicas meet the rest once they replicate.
    Every pair of nodes meets once over both passes."""
    loaded = read_spec(write_spec(tmp_path, make_spec("cluster", cluster={"masters": 3, "replicas_per_master": 2})))
    layout = loaded.layout
    first, then = first_meets(layout), replica_meets(layout)
    for shard in layout.shards:
        assert all([n.name for n in first[r]] == [shard.master] for r in shard.replicas)
    masters = [s.master for s in layout.shards]
    assert {m: [n.name for n in first[m]] for m in masters} == {m: masters[i + 1:] for i, m in enumerate(masters)}
    pairs = [frozenset((a, n.name)) for meets in (first, then) for a, targets in meets.items() for n in targets]
    servers_ = [n.name for n in layout.servers]
    assert len(pairs) == len(set(pairs)) == len(servers_) * (len(servers_) - 1) // 2
    assert all(a != b for a, b in map(tuple, pairs))
    loaded = read_spec(write_spec(tmp_path, make_spec("cluster")))
    plan = slot_plan(loaded.layout)
    assert [plan[s.master] for s in loaded.layout.shards] == [[(0, 5461)], [(5462, 10922)], [(10923, 16383)]]


def _line(node_id: str, port: int, flags: str, master: str = "-", slots: str = "") -> str:
    return f"{node_id} 127.0.0.1:{port}@{port + 10000} {flags} {master} 0 0 1 connected {slots}".strip()


def test_stale_senders_name_the_nodes_a_view_shows_wrong(tmp_path):
    """A node seen with other slots or another role than the layout's MEETs the viewer again; a node not in the
    view yet (handshake under way) is not counted."""
    m, r, o = "m" * 40, "r" * 40, "o" * 40
    expected = {m: (None, ((0, 16383),)), r: (m, ()), o: (None, ())}
    assert stale_senders(parse_cluster_nodes("\n".join([
        _line(m, 1, "myself,master", slots="0-16383"), _line(r, 2, "slave", m), _line(o, 3, "master")])),
        expected) == []
    assert stale_senders(parse_cluster_nodes("\n".join([
        _line(o, 3, "myself,master"), _line(m, 1, "master"), _line(r, 2, "master")])), expected) == [m, r]
    assert stale_senders(parse_cluster_nodes(_line(o, 3, "myself,master")), expected) == []
    # what the convergence counts as left: the expected nodes a view does not show as expected
    assert missing_or_stale(parse_cluster_nodes(_line(o, 3, "myself,master")), expected) == 2
    assert missing_or_stale(parse_cluster_nodes("\n".join([
        _line(o, 3, "myself,master"), _line(m, 1, "master"), _line(r, 2, "master")])), expected) == 2
    assert missing_or_stale(parse_cluster_nodes("\n".join([
        _line(m, 1, "myself,master", slots="0-16383"), _line(r, 2, "slave", m), _line(o, 3, "master")])),
        expected) == 0
    layout = read_spec(write_spec(tmp_path, make_spec("cluster"))).layout
    ids = {n.name: n.name.ljust(40, "x") for n in layout.servers}
    lines = expected_lines(layout, ids)
    shard = layout.shards[1]
    assert lines[ids[shard.master]] == (None, ((5462, 10922),))
    assert lines[ids[shard.replicas[0]]] == (ids[shard.master], ())


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_form_check_and_observe_with_a_node_down(flavor, tmp_path, servers, capsys):  # noqa: F811
    spec_file = write_spec(tmp_path, make_spec("cluster", flavor))
    loaded = read_spec(spec_file)
    group = launch(servers, loaded, tmp_path)
    started = time.monotonic()
    form_cluster(Connector(loaded), loaded.layout)
    formed = time.monotonic() - started
    referee = cluster_check(loaded.layout.servers[0].endpoint)
    assert referee.returncode == 0, referee.stdout + referee.stderr
    assert formed < 10, formed

    assert main(["cluster", "check", "-f", str(spec_file)]) == 0
    out = capsys.readouterr().out
    assert "coverage: 16384/16384" in out and "open slots: none" in out and "cluster ok" in out
    assert main(["cluster", "check", "-f", str(spec_file), "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] and report["agreeing"] == 6 and len(report["shards"]) == 3

    with pytest.raises(RefusedError, match="not a fresh empty cluster node"):
        form_cluster(Connector(loaded), loaded.layout)

    victim = loaded.layout.servers[-1]
    group.stop(victim)
    seen = observe(Connector(loaded), loaded.layout.servers, timeout=1.0)
    assert not seen[victim.name].reachable and seen[victim.name].error
    others = [o for name, o in seen.items() if name != victim.name]
    assert all(o.reachable and o.cluster_nodes and o.role for o in others)
    assert all(o.info.get("cluster_state") for o in others)

    with pytest.raises(ConvergenceError) as caught:
        wait_cluster_converged(Connector(loaded), loaded.layout.servers, timeout=0.2)
    assert f"{victim.name}: unreachable" in caught.value.detail
    assert main(["cluster", "check", "-f", str(spec_file)]) == 1
    assert f"{victim.name}: unreachable" in capsys.readouterr().out
