"""A host removed from the spec is drained (issue 22, item 3): each node on it is replaced on another host by a new
name, its master failed over to a synced member elsewhere first, then forgotten, stopped and purged, under a
concurrent writer. Refused before anything changes when the records lack the address. Real servers on loopback."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.test_fleet_shape import records
from tests.test_scale_cluster import kept_everything
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def record_files(spec: Path) -> dict[str, Path]:
    state = spec.parent / ".opsctl" / yaml.safe_load(spec.read_text())["name"]
    return {p.parent.name: p for p in state.glob("*/opsctl-node.json")}


def live_members_apart(spec: Path) -> None:
    """No shard has two live (not retired) members on one host, as the nodes' records say."""
    by_shard: dict[object, list[object]] = {}
    for path in record_files(spec).values():
        record = json.loads(path.read_text())
        if not record.get("retired"):
            by_shard.setdefault(record["deployed"]["shard"], []).append(record["deployed"]["host"])
    for shard, hosts in by_shard.items():
        assert len(hosts) == len(set(hosts)) == 2, f"shard {shard}: {hosts}"


def test_records_without_addresses_or_too_few_hosts_are_refused_before_anything_changes(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        before = records(spec)
        assert all(r["address"] for r in before.values())  # every config write records the address
        too_few = {**data, "hosts": data["hosts"][:1]}
        spec.write_text(yaml.safe_dump(too_few))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "anti-affinity" in err and "replicas_per_master" in err and "Traceback" not in err, \
            err + out
        for path in record_files(spec).values():  # records written before addresses were kept
            record = json.loads(path.read_text())
            record["deployed"].pop("address")
            path.write_text(json.dumps(record))
        spec.write_text(yaml.safe_dump({**data, "hosts": [h for h in data["hosts"] if h["name"] != "h2"]}))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "do not say at which address" in err and "put the host back" in err, err + out
        assert {k: {f: v for f, v in r.items() if f != "address"} for k, r in before.items()} == records(spec)
        spec.write_text(yaml.safe_dump(data))
        assert plan_json(capsys, spec)["steps"] == []


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_host_replaced_in_the_spec_is_drained_and_nothing_is_lost(tmp_path, capsys, flavor) -> None:
    """hosts h1, h2, h3 -> h1, h3, h4 in one edit: h2's master and replica are replaced on h4 and h1/h3."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        before_records = records(spec)
        on_h2 = sorted(n for n, r in before_records.items() if r["host"] == "h2")
        fourth = data["hosts"][0]["address"].rsplit(".", 1)[0] + ".4"
        moved = {**data, "hosts": [*(h for h in data["hosts"] if h["name"] != "h2"),
                                   {"name": "h4", "address": fourth}]}
        preload(loaded, 4000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        with Writer(lambda: cluster_client(read_spec(spec))) as writer:
            writer.wait_for_writes(100)
            spec.write_text(yaml.safe_dump(moved))
            code, out, err = run(capsys, "plan", "-f", str(spec))
            assert code == 2, err + out
            assert "failover" in out and "h2 removed from the spec" in out, out
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0 and "3 masters" in out, err + out
            assert "move-slots" not in err + out, err + out  # failed over, never drained of its slots
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        after = records(spec)
        for name, was in before_records.items():
            if name not in on_h2:
                assert after[name] == was, (name, was, after[name])
        folders = spec.parent / ".opsctl" / data["name"]
        for name in on_h2:
            assert [p.name for p in (folders / name).iterdir()] == ["opsctl-node.json"]  # purged: a tombstone
            assert json.loads((folders / name / "opsctl-node.json").read_text())["retired"] is True
        live_members_apart(spec)
        assert not any(r["host"] == "h2" for n, r in after.items() if n not in on_h2)
        kept_everything(spec, writer, before, "3 masters")
        with capsys.disabled():  # the figures for the closing note
            print(f"\ndrain {flavor}: keys {before[0]}, writes acknowledged {len(writer.acked)}, lost 0, "
                  f"apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)
