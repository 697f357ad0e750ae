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

from opsctl.base.poll import wait_for
from opsctl.cli.main import main
from opsctl.failover.actions import KILL_AT
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, cluster_check, free_base_port, loopback_hosts, server_binary
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
    killed = subprocess.run([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec), "--auto-approve"],
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


def cluster_server(flavor: str, directory, address: str, port: int) -> subprocess.Popen[bytes]:
    directory.mkdir()
    return subprocess.Popen([server_binary(flavor), "--bind", address, "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(directory), "--cluster-enabled", "yes",
                             "--cluster-require-full-coverage", "no"],
                            stdout=subprocess.DEVNULL)


def test_a_stale_identity_is_reset_only_when_the_node_holds_nothing(tmp_path) -> None:
    """Real servers: a node that knows another node (its old cluster) and holds a key in a slot it no longer
    serves is refused, key and id untouched; once empty it is reset to a new id that knows only itself."""
    from opsctl.base.errors import RefusedError
    from opsctl.cluster.ops import reset_stale_identity
    from opsctl.net.connection import connection_to
    from opsctl.net.connector import Connector
    from tests.test_planner import PASSWORD, loaded_spec

    address = loopback_hosts(1)[0]
    port = free_base_port([address], 2)
    procs = [cluster_server("valkey", tmp_path / str(i), address, port + i) for i in range(2)]
    client = redis.Redis(host=address, port=port, decode_responses=True)
    try:
        wait_for(lambda: True if _answers(client) else None, CONDITION_BOUND, "the test server")
        client.execute_command("CLUSTER", "MEET", address, port + 1)
        wait_for(lambda: True if len(client.execute_command("CLUSTER", "NODES").splitlines()) == 2 else None,
                 CONDITION_BOUND, "the meet")
        slot = client.execute_command("CLUSTER", "KEYSLOT", "kept")
        client.execute_command("CLUSTER", "ADDSLOTS", slot)
        serving(client)
        client.set("kept", "v")
        client.execute_command("CLUSTER", "DELSLOTS", slot)
        old = client.execute_command("CLUSTER", "MYID")
        loaded = loaded_spec("cluster")
        client.config_set("requirepass", PASSWORD)  # this connection stays authenticated; the handle sends AUTH
        admin = connection_to(Connector(loaded, lambda _: (address, port)), loaded.layout.servers[0])
        assert reset_stale_identity(admin, loaded.layout.servers[0], {old}) is None  # the cluster knows it
        with pytest.raises(RefusedError, match="1 keys"):
            reset_stale_identity(admin, loaded.layout.servers[0], set())
        assert client.dbsize() == 1 and client.execute_command("CLUSTER", "MYID") == old
        client.execute_command("CLUSTER", "ADDSLOTS", slot)
        serving(client)
        client.delete("kept")
        client.execute_command("CLUSTER", "DELSLOTS", slot)
        assert reset_stale_identity(admin, loaded.layout.servers[0], set()) == old
        assert client.execute_command("CLUSTER", "MYID") != old
        assert len(client.execute_command("CLUSTER", "NODES").splitlines()) == 1
        admin.close()
    finally:
        client.close()
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def serving(client: redis.Redis) -> None:
    wait_for(lambda: True if "cluster_state:ok" in client.execute_command("CLUSTER", "INFO") else None, CONDITION_BOUND,
             "cluster_state ok")


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
