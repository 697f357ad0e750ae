"""Where monitoring meets a fleet that changed shape (issue 33, items 1 and 2), on real servers with
metrics.exporter: a 3 x 1 cluster grown by a host and replicas_per_master 1 -> 2 lists exactly the nodes deployed,
each answering redis_up 1 through its exporter; the drain back to 1 replica stops the retired nodes' exporters;
`destroy` stops an exporter beside a server that is down; `destroy --purge` leaves no node, record or exporter of the
topology, so the next apply deploys the same names on the same ports as the first. `cluster check` looks at the
nodes deployed too."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from opsctl.base.poll import wait_for
from opsctl.metrics.exporter import EXPORTER_BINARY
from opsctl.net.connector import port_accepts
from opsctl.slots.journal import JOURNAL
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, cluster_check
from tests.test_fleet_shape import records
from tests.test_metrics_exporter_live import _needs, _redis_up

pytestmark = pytest.mark.integration
OFFSET = 1000  # metrics.port_offset's default


def _targets(capsys: pytest.CaptureFixture[str], spec: Path, *extra: str) -> dict[str, str]:
    """`metrics targets` as node -> its exporter's address:port."""
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), *extra)
    assert code == 0, err
    return {g["labels"]["node"]: g["targets"][0] for g in json.loads(out)}


def _scrape(target: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def _exporter(record: dict[str, object]) -> tuple[str, int]:
    return str(record["address"]), int(str(record["port"])) + OFFSET


def _live(spec: Path) -> dict[str, dict[str, object]]:
    """The deployed placement of each node that is no tombstone, as the records say."""
    state = spec.parent / ".opsctl" / yaml.safe_load(spec.read_text())["name"]
    return {name: placed for name, placed in records(spec).items()
            if not json.loads((state / name / "opsctl-node.json").read_text()).get("retired")}


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_targets_follow_the_fleet_and_a_purge_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            flavor: str) -> None:
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    with deployed(tmp_path, capsys, "cluster", flavor, metrics={"exporter": True}) as (spec, _loaded):
        first_text = spec.read_text()
        first = records(spec)
        data = yaml.safe_load(first_text)
        state = spec.parent / ".opsctl" / data["name"]
        fourth = data["hosts"][0]["address"].rsplit(".", 1)[0] + ".4"
        grown = {**data, "hosts": [*data["hosts"], {"name": "h4", "address": fourth}],
                 "cluster": {**data["cluster"], "replicas_per_master": 2}}
        spec.write_text(yaml.safe_dump(grown))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out

        # item 1: exactly the nodes deployed, where they run, each one's exporter answering redis_up 1
        live = _live(spec)
        targets = _targets(capsys, spec)
        assert len(live) == 9 and targets == {name: f"{p['address']}:{int(str(p['port'])) + OFFSET}"
                                              for name, p in live.items()}, (targets, live)
        assert {name: _redis_up(_scrape(target)) for name, target in targets.items()} == dict.fromkeys(live, "1")
        code, out, err = run(capsys, "cluster", "check", "-f", str(spec))  # the nodes deployed, not a fresh deploy's
        assert code == 0 and "9 nodes" in out, err + out
        elsewhere = tmp_path / "elsewhere"  # the same spec beside another folder: --state-dir names the records
        elsewhere.mkdir()
        (elsewhere / "topology.yaml").write_text(spec.read_text())
        assert _targets(capsys, elsewhere / "topology.yaml", "--state-dir", str(state)) == targets

        # the drain back to one replica stops each retired node's exporter with it
        spec.write_text(yaml.safe_dump({**grown, "cluster": {**grown["cluster"], "replicas_per_master": 1}}))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        retired = sorted(set(records(spec)) - set(_live(spec)))
        assert len(retired) == 3, records(spec)
        assert [n for n in retired if port_accepts(*_exporter(records(spec)[n]))] == []
        targets = _targets(capsys, spec)
        assert sorted(targets) == sorted(_live(spec)) and all(_redis_up(_scrape(t)) == "1" for t in targets.values())

        # destroy stops the exporter beside a server that is down (it is no node destroy stops)
        down = next(iter(_live(spec)))
        os.kill(int((state / down / "server.pid").read_text()), signal.SIGKILL)
        server = (str(records(spec)[down]["address"]), int(str(records(spec)[down]["port"])))
        wait_for(lambda: None if port_accepts(*server) else True, CONDITION_BOUND, f"{down} to be down")
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve")
        assert code == 0 and f"stopped the redis_exporter of {down}" in err + out, err + out
        assert [n for n, r in records(spec).items() if port_accepts(*_exporter(r))] == []

        # item 2: the purge leaves no node folder, tombstone or exporter; the first spec deploys as the first time
        known = records(spec)
        journal = state / JOURNAL  # what a scale-out's fills leave: it names this cluster's shards and masters
        journal.write_text(json.dumps({"op": "filled", "shards": [1]}) + "\n")
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 0, err + out
        assert sorted(p.name for p in state.iterdir() if p.name.startswith(data["name"] + "-")) == []
        assert not journal.exists()
        assert [n for n, r in known.items() if port_accepts(*_exporter(r))] == []
        spec.write_text(first_text)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert records(spec) == first
        assert sorted(_targets(capsys, spec)) == sorted(first)
        assert plan_json(capsys, spec)["steps"] == []
        check = cluster_check(read_spec(spec).layout.nodes[0].endpoint)
        assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_replica_retired_from_replication_takes_its_exporter_and_a_purge_its_tombstone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flavor: str) -> None:
    """replication.replicas [h2] -> [h2, h3] -> [h2] with exporters (the replication and Sentinel drain's own step):
    the added replica is a target answering redis_up 1, its retirement stops its exporter, and after `destroy
    --purge` the first spec deploys its first names again (a tombstone left behind made them t-4 and t-5)."""
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    with deployed(tmp_path, capsys, "replication", flavor, replication={"replicas": ["h2"]},
                  metrics={"exporter": True}) as (spec, _loaded):
        first_text = spec.read_text()
        first = records(spec)
        data = yaml.safe_load(first_text)
        for replicas in (["h2", "h3"], ["h2"]):
            spec.write_text(yaml.safe_dump({**data, "replication": {**data["replication"], "replicas": replicas}}))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
            targets = _targets(capsys, spec)
            assert sorted(targets) == sorted(_live(spec)) and len(targets) == len(replicas) + 1, targets
            assert all(_redis_up(_scrape(t)) == "1" for t in targets.values()), targets
        third = f"{data['name']}-3"
        assert third in records(spec) and third not in _live(spec)
        assert not port_accepts(*_exporter(records(spec)[third]))
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--auto-approve", "--purge")
        assert code == 0 and f"purged the data of {third}" in err + out, err + out
        spec.write_text(first_text)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert records(spec) == first


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_parked_shard_takes_its_exporters_and_brings_them_back(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 flavor: str) -> None:
    """cluster.masters 3 -> 4 -> 3 -> 4 with exporters: the fourth shard's nodes, parked (stopped, records kept), stop
    their exporters with them and are no targets; back with the same names, their exporters answer again."""
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    with deployed(tmp_path, capsys, "cluster", flavor, metrics={"exporter": True}) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        for masters in (4, 3, 4):
            spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": masters}}))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
            targets = _targets(capsys, spec)
            assert len(targets) == 2 * masters and all(_redis_up(_scrape(t)) == "1" for t in targets.values())
            parked = sorted(set(records(spec)) - set(targets))
            assert len(parked) == 2 * (4 - masters), (parked, targets)
            assert [n for n in parked if port_accepts(*_exporter(records(spec)[n]))] == []
