"""A cluster's creation killed mid-way (opsctl SIGKILLed at each phase of form-cluster, the replicas' start beside
the masters' among them): the next apply finishes it, and redis-cli --cluster check passes. Each kill lands while
apply still runs.
The state a kill inside form-cluster's masters' setup leaves (some masters with their slots, others without, none
met), built directly, is finished too; a slot no master serves is not given to another master than the one that
holds its keys. A run that lost its topology lock launches no server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from opsctl.cli.main import main
from opsctl.observe.replies import parse_cluster_nodes, parse_info
from opsctl.slots.ranges import expand
from opsctl.spec.layout import Node
from opsctl.state.specfile import read_spec
from tests.lifecycle import plan_json, run
from tests.support import (
    CONDITION_BOUND,
    PASSWORD,
    PASSWORD_ENV,
    admin_for,
    cluster_check,
    make_spec,
    server_binary,
    write_spec,
)

pytestmark = pytest.mark.integration


def _client(node: Node) -> redis.Redis:
    """Kept for the whole poll, and no retry of a refused connection (redis-py backs off and retries 3 times):
    a look at every server takes a few ms, so a short phase (the replicas' start while the masters meet) is seen."""
    return redis.Redis(node.address, node.port, password=PASSWORD, socket_timeout=0.5, socket_connect_timeout=0.5,
                       decode_responses=True, retry=Retry(NoBackoff(), 0))


def _info(client: redis.Redis) -> dict[str, str]:
    try:
        return {**client.info("replication"), **parse_info(client.execute_command("CLUSTER", "INFO"))}
    except redis.RedisError:
        return {}


Seen = list[tuple[Node, dict[str, str]]]  # every server and its info ({} when it does not answer)


def _any(test: Callable[[Node, dict[str, str]], bool]) -> Callable[[Seen], bool]:
    return lambda seen: any(test(node, info) for node, info in seen)


POINTS: dict[str, Callable[[Seen], bool]] = {
    # a master up, a replica still being written or started (they are, beside the masters, once those launched)
    "answering": lambda seen: _any(lambda node, info: node.role == "master" and bool(info))(seen)
    and _any(lambda node, info: node.role == "replica" and not info)(seen),
    # epochs and slots, the masters' meets under way
    "slots": _any(lambda _, info: info.get("cluster_slots_assigned", "0") != "0"),
    # a replica has met its master and nobody else, REPLICATE not sent yet (or not to every replica)
    "met": _any(lambda node, info: node.role == "replica" and info.get("cluster_known_nodes", "1") != "1"
                and info.get("role") == "master"),
    "replica": _any(lambda _, info: info.get("role") == "slave"),  # replicas attached, then met by the rest
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_cluster_creation_killed_mid_way_is_finished_by_the_next_apply(tmp_path, capsys, point) -> None:
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("cluster", "valkey"))
    servers = read_spec(spec).layout.servers
    clients = [(n, _client(n)) for n in servers]
    try:
        _killed_at(spec, point, clients)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        if code == 3 and "a majority of its servers does not answer" in err:  # killed before 4 of 6 started
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve", "--force-lock")
        assert code == 0, err + out
        _settled(capsys, spec, servers[0].endpoint)
    finally:
        for _, client in clients:
            client.close()
        main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
        capsys.readouterr()


def _settled(capsys: pytest.CaptureFixture[str], spec: Path, endpoint: str) -> None:
    """Nothing left to do, and the referee agrees."""
    assert plan_json(capsys, spec)["steps"] == []
    check = cluster_check(endpoint)
    assert check.returncode == 0 and "All 16384 slots covered" in check.stdout, check.stdout + check.stderr


def _killed_at(spec: Path, point: str, clients: list[tuple[Node, redis.Redis]], attempts: int = 3) -> None:
    """apply, SIGKILLed once the servers show point while it still runs. A point the poll did not see before
    apply ended (a starved poll on a busy machine) is tried again from scratch, a few times."""
    for _ in range(attempts):
        proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec), "--auto-approve"],
                                env={**os.environ, PASSWORD_ENV: PASSWORD}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + CONDITION_BOUND
            while not POINTS[point]([(n, _info(c)) for n, c in clients]) and proc.poll() is None:
                assert time.monotonic() < deadline, f"apply never reached {point}"
                time.sleep(0.005)
        finally:
            proc.send_signal(signal.SIGKILL)
            code = proc.wait()
        if code == -signal.SIGKILL:
            return
        assert main(["destroy", "-f", str(spec), "--auto-approve", "--purge"]) == 0
    raise AssertionError(f"apply ended before {point} {attempts} times: the kill point was missed")


def _killed_while_masters_set_up(spec: Path, met: bool) -> None:
    """Every node started, form-cluster killed while it set the masters up (their epochs and slots, one round trip
    each, all at once): shards 2 and 3's masters have their share, shard 1's master none, no replica ran CLUSTER
    REPLICATE (each is a master without slots). met: every node met the first one (else none met)."""
    from dataclasses import replace

    from opsctl.apply.executor import execute
    from opsctl.apply.planning import compute_plan
    from opsctl.base.events import ignore
    from opsctl.plan.steps import FormCluster
    from opsctl.runtime.opening import make_runtime
    from opsctl.slots.slotplan import slot_plan

    loaded = read_spec(spec)
    layout = loaded.layout
    rt = make_runtime(loaded)
    plan, _ = compute_plan(rt)
    execute(rt, replace(plan, steps=tuple(s for s in plan.steps if not isinstance(s, FormCluster))), ignore)
    for shard in layout.shards[1:]:
        node = layout.node(shard.master)
        with admin_for(loaded, node) as admin:
            admin.call("CLUSTER", "SET-CONFIG-EPOCH", layout.servers.index(node) + 1)
            admin.call("CLUSTER", "ADDSLOTSRANGE", *slot_plan(layout)[shard.master][0])
    if met:
        first = layout.servers[0]
        for node in layout.servers[1:]:
            with admin_for(loaded, node) as admin:
                admin.call("CLUSTER", "MEET", first.address, first.port)


def test_masters_left_with_and_without_their_slots_are_finished_by_the_next_apply(tmp_path, capsys) -> None:
    """The state CI's [answering] run left, built directly: killed while form-cluster set the masters up (their
    epochs and slots, one round trip each, all at once), shards 2 and 3's masters had theirs and shard 1's none,
    no MEET was sent, the replicas run. The next apply gives shard 1's share to its master (it moved slots from the
    others into it as into a new shard, and waited 60 s for a cluster whose 5462 unassigned slots no node served),
    joins every node and replicates. Before it, the slot commands refuse at once, nothing changed, and name apply:
    `cluster fix` covered shard 1's share on its master alone, then waited 60 s ('timed out after 60s waiting for
    the cluster of 6 nodes to converge', exit 1), `cluster reshard` waited the same, `rebalance --dry-run` showed
    moves into shard 1's master."""
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("cluster", "valkey"))
    layout = read_spec(spec).layout
    source, target = layout.shards[1].master, layout.shards[0].master
    try:
        _killed_while_masters_set_up(spec, met=False)
        for command in (["fix"], ["reshard", "--auto-approve", "--from", source, "--to", target, "--slots", "10"],
                        ["rebalance", "--dry-run"]):
            started = time.monotonic()
            code, out, err = run(capsys, "cluster", *command, "-f", str(spec))
            took = time.monotonic() - started
            assert code == 3 and "the nodes are not one cluster: 6 groups" in err, err + out
            assert f"{target} knows only itself" in err and "`opsctl apply -f SPEC`" in err, err
            assert took < 5, f"cluster {command[0]} refused after {took:.1f} s"
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and f"assign-slots 5462 slots -> {layout.shards[0].master}" in out, err + out
        assert "move-slots" not in out, out
        _settled(capsys, spec, layout.servers[0].endpoint)
    finally:
        main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
        capsys.readouterr()


def test_cluster_fix_gives_a_killed_creations_unserved_share_to_its_shards_master(tmp_path, capsys) -> None:
    """The same state once every node met, before any CLUSTER REPLICATE: shard 1's master and the three replicas
    are masters without slots. `cluster fix` gave the 5462 unserved slots to those four one at a time (0 to one,
    1 to the next, ...: the fewest slots among every master, counted again after each slot), three declared
    replicas served slots and the next apply refused ('shard 1 has 2 masters serving data'). Now shard 1's share
    goes whole to shard 1's master, as apply's assign-slots gives it, and the next apply replicates. A rebalance
    in between weighed those replicas as masters too (2730 slots each) and moved slots into them: now it weighs the
    shards' masters only, and refuses a weight on a replica."""
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("cluster", "valkey"))
    loaded = read_spec(spec)
    layout = loaded.layout
    first = layout.shards[0].master
    try:
        _killed_while_masters_set_up(spec, met=True)
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
        assert code == 0 and out.count("covered ") == 1 and f"covered 0-5461 with {first}" in out, err + out
        for name in (r for shard in layout.shards for r in shard.replicas):
            with admin_for(loaded, layout.node(name)) as admin:
                line = next(ln for ln in parse_cluster_nodes(admin.call("CLUSTER", "NODES")) if ln.is_myself)
            assert not line.slots, f"{name} (a replica in the spec) serves {line.slots}"
        code, out, err = run(capsys, "cluster", "rebalance", "-f", str(spec), "--dry-run")
        assert code == 0 and "nothing to move" in out, err + out
        replica = layout.shards[0].replicas[0]
        code, out, err = run(capsys, "cluster", "rebalance", "-f", str(spec), "--weight", f"{replica}=1", "--dry-run")
        assert code == 3 and f"{replica}: not a shard master" in err, err + out
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and "assign-slots" not in out, err + out
        _settled(capsys, spec, layout.servers[0].endpoint)
    finally:
        main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
        capsys.readouterr()


def test_a_slot_no_master_serves_is_not_given_away_from_the_master_that_holds_its_keys(tmp_path, capsys) -> None:
    """apply assigns a slot that no master serves (a creation killed part way leaves such slots) to the master whose
    share of the layout holds it, unless another master holds keys in it (here one that imported a key of it, then
    an operator deleted the slot everywhere): refused, the key untouched; `cluster fix` gives the slot to that
    master."""
    from tests.lifecycle import deployed

    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        layout = loaded.layout
        owner, holder = (layout.node(s.master) for s in layout.shards[:2])
        key = next(k for k in (f"k{i}" for i in range(100_000)) if key_slot(k.encode()) == 100)  # owner's share
        admins = {n.name: admin_for(loaded, n) for n in layout.servers}
        try:
            importer = admins[holder.name].client
            importer.execute_command("CLUSTER", "SETSLOT", 100, "IMPORTING", admins[owner.name].call("CLUSTER", "MYID"))
            pipe = importer.pipeline(transaction=False)
            pipe.execute_command("ASKING").set(key, "kept").execute()
            importer.execute_command("CLUSTER", "SETSLOT", 100, "STABLE")
            _unserve(100, [admins[owner.name], *(a for name, a in admins.items() if name != owner.name)])
        finally:
            for admin in admins.values():
                admin.client.close()
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and f"assign-slots 1 slots -> {owner.name}" in out, err + out
        assert f"{holder.name} holds keys in slots that no master serves" in err and "slots 100" in err, err
        assert run(capsys, "cluster", "fix", "-f", str(spec))[0] == 0
        assert _client(holder).get(key) == "kept"
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        _settled(capsys, spec, holder.endpoint)


def _unserve(slot: int, admins: list) -> None:
    """CLUSTER DELSLOTS slot on every node (its owner first), again on a node that learned the owner back from a
    ping sent before the owner's DELSLOTS, until no node sees it served."""
    deadline = time.monotonic() + 10
    while served := [a for a in admins if any(line.is_master and slot in expand(line.slots) for line in
                                              parse_cluster_nodes(a.call("CLUSTER", "NODES")))]:
        assert time.monotonic() < deadline, f"slot {slot} still served in {[a.name for a in served]}"
        for admin in served:
            admin.call("CLUSTER", "DELSLOTS", slot)


def test_a_replica_that_cannot_start_fails_the_creation_and_the_next_apply_finishes_it(tmp_path, capsys) -> None:
    """A replica starts beside the masters' start and form-cluster: its failure (its port is taken) is its own start
    step's error and fails form-cluster too, the masters stay set up, and apply finishes once the port is free.
    (A server that exits on its failed bind is not taken for up because the port accepts: another process holds
    it.)"""
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("cluster", "valkey"))
    layout = read_spec(spec).layout
    replica = next(n for n in layout.servers if n.role == "replica")
    taken = socket.create_server((replica.address, replica.port))
    try:
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        taken.close()
        assert code == 1, err
        assert f"{replica.name} did not start" in err and "form-cluster" in err and "port in use" in err, err
        assert "Traceback" not in err
        master = layout.node(layout.shards[0].master)
        assert _info(_client(master)).get("cluster_slots_assigned", "0") != "0"  # the masters were set up meanwhile
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        _settled(capsys, spec, master.endpoint)
    finally:
        taken.close()
        main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
        capsys.readouterr()


def test_a_run_that_lost_its_topology_lock_starts_no_server(tmp_path) -> None:
    """Starts go out together (one wave), checked against the lock once before any launch, as each step is."""
    from opsctl.apply.executor import execute
    from opsctl.base.errors import OpsctlError
    from opsctl.base.events import ignore
    from opsctl.net.topolock import topology_lock
    from opsctl.plan.steps import Plan, StartNode
    from opsctl.runtime.opening import make_runtime

    server_binary("valkey")
    loaded = read_spec(write_spec(tmp_path, make_spec("cluster", "valkey")))
    rt = make_runtime(loaded)
    plan = Plan(loaded.spec.name, "d", "f", tuple(StartNode(n.name, "new node") for n in loaded.layout.servers))
    # the lock's own exit says the loss too (a run that ends while its lock is lost fails)
    with pytest.raises(OpsctlError, match="lost the topology lock"), \
            topology_lock(rt.connector, lease=2.0, nowhere=lambda names: names) as lock:
        lock._stop.set()  # the renewer stops, and the clock says 3 s went by: a run paused past its lease
        assert lock._renewer is not None
        lock._renewer.join()
        lock._renewed_at -= 3
        with pytest.raises(OpsctlError, match="lost the topology lock"):
            execute(rt, plan, ignore)
    assert not any(rt.provider.process_state(n).running for n in loaded.layout.servers)
    assert not (rt.state_dir / loaded.layout.servers[0].name).exists()  # not even a folder: nothing launched
