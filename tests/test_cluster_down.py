"""A stopped shard, or the whole stopped cluster, comes back from its nodes.conf with its slots and data: apply
starts the down nodes first (no slot moves into a master that only looks empty, no new cluster formed), then
observes again and plans the rest."""

from __future__ import annotations

import json

import pytest
import yaml

from opsctl.runtime.opening import make_runtime
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import cluster_check
from tests.test_slots_reshard import preload
from tests.writer import cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("down", ["shard", "cluster"])
def test_stopped_nodes_rejoin_with_their_slots_and_data(tmp_path, capsys, down) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        preload(loaded, 2000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        client.close()
        rt = make_runtime(read_spec(spec))
        stopped = loaded.layout.shards[1].members if down == "shard" else [n.name for n in loaded.layout.servers]
        try:
            for name in stopped:
                rt.provider.stop(rt.node(name))
        finally:
            rt.provider.close()

        plan = plan_json(capsys, spec)
        kinds = {s["kind"] for s in plan["steps"]}
        assert kinds == {"start"} and plan["replan"], plan
        assert sorted(s["node"] for s in plan["steps"]) == sorted(stopped), plan
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert "move-slots" not in out and "form-cluster" not in out, out

        assert plan_json(capsys, spec)["steps"] == []
        client = cluster_client(read_spec(spec))
        assert dataset_checksum(client, "pre:*") == before and before[0] == 2000
        client.close()
        check = cluster_check(loaded.layout.servers[0].endpoint)
        assert check.returncode == 0 and "3 masters" in check.stdout and "[ERR]" not in check.stdout, check.stdout


def test_a_spec_that_would_renumber_deployed_nodes_keeps_them(tmp_path, capsys) -> None:
    """replicas_per_master 1 -> 2 once made t-3 (shard 2 master on h2) shard 1's replica on h3 and was refused
    (exit 3); a deployed node now keeps its name, host, port and shard for life (issue 22): the apply adds one new
    replica per shard under new names, and every node deployed before stands where it stood."""
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        before = {n.name: (n.host, n.port, n.shard) for n in loaded.layout.servers}
        spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "replicas_per_master": 2}}))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and "Traceback" not in err, err + out
        placed = make_runtime(read_spec(spec))
        try:
            layout = placed.loaded.layout
        finally:
            placed.provider.close()
        assert {n.name: (n.host, n.port, n.shard) for n in layout.servers if n.name in before} == before
        assert len(layout.servers) == 9
        for shard in layout.shards:
            hosts = [layout.node(m).host for m in shard.members]
            assert len(set(hosts)) == len(hosts), shard
        assert plan_json(capsys, spec)["steps"] == []
        check = cluster_check(loaded.layout.servers[0].endpoint)
        assert check.returncode == 0 and "3 masters" in check.stdout and "[ERR]" not in check.stdout, check.stdout


def test_a_saved_start_first_plan_runs_only_its_own_steps(tmp_path, capsys) -> None:
    """plan --out of a cluster with a shard down and a changed spec: the saved plan starts the shard; what the
    started nodes then call for (the policy change) was never reviewed, so it is shown, not run, and exit 2 says
    a new plan is due. The plan made then applies it."""
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        rt = make_runtime(read_spec(spec))
        try:
            for name in loaded.layout.shards[1].members:
                rt.provider.stop(rt.node(name))
        finally:
            rt.provider.close()
        data = yaml.safe_load(spec.read_text())
        spec.write_text(yaml.safe_dump({**data, "memory": {**data["memory"], "policy": "allkeys-random"}}))
        saved = tmp_path / "plan.json"
        code, out, err = run(capsys, "plan", "-f", str(spec), "--out", str(saved), "--output", "json")
        assert code == 2 and {s["kind"] for s in json.loads(out)["steps"]} <= {"write-config", "start"}, err + out

        code, out, err = run(capsys, "apply", "-f", str(spec), "--plan", str(saved), "--auto-approve")
        assert code == 2 and "was not in it" in err and "config-set" in err and "Traceback" not in err, err + out
        first = loaded.layout.shards[0].master
        assert _policy(spec, first) == "allkeys-lru"  # the unreviewed change did not run

        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert _policy(spec, first) == "allkeys-random"
        assert plan_json(capsys, spec)["steps"] == []


def _policy(spec, node: str) -> str:
    from opsctl.runtime.opening import make_runtime as runtime

    rt = runtime(read_spec(spec))
    try:
        return str(rt.connections[node].config_get("maxmemory-policy")["maxmemory-policy"])
    finally:
        rt.close()
