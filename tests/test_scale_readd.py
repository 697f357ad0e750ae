"""Scale in, then out again with the same node names: the re-added nodes join as brand new nodes (new ids),
not with the identity the cluster FORGOT (banned for 60 s: the scale-out used to stall, then time out)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis
import yaml

from opsctl.cli import main
from opsctl.failover.actions import KILL_AT
from opsctl.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, cluster_check
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def node_ids(loaded, names):
    ids = {}
    for node in (n for n in loaded.layout.servers if n.name in names):
        with redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True) as client:
            ids[node.name] = client.execute_command("CLUSTER", "MYID")
    return ids


def known_ids(loaded):
    seen = set()
    for node in loaded.layout.servers:
        with redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True) as client:
            seen |= {line.split()[0] for line in client.execute_command("CLUSTER", "NODES").splitlines()}
    return seen


def killed_scale_in(spec) -> None:
    """A scale-in killed right after remove-node stopped the first retired node (the replica), before it was
    forgotten; the next apply removes it again (it is stopped, but the cluster still knows it)."""
    killed = subprocess.run([sys.executable, "-m", "opsctl.cli", "apply", "-f", str(spec), "--auto-approve"],
                            env={**os.environ, KILL_AT: "remove-node-stopped"}, capture_output=True, text=True,
                            timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr


@pytest.mark.parametrize("killed", [False, True], ids=["clean", "killed-mid-scale-in"])
def test_scale_in_then_out_with_the_same_names_joins_new_nodes(tmp_path, capsys, killed) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        four = {**data, "cluster": {**data["cluster"], "masters": 4}}
        added = {f"{loaded.spec.name}-7", f"{loaded.spec.name}-8"}
        try:
            preload(loaded, 2000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(50)
                spec.write_text(yaml.safe_dump(four))
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                old = node_ids(read_spec(spec), added)

                spec.write_text(yaml.safe_dump(data))
                if killed:
                    killed_scale_in(spec)
                    plan = [(s["kind"], s["node"]) for s in plan_json(capsys, spec)["steps"]]
                    assert plan[:2] == [("remove-node", n) for n in sorted(added, reverse=True)], plan
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "3 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                assert not set(old.values()) & known_ids(read_spec(spec))

                spec.write_text(yaml.safe_dump(four))
                kinds = [(s["kind"], s["node"]) for s in plan_json(capsys, spec)["steps"]]
                assert {("join-cluster", n) for n in added} <= set(kinds), kinds
                assert (("replicate", f"{loaded.spec.name}-8")) in kinds, kinds
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                assert "a node the cluster forgot" in err + out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                new = node_ids(read_spec(spec), added)
                assert all(new[n] != old[n] for n in added), (old, new)
                assert not set(old.values()) & known_ids(read_spec(spec))
                writer.wait_for_writes(len(writer.acked) + 50)
            client = cluster_client(read_spec(spec))
            assert writer.verify(client) == []
            assert dataset_checksum(client, "pre:*") == before
            check = cluster_check(loaded.layout.servers[0].endpoint)
            assert check.returncode == 0 and "4 masters" in check.stdout and "[ERR]" not in check.stdout, check.stdout
        finally:  # also stop the fourth shard's nodes if the test failed half way
            spec.write_text(yaml.safe_dump(four))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            spec.write_text(yaml.safe_dump(data))
            capsys.readouterr()
