"""Scale a cluster through the spec (masters 3 -> 4 -> 3) with a concurrent writer, on Valkey 9.1 and Redis 7.0."""

from __future__ import annotations

import pytest
import yaml

from opsctl.cli import main
from opsctl.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import cluster_check
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_scale_out_then_in_loses_nothing(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        try:
            preload(loaded, 4000)
            client = cluster_client(loaded)
            before = dataset_checksum(client, "pre:*")
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(100)
                spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": 4}}))
                plan = plan_json(capsys, spec)
                moves = [s for s in plan["steps"] if s["kind"] == "move-slots"]
                assert {m["target"] for m in moves} == {f"{loaded.spec.name}-7"}
                assert sum(m["slot_count"] for m in moves) == 4096 and all(m["est_keys"] > 0 for m in moves)
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []

                spec.write_text(yaml.safe_dump(data))
                plan = plan_json(capsys, spec)
                kinds = [s["kind"] for s in plan["steps"]]
                assert kinds == ["move-slots"] * 3 + ["remove-node"] * 2 + ["wait-converged"], kinds
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "3 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            client = cluster_client(read_spec(spec))
            assert writer.verify(client) == []
            assert dataset_checksum(client, "pre:*") == before
            check = cluster_check(loaded.layout.servers[0].endpoint)
            assert check.returncode == 0 and "3 masters" in check.stdout, check.stdout
        finally:  # also stop the fourth shard's nodes if the test failed half way
            spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": 4}}))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()



def test_a_scale_with_a_restart_only_change_fails_over_each_master_first_and_loses_nothing(tmp_path, capsys) -> None:
    """One apply adds a shard and changes io-threads (a restart: a failover before each master's), one removes it
    and changes it back. The plan fails every master over before it starts and joins the new nodes (or drains and
    removes the old ones); the failover's pre-checks took the spec's servers for the cluster's, and the first one
    timed out: 'cluster-agrees: t-7: unreachable; t-8: unreachable', and in a scale-in 't-1: knows ... (t-7),
    which is not an observed node'."""
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        grown = {**data, "cluster": {**data["cluster"], "masters": 4}, "config": {"io-threads": 2}}
        try:
            preload(loaded, 2000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                for target, masters in ((grown, "4 masters"), (data, "3 masters")):
                    writer.wait_for_writes(len(writer.acked) + 100)
                    spec.write_text(yaml.safe_dump(target))
                    kinds = {s["kind"] for s in plan_json(capsys, spec)["steps"]}
                    assert {"failover", "move-slots"} <= kinds, kinds
                    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                    assert code == 0 and masters in out, err + out
                    assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            client = cluster_client(read_spec(spec))
            assert writer.verify(client) == []
            assert dataset_checksum(client, "pre:*") == before
            check = cluster_check(loaded.layout.servers[0].endpoint)
            assert check.returncode == 0 and "3 masters" in check.stdout, check.stdout
        finally:  # also stop the fourth shard's nodes if the test failed half way
            spec.write_text(yaml.safe_dump(grown))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()
