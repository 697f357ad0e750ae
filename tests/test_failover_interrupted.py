"""opsctl killed in the middle of a failover (SIGKILL at named points): never two writable masters, nothing
acknowledged lost, and a re-run of `failover` or `apply` converges. The writer addresses the old master
directly, as a client that has not noticed the switch would: the referee for two writable masters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from opsctl.apply.executor import execute
from opsctl.base.events import Log
from opsctl.base.poll import wait_for
from opsctl.failover.actions import KILL_AT
from opsctl.net.connector import Connector
from opsctl.net.observer import wait_cluster_converged
from opsctl.plan.facts import FENCE
from opsctl.plan.steps import Failover, Plan, Replicate
from opsctl.runtime.opening import make_runtime
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, admin_for, cluster_check
from tests.writer import Writer

pytestmark = pytest.mark.integration


def _opsctl(*argv: str, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, KILL_AT: kill_at}
    return subprocess.run([sys.executable, "-m", "opsctl.cli.main", *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _client(loaded: LoadedSpec, name: str) -> redis.Redis:
    node = loaded.layout.node(name)
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=2.0,
                       decode_responses=True)


def _roles(loaded: LoadedSpec) -> dict[str, str]:
    return {n.name: _client(loaded, n.name).execute_command("ROLE")[0] for n in loaded.layout.servers}


def _fenced(loaded: LoadedSpec) -> list[str]:
    out = []
    for node in loaded.layout.servers:
        with admin_for(loaded, node) as admin:
            if admin.config_get("min-replicas-to-write")["min-replicas-to-write"] == FENCE:
                out.append(node.name)
    return out


def _wait_healthy(capsys: pytest.CaptureFixture[str], spec: Path, timeout: float = CONDITION_BOUND) -> str:
    deadline = time.monotonic() + timeout
    while True:
        code, out, _ = run(capsys, "status", "-f", str(spec))
        if code == 0 or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def _killed_then_rerun(capsys: pytest.CaptureFixture[str], spec: Path, loaded: LoadedSpec, point: str,
                       failover: list[str], rerun: list[str]) -> tuple[str, Writer, subprocess.CompletedProcess[str]]:
    old = next(n for n, r in _roles(loaded).items() if r == "master")
    with Writer(lambda: _client(loaded, old)) as writer:
        writer.wait_for_writes(200)
        killed = _opsctl("failover", "-f", str(spec), "--yes", "--timeout", "1.5", *failover, kill_at=point)
        assert killed.returncode == -9, killed.stdout + killed.stderr
        # a duration under test, so a sleep: the pause (timeout + 2 s) has lapsed, an unfenced old master would take
        # writes now
        time.sleep(4.0)
        again = _opsctl(*rerun, "-f", str(spec), "--yes" if rerun[0] == "failover" else "--auto-approve")
        writer.wait_for_writes(len(writer.acked) + 50, timeout=1.0)
    return old, writer, again


def _master(loaded: LoadedSpec) -> str:
    masters = [n for n, r in _roles(loaded).items() if r == "master"]
    assert len(masters) == 1, masters
    return masters[0]


@pytest.mark.parametrize(("point", "rerun"), [("fenced", "failover"), ("asked", "failover"),
                                              ("promoted", "failover"), ("asked", "apply")])
def test_sentinel_failover_killed_mid_way(tmp_path, capsys, point, rerun) -> None:
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        argv = ["failover", "--shard", "1"] if rerun == "failover" else ["apply"]
        old, writer, again = _killed_then_rerun(capsys, spec, loaded, point, ["--shard", "1"], argv)
        assert again.returncode == 0, again.stdout + again.stderr
        if point != "fenced":
            assert "interrupted failover finished" in again.stdout + again.stderr
        new = _master(loaded)
        assert new != old, again.stdout + again.stderr
        assert writer.verify(_client(loaded, new)) == []
        assert any("NOREPLICAS" in e for e in writer.errors) or point == "fenced"
        assert _fenced(loaded) == []
        assert "sentinel ok" in _wait_healthy(capsys, spec)
        assert plan_json(capsys, spec)["steps"] == []


def test_replication_failover_killed_after_the_promotion(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        target = loaded.layout.shards[0].replicas[0]
        _, writer, again = _killed_then_rerun(capsys, spec, loaded, "promoted",
                                              ["--to", target, "--no-failover-command"],
                                              ["failover", "--to", target, "--no-failover-command"])
        assert again.returncode == 0, again.stdout + again.stderr
        assert "interrupted failover finished" in again.stdout
        assert _master(loaded) == target
        assert writer.verify(_client(loaded, target)) == []
        assert _fenced(loaded) == []
        assert "replication ok" in _wait_healthy(capsys, spec)
        assert plan_json(capsys, spec)["steps"] == []


def test_after_a_failover_killed_past_the_promotion_the_plan_and_a_steps_look_follow_the_promoted_replica(
        tmp_path, capsys) -> None:
    """Killed after REPLICAOF NO ONE on the target (plain replication): old is fenced, still a master that other
    follows, and keeps streaming heartbeats to other (repl-ping-replica-period 1 s here, 10 s by default). Once
    old's offset passed the target's promotion point by those PINGs, apply refused ('... hold data it lacks',
    exit 3) instead of finishing the failover; and a step's look read no config, so it did not see the fence and
    pointed other at the fenced old master."""
    with deployed(tmp_path, capsys, "replication", "redis", config={"repl-ping-replica-period": 1}) as (spec, loaded):
        old, target, other = loaded.layout.shards[0].members
        killed = _opsctl("failover", "-f", str(spec), "--yes", "--timeout", "2", "--to", target,
                         "--no-failover-command", kill_at="promoted")
        assert killed.returncode == -9, killed.stdout + killed.stderr
        promoted_at = int(_client(loaded, target).info("replication")["second_repl_offset"]) - 1
        wait_for(lambda: int(_client(loaded, old).info("replication")["master_repl_offset"]) > promoted_at + 14
                 or None, CONDITION_BOUND, "old to stream two heartbeats past the promotion")
        assert ("finish-failover", old) in [(s["kind"], s["node"]) for s in plan_json(capsys, spec)["steps"]]
        rt, events = make_runtime(read_spec(spec)), []
        try:  # a replicate step of a plan made before the failover
            execute(rt, Plan(loaded.spec.name, "d", "f", (Replicate(other, "", old),)), events.append)
        finally:
            rt.provider.close()
        assert f"{old} is no longer the shard's master: {other} follows {target}, its master now" in \
            [e.text for e in events if isinstance(e, Log)]
        role = _client(loaded, other).execute_command("ROLE")
        assert role[0] == "slave" and int(role[2]) == loaded.layout.node(target).port, role
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0 and "interrupted failover finished" in out + err, out + err
        assert _fenced(loaded) == [] and _master(loaded) == target
        assert plan_json(capsys, spec)["steps"] == []


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_failover_step_finds_it_done_and_repoints_the_replica_left_behind(tmp_path, capsys, flavor) -> None:
    """A maintenance failover step whose FAILOVER TO a killed run asked for ended between the plan and the step
    (CI saw it under load): the step has nothing to fail over, but the shard's other replica still follows the
    demoted master (FAILOVER TO re-points only the two it swaps) and the plan has no step for it. The step points
    it at the new master; before, the plan's wait-converged timed out (60 s, exit 1)."""
    from opsctl.spec.load import command_renames

    with deployed(tmp_path, capsys, "replication", flavor) as (spec, loaded):
        old, target, other = loaded.layout.shards[0].members
        node = loaded.layout.node(target)
        renamed = command_renames(loaded.spec, None).get("FAILOVER", "FAILOVER")
        _client(loaded, old).execute_command(renamed, "TO", node.address, str(node.port), "TIMEOUT", "20000")
        wait_for(lambda: (_roles(loaded)[old] == "slave" and _roles(loaded)[target] == "master") or None,
                 CONDITION_BOUND, "the server's FAILOVER to end")
        assert int(_client(loaded, other).execute_command("ROLE")[2]) == loaded.layout.node(old).port
        assert ("replicate", other) in [(s["kind"], s["node"]) for s in plan_json(capsys, spec)["steps"]]
        rt, events = make_runtime(read_spec(spec)), []
        try:  # a failover step of a plan made before FAILOVER ended
            execute(rt, Plan(loaded.spec.name, "d", "f", (Failover(old, "maintenance", shard=1, to=target),)),
                    events.append)
        finally:
            rt.provider.close()
        logs = [e.text for e in events if isinstance(e, Log)]
        assert f"{other} followed {old}: pointed at {target}" in logs, logs
        role = _client(loaded, other).execute_command("ROLE")
        assert role[0] == "slave" and int(role[2]) == node.port, role
        assert plan_json(capsys, spec)["steps"] == []


def test_a_killed_cluster_failover_counts_for_the_cool_down(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        shard = loaded.layout.shards[0]
        old, replica = shard.master, shard.replicas[0]
        killed = _opsctl("failover", "-f", str(spec), "--yes", "--shard", "1", kill_at="asked")
        assert killed.returncode == -9, killed.stdout + killed.stderr
        reports = list((tmp_path / ".opsctl" / loaded.spec.name / "failover").glob("*-in-progress.json"))
        assert len(reports) == 1
        wait_for(lambda: _roles(loaded)[replica] == "master" or None, CONDITION_BOUND,
                 "the server to finish the failover")
        wait_cluster_converged(Connector(loaded), loaded.layout.servers)  # every node has heard of it
        code, out, err = run(capsys, "failover", "-f", str(spec), "--yes", "--to", old)  # fail back
        assert code == 0, out + err
        code, out, err = run(capsys, "failover", "-f", str(spec), "--dry-run", "--to", replica)
        assert code == 3 and "[FAIL] cool-down" in out and "opsctl was killed" in out, out + err
        assert cluster_check(loaded.layout.servers[0].endpoint).returncode == 0


def test_a_failover_refuses_while_another_run_holds_the_topology(tmp_path, capsys) -> None:
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import open_connector
    from opsctl.state.localdirs import state_dir_for

    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        before = _roles(loaded)
        with open_connector(loaded, state_dir_for(loaded, None)) as connector, topology_lock(connector):
            code, out, err = run(capsys, "failover", "-f", str(spec), "--yes", "--shard", "1")
        assert code == 3 and "another opsctl run holds this topology" in err, out + err
        assert _roles(loaded) == before


def test_a_fence_stays_while_a_node_that_may_have_been_promoted_does_not_answer(tmp_path, capsys) -> None:
    """Killed after the promotion, then the promoted replica stalls: the re-run cannot see the new master, so
    it must not lift the old master's fence (two masters would take writes); once it answers, it converges."""
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        old = loaded.layout.shards[0].master
        target = loaded.layout.shards[0].replicas[0]
        pid = int((tmp_path / ".opsctl" / loaded.spec.name / target / "server.pid").read_text())
        with Writer(lambda: _client(loaded, old)) as writer:
            writer.wait_for_writes(200)
            killed = _opsctl("failover", "-f", str(spec), "--yes", "--timeout", "2", "--to", target,
                             "--no-failover-command", kill_at="promoted")
            assert killed.returncode == -9, killed.stdout + killed.stderr
            os.kill(pid, signal.SIGSTOP)
            try:
                again = _opsctl("failover", "-f", str(spec), "--yes", "--to", target, "--no-failover-command")
                assert again.returncode == 3 and f"{target} does not answer" in again.stderr, \
                    again.stdout + again.stderr
                with admin_for(loaded, loaded.layout.node(old)) as admin:
                    assert admin.config_get("min-replicas-to-write")["min-replicas-to-write"] == FENCE
            finally:
                os.kill(pid, signal.SIGCONT)
            again = _opsctl("failover", "-f", str(spec), "--yes", "--to", target, "--no-failover-command")
            writer.wait_for_writes(len(writer.acked) + 50, timeout=1.0)
        assert again.returncode == 0 and "interrupted failover finished" in again.stdout, again.stdout + again.stderr
        assert _master(loaded) == target
        assert writer.verify(_client(loaded, target)) == []
        assert _fenced(loaded) == []


@pytest.mark.parametrize(("topology", "failover"), [("replication", ["--to", "t-2", "--no-failover-command"]),
                                                    ("sentinel", ["--shard", "1"])])
def test_a_failover_killed_past_the_promotion_is_finished_before_a_restart_only_change(
        tmp_path, capsys, topology, failover) -> None:
    """Killed after the promotion, then apply with io-threads changed (a restart of every node): it restarted the
    fenced old master first, which came back unfenced and took writes again beside the promoted replica ('t-2 is
    no longer shard 1's master: t-1 took its writes'); plain replication's wait for the replicas timed out after
    60 s with two masters, and under Sentinel apply passed with acknowledged writes lost. The failover is
    finished first, alone; apply then plans the restarts from what the nodes say."""
    with deployed(tmp_path, capsys, topology, "redis") as (spec, loaded):
        target = loaded.layout.shards[0].replicas[0]
        spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), "config": {"io-threads": 2}}))
        argv = [target if arg == "t-2" else arg for arg in failover]
        _, writer, again = _killed_then_rerun(capsys, spec, loaded, "promoted", argv, ["apply"])
        assert again.returncode == 0 and "interrupted failover finished" in again.stderr, again.stdout + again.stderr
        assert writer.verify(_client(loaded, _master(loaded))) == []  # old again when the restarts' failover picks it
        assert _fenced(loaded) == []
        assert f"{topology} ok" in _wait_healthy(capsys, spec)
        assert plan_json(capsys, spec)["steps"] == []
