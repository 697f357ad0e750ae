"""opsctl SIGKILLed mid-way in each step kind a fleet change adds (issue 22, item 8): retiring a drained member
(stop, forget, tombstone, purge), SENTINEL RESET, forget-nodes (a dead host replaced), a maintenance failover. Each
run is killed at named points (OPSCTL_FAILOVER_KILL_AT) and at spread times after its start, then `apply` runs to
the end: it finishes, nothing acknowledged is lost (a dead host: nothing acknowledged after its kill), redis-cli
--cluster check passes, the next plan is empty (also from a state dir holding only the node folders), no shard has
two live members on one host and no tombstone's name is live again. Real servers on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.failover.actions import KILL_AT
from opsctl.providers.localfiles import deployed_records_in
from opsctl.spec.placement import with_placement
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import cluster_check
from tests.test_drain_host import live_members_apart, record_files
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration

Kill = tuple[str, str | float]  # ("at", checkpoint name) or ("after", seconds)


def killed_apply(spec: Path, kill: Kill) -> int:
    """One `opsctl apply` as its own process, killed at a named checkpoint or SIGKILLed `after` seconds in; its
    exit code (-9 when killed; 0 when it finished first)."""
    point, after = (str(kill[1]), None) if kill[0] == "at" else ("", float(kill[1]))
    env = {**os.environ, KILL_AT: point} if point else dict(os.environ)
    child = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec), "--auto-approve"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        child.wait(timeout=after if after is not None else 120)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
    code = child.wait(timeout=120)
    assert child.stderr is not None
    err = child.stderr.read()
    child.stderr.close()
    assert code in (0, -signal.SIGKILL) or kill[0] == "after", (kill, code, err)  # a kill point never breaks a run
    assert "Traceback" not in err, err
    return code


def placed_names(spec: Path) -> set[str]:
    """The names of the nodes placement keeps (from the records, as every command places)."""
    loaded = read_spec(spec)
    state = spec.parent / ".opsctl" / loaded.spec.name
    return {n.name for n in with_placement(loaded, deployed_records_in(loaded, state)).layout.nodes}


def tombstones(spec: Path) -> dict[str, dict[str, Any]]:
    return {n: r for n, r in ((n, json.loads(p.read_text())) for n, p in record_files(spec).items())
            if r.get("retired")}


def purging(spec: Path) -> dict[str, list[str]]:
    """Each tombstone still marked purging, with what its folder holds."""
    return {n: sorted(p.name for p in record_files(spec)[n].parent.iterdir())
            for n, r in tombstones(spec).items() if r.get("purging")}


def converged(capsys: pytest.CaptureFixture[str], spec: Path, retired: set[str]) -> None:
    """apply to the end (twice at most: a failover cut short may leave the next run its second half), then the plan
    is empty, from the state dir as is and from the node folders alone; no tombstone's name is live again."""
    for _ in range(2):
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        if code == 0:
            break
    assert code == 0, err + out
    assert plan_json(capsys, spec)["steps"] == []
    state = spec.parent / ".opsctl" / yaml.safe_load(spec.read_text())["name"]
    aside = spec.parent / "aside"
    aside.mkdir(mode=0o700, exist_ok=True)
    name = yaml.safe_load(spec.read_text())["name"]
    moved = [e for e in state.iterdir() if not e.name.startswith(name + "-")]
    for entry in moved:  # journal, caches, locks: a fresh runner has none of them
        entry.rename(aside / entry.name)
    try:
        assert plan_json(capsys, spec)["steps"] == []
    finally:
        for entry in moved:
            (aside / entry.name).rename(entry)
    assert purging(spec) == {}
    assert retired <= set(tombstones(spec)), (retired, tombstones(spec))  # a tombstone stays one
    assert not set(tombstones(spec)) & placed_names(spec)


def kill_schedule(spec: Path, points: list[str], spread: tuple[float, float],
                  seen: Callable[[Kill], None] = lambda kill: None) -> list[int]:
    """Run apply killed at each named point in turn, then SIGKILLed after spread[0] s, spread[0] + spread[1] s, ...
    (each run goes on from where the last stopped) until one finishes; seen: called after each kill; the exit
    codes."""
    codes = []
    kills: list[Kill] = [("at", p) for p in points]
    for kill in kills:
        codes.append(killed_apply(spec, kill))
        if codes[-1] == -signal.SIGKILL:
            seen(kill)
    after, step = spread
    for _ in range(12):
        codes.append(killed_apply(spec, ("after", after)))
        if codes[-1] != -signal.SIGKILL:
            break
        after += step
    return codes


@contextmanager
def cluster_writer(spec: Path, loaded: Any) -> Iterator[tuple[Writer, tuple[int, str]]]:
    preload(loaded, 2000)
    before = dataset_checksum(cluster_client(loaded), "pre:*")
    with Writer(lambda: cluster_client(read_spec(spec))) as writer:
        writer.wait_for_writes(100)
        yield writer, before


def cluster_kept(spec: Path, writer: Writer, before: tuple[int, str], dead_at: float | None = None,
                 masters: int = 3) -> int:
    """Nothing acknowledged lost (dead_at: nothing acknowledged after that moment), preloaded keys intact, check OK
    (masters: how many it counts)."""
    client = cluster_client(read_spec(spec))
    lost = [key for key, _ in writer.lost(client)]
    if dead_at is None:
        assert lost == []
    else:
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        assert [k for k in lost if when[k] > dead_at] == []
    assert dataset_checksum(client, "pre:*") == before
    check = cluster_check(read_spec(spec).layout.servers[0].endpoint)
    assert check.returncode == 0 and f"{masters} masters" in check.stdout, check.stdout
    live_members_apart(spec)
    return len(lost)


def report(what: str, flavor: str, codes: list[int], writer: Writer, lost: int, took: float) -> None:
    with os.fdopen(os.dup(2), "w") as err:
        print(f"\n{what} [{flavor}]: kills {sum(c == -signal.SIGKILL for c in codes)}/{len(codes)} {codes}, writes "
              f"acknowledged {len(writer.acked)}, lost {lost}, {took:.1f} s, longest write gap "
              f"{writer.max_gap_ms:.0f} ms", file=err)


RETIRE_POINTS = ["remove-node-stopped", "remove-node-forgotten", "remove-node-tombstoned", "remove-node-purged"]


def drained(spec: Path, data: dict[str, Any]) -> set[str]:
    """Write the spec with h2 removed and h4 added; the names on h2."""
    on_h2 = {n for n, p in record_files(spec).items() if json.loads(p.read_text())["deployed"]["host"] == "h2"}
    fourth = data["hosts"][0]["address"].rsplit(".", 1)[0] + ".4"
    spec.write_text(yaml.safe_dump({**data, "hosts": [*(h for h in data["hosts"] if h["name"] != "h2"),
                                                       {"name": "h4", "address": fourth}]}))
    return on_h2


@pytest.mark.parametrize(("flavor", "points"), [("valkey", RETIRE_POINTS), ("redis", [])])
def test_draining_a_host_killed_at_each_retire_point_converges(tmp_path, capsys, flavor, points) -> None:
    """h2 removed and h4 added (drain): killed at each point of a member's retirement (valkey), or at spread times
    over the whole drain (redis: the failover, the replacements' start and sync, the retirements). Killed once
    tombstoned, the node's folder still holds its data and its record says retired + purging: the next plan retires
    it again (its purge) and its name is never given to a new node."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        started = time.monotonic()
        with cluster_writer(spec, loaded) as (writer, before):
            on_h2 = drained(spec, data)

            def seen(kill: Kill) -> None:
                left = purging(spec)
                if kill == ("at", "remove-node-tombstoned"):
                    assert len(left) == 1 and len(next(iter(left.values()))) > 1, left  # data still there
                    name = next(iter(left))
                    steps = plan_json(capsys, spec)["steps"]
                    assert any(s["kind"] == "remove-node" and s["node"] == name and s["purge"] for s in steps), steps
                    assert name not in placed_names(spec)
                if kill == ("at", "remove-node-purged"):
                    assert ["opsctl-node.json"] in left.values(), left  # purged down to the tombstone

            codes = kill_schedule(spec, points, (0.5, 0.25), seen)
            converged(capsys, spec, set())
            writer.wait_for_writes(len(writer.acked) + 100)
        assert set(tombstones(spec)) == on_h2
        assert codes.count(-signal.SIGKILL) >= max(3, len(points)), codes
        report("drain killed", flavor, codes, writer, cluster_kept(spec, writer, before), time.monotonic() - started)


def test_a_replica_host_removed_killed_at_its_retirement_and_mid_sentinel_reset_converges(tmp_path, capsys) -> None:
    """Sentinel (redis): the replica on h3 removed from replication.replicas: killed once its tombstone is written,
    once the first sentinel was reset, then at spread times over the rest (the reset waits for hellos and INFO):
    the sentinels count 1 replica and 3 sentinels, every server holds the master's keys, nothing acknowledged lost."""
    from tests.test_fleet_shape_sentinel import preload as preload_master
    from tests.test_fleet_shape_sentinel import sentinel_client, sentinels_know, synced

    flavor = "redis"
    with deployed(tmp_path, capsys, "sentinel", flavor) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        on_h3 = {n for n, p in record_files(spec).items()
                 if (r := json.loads(p.read_text())["deployed"])["host"] == "h3" and r["role"] != "sentinel"}
        preload_master(sentinel_client(spec), 2000)
        started = time.monotonic()
        with Writer(lambda: sentinel_client(spec)) as writer:
            writer.wait_for_writes(100)
            spec.write_text(yaml.safe_dump({**data, "replication": {**data.get("replication", {}),
                                                                    "replicas": ["h2"]}}))

            def seen(kill: Kill) -> None:
                if kill == ("at", "remove-node-tombstoned"):
                    assert set(purging(spec)) == on_h3 and not on_h3 & placed_names(spec)
                    assert any(s["kind"] == "sentinel-reset" for s in plan_json(capsys, spec)["steps"])

            codes = kill_schedule(spec, ["remove-node-tombstoned", "sentinel-reset-one"], (1.0, 1.5), seen)
            converged(capsys, spec, on_h3)
            writer.wait_for_writes(len(writer.acked) + 100)
        lost = writer.verify(sentinel_client(spec))
        assert lost == []
        synced(spec, 2000)
        sentinels_know(spec, 1, 3)
        assert codes.count(-signal.SIGKILL) >= 3, codes
        report("replica removed, killed mid-reset", flavor, codes, writer, len(lost), time.monotonic() - started)


def test_a_dead_host_replaced_killed_mid_forget_converges(tmp_path, capsys) -> None:
    """Cluster (redis): h2 dies (SIGKILL, folders deleted), the cluster promotes its replicas, h2 gets a new address;
    apply is killed after its first round of CLUSTER FORGET and at spread times: the dead ids are known nowhere,
    nothing acknowledged after the host's kill is lost, check OK, the replacements took the dead nodes' names."""
    from tests.test_dead_host import kill_host, known_endpoints, served_again

    flavor = "redis"
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        old_address = next(h["address"] for h in data["hosts"] if h["name"] == "h2")
        started = time.monotonic()
        with cluster_writer(spec, loaded) as (writer, before):
            dead, dead_at = kill_host(spec, "h2")
            served_again(spec, old_address)
            new_address = old_address.rsplit(".", 1)[0] + ".4"
            spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": new_address} if h["name"] == "h2"
                                                              else h for h in data["hosts"]]}))
            codes = kill_schedule(spec, ["forget-nodes-once"], (0.5, 0.25))
            converged(capsys, spec, set())
            writer.wait_for_writes(len(writer.acked) + 100)
        lost = cluster_kept(spec, writer, before, dead_at)
        assert not any(e.startswith(old_address + ":") for e in known_endpoints(spec))
        assert sorted(n for n, p in record_files(spec).items()
                      if json.loads(p.read_text())["deployed"]["host"] == "h2") == dead
        assert codes[0] == -signal.SIGKILL and codes.count(-signal.SIGKILL) >= 2, codes
        report("dead host, killed mid-forget", flavor, codes, writer, lost, time.monotonic() - started)


@pytest.mark.parametrize(("topology", "points"), [("cluster", ["asked"]), ("replication", ["asked"]),
                                                  ("sentinel", ["fenced", "asked", "promoted"])])
def test_a_host_marked_maintenance_killed_mid_failover_converges(tmp_path, capsys, topology, points) -> None:
    """h1 marked maintenance (valkey): apply killed once the failover was asked (cluster: CLUSTER FAILOVER on the
    replica; replication: FAILOVER TO on the master; Sentinel: once the old master was fenced, once SENTINEL
    FAILOVER was sent, once a replica was promoted, before the old master's demotion), then at spread times: no
    master on h1, nothing acknowledged lost."""
    from tests.test_fleet_shape_sentinel import preload as preload_master
    from tests.test_maintenance import marked, master_client, masters_on

    flavor = "valkey"
    with deployed(tmp_path, capsys, topology, flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        started = time.monotonic()
        if topology == "cluster":
            context = cluster_writer(spec, loaded)
        else:
            preload_master(master_client(spec), 2000)
            context = plain_writer(spec, topology == "sentinel")
        with context as (writer, before):
            spec.write_text(yaml.safe_dump(marked(data, "h1")))
            codes = kill_schedule(spec, points, (0.5, 0.2))
            converged(capsys, spec, set())
            writer.wait_for_writes(len(writer.acked) + 100)
        assert masters_on(spec, "h1") == []
        if topology == "cluster":
            lost = cluster_kept(spec, writer, before)
        else:
            lost = len(writer.verify(master_client(spec)))
            assert lost == 0
        if topology == "sentinel":
            from tests.test_fleet_shape_sentinel import sentinels_know
            sentinels_know(spec, 2, 3)
        assert codes[0] == -signal.SIGKILL, codes  # the first point is always reached (a later one may not be:
        # killed once SENTINEL FAILOVER was sent, Sentinel finishes the failover by itself)
        report(f"{topology} maintenance killed mid-failover", flavor, codes, writer, lost, time.monotonic() - started)


@contextmanager
def plain_writer(spec: Path, sentinel: bool = False) -> Iterator[tuple[Writer, tuple[int, str]]]:
    """A writer through redis-py's Sentinel client (sentinel), else to whichever server answers ROLE master."""
    from tests.test_fleet_shape_sentinel import sentinel_client
    from tests.test_maintenance import master_client

    with Writer(lambda: sentinel_client(spec) if sentinel else master_client(spec)) as writer:
        writer.wait_for_writes(100)
        yield writer, (0, "")


def test_a_failover_a_killed_run_asked_for_is_waited_for_not_asked_again(tmp_path, capsys) -> None:
    """What a run killed right after FAILOVER TO leaves (replication, valkey): the master's FAILOVER still waits for
    the replica (stopped here for 0.5 s). The next apply waits for it to end instead of asking again (the server
    answered 'FAILOVER already in progress' and apply stopped, exit 1), and finds the replica promoted."""
    import threading

    from opsctl.spec.load import command_renames
    from tests.test_fleet_shape_sentinel import live, node_client
    from tests.test_maintenance import marked, masters_on

    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        nodes = live(spec)
        master = next(r for r in nodes.values() if r["host"] == "h1")
        replica = next(r for r in nodes.values() if r["host"] == "h2")
        pid = int((record_files(spec)[next(n for n, r in nodes.items() if r is replica)].parent / "server.pid")
                  .read_text())
        spec.write_text(yaml.safe_dump(marked(data, "h1")))
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(0.5, os.kill, (pid, signal.SIGCONT))
        try:
            renamed = command_renames(read_spec(spec).spec, None).get("FAILOVER", "FAILOVER")
            node_client(master["address"], master["port"]).execute_command(
                renamed, "TO", replica["address"], str(replica["port"]), "TIMEOUT", "20000")
            resume.start()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        finally:
            resume.cancel()
            os.kill(pid, signal.SIGCONT)
        assert code == 0 and "already in progress" not in err + out, err + out
        assert masters_on(spec, "h1") == [] and plan_json(capsys, spec)["steps"] == []
