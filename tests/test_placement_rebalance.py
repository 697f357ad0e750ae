"""Hosts added, then existing members moved onto them to even out load (issue 22, item 2): `opsctl cluster rebalance
--placement` and cluster.rebalance_placement, each move a new replica on the target host, synced, a master failed
over first, then the old member forgotten, stopped and purged; under a concurrent writer, and with opsctl SIGKILLed
mid-move. Real servers on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opsctl.failover.actions import KILL_AT
from tests.lifecycle import deployed, plan_json, run
from tests.test_drain_host import live_members_apart, record_files
from tests.test_fleet_shape import tombstones
from tests.test_scale_cluster import kept_everything
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def with_hosts(data: dict, *numbers: int) -> dict:
    """data with hosts h<n> appended, at the first host's /24 and .n."""
    prefix = data["hosts"][0]["address"].rsplit(".", 1)[0]
    return {**data, "hosts": [*data["hosts"], *({"name": f"h{n}", "address": f"{prefix}.{n}"} for n in numbers)]}


def live_loads(spec: Path) -> dict[str, int]:
    """Live (not retired) members per host, as the nodes' records say."""
    counts: dict[str, int] = {h["name"]: 0 for h in yaml.safe_load(spec.read_text())["hosts"]}
    for path in record_files(spec).values():
        record = json.loads(path.read_text())
        if not record.get("retired"):
            counts[record["deployed"]["host"]] += 1
    return counts


def rebalance(capsys: pytest.CaptureFixture[str], spec: Path, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "cluster", "rebalance", "--placement", "-f", str(spec), *extra)


def moved_in(out: str) -> list[str]:
    """The names the plan text retires as moved to even out load."""
    return sorted({line.split()[2] for line in out.splitlines() if "to even out load" in line
                   and "remove-node" in line})


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_two_hosts_added_then_members_moved_onto_them_under_a_writer(tmp_path, capsys, flavor) -> None:
    """3 masters x 1 replica over h1-h3; h4 and h5 appended (nothing moves by itself); `cluster rebalance
    --placement` moves one member onto each: 0 acknowledged writes lost, check OK, members apart, loads even."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        spec.write_text(yaml.safe_dump(with_hosts(data, 4, 5)))
        assert plan_json(capsys, spec)["steps"] == []  # an added host takes new members only
        preload(loaded, 4000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            code, out, err = rebalance(capsys, spec, "--dry-run")
            assert code == 2 and "2 to move" in out and "to even out load (h1 2 members, h4 0)" in out, err + out
            started = time.monotonic()
            code, out, err = rebalance(capsys, spec, "--auto-approve")
            took = time.monotonic() - started
            assert code == 0 and "3 masters" in out, err + out
            writer.wait_for_writes(len(writer.acked) + 100)
        code, out, err = rebalance(capsys, spec, "--dry-run")
        assert code == 0, err + out  # the next plan moves nothing
        assert plan_json(capsys, spec)["steps"] == []
        kept_everything(spec, writer, before, "3 masters")
        live_members_apart(spec)
        assert sorted(live_loads(spec).values()) == [1, 1, 1, 1, 2], live_loads(spec)
        retired = [n for n, p in record_files(spec).items() if json.loads(p.read_text()).get("retired")]
        assert len(retired) == 2
        tombstones(spec, retired)
        with capsys.disabled():
            print(f"\nplacement rebalance {flavor}: keys {before[0]}, writes acknowledged {len(writer.acked)}, "
                  f"lost 0, moves 2, time {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms",
                  file=sys.stderr)


@pytest.mark.parametrize(("flavor", "killed"), [("valkey", ""), ("redis", ""), ("valkey", f"{KILL_AT}=asked"),
                                               ("valkey", "remove-node ")])
def test_a_master_moves_by_a_graceful_failover_set_in_the_spec(tmp_path, capsys, flavor, killed) -> None:
    """Shard 3 failed over to its replica on h1 (h1 serves two masters); h4 appended with cluster.rebalance_placement:
    apply moves that master off h1 (failed over to its old master on h3 first, never restarted elsewhere). Killed
    once CLUSTER FAILOVER was asked, or when the old master's removal starts: the next apply finishes it."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        name = data["name"]
        code, out, err = run(capsys, "failover", "-f", str(spec), "--yes", "--to", f"{name}-6")
        assert code == 0, err + out
        grown = with_hosts(data, 4)
        spec.write_text(yaml.safe_dump({**grown, "cluster": {**grown["cluster"], "rebalance_placement": True}}))
        preload(loaded, 2000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            code, out, err = run(capsys, "plan", "-f", str(spec))
            assert code == 2 and "failover" in out and f"{name}-6 on h1: moved to h4" in out, err + out
            started = time.monotonic()
            seen = killed_rebalance(spec, killed, "apply") if killed else ""
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0 and "move-slots" not in seen + err + out, seen + err + out
            writer.wait_for_writes(len(writer.acked) + 100)
        assert plan_json(capsys, spec)["steps"] == []
        kept_everything(spec, writer, before, "3 masters")
        live_members_apart(spec)
        assert sorted(live_loads(spec).values()) == [1, 1, 2, 2], live_loads(spec)
        tombstones(spec, [f"{name}-6"])
        assert max(int(n.rsplit("-", 1)[1]) for n in record_files(spec)) == 7  # one replacement, never redone
        with capsys.disabled():
            print(f"\nplacement rebalance {flavor}, a master moved (killed: {killed or 'no'}): keys {before[0]}, "
                  f"writes acknowledged {len(writer.acked)}, lost 0, time {took:.1f} s, longest write gap "
                  f"{writer.max_gap_ms:.0f} ms",
                  file=sys.stderr)


def killed_rebalance(spec: Path, marker: str, *argv: str) -> str:
    """argv (default: `cluster rebalance --placement`) in a child opsctl, SIGKILLed as soon as a step naming marker
    starts; marker KILL_AT=<point>: the child kills itself at that checkpoint."""
    point = marker.removeprefix(f"{KILL_AT}=") if marker.startswith(KILL_AT) else ""
    child = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", *(argv or ("cluster", "rebalance",
                              "--placement")), "-f", str(spec), "--auto-approve"],
                             env={**os.environ, "PYTHONUNBUFFERED": "1", **({KILL_AT: point} if point else {})},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    assert child.stdout is not None
    for line in child.stdout:
        seen.append(line)
        if not point and line.lstrip().startswith("[") and marker in line:
            child.send_signal(signal.SIGKILL)
            break
    child.stdout.close()
    assert child.wait(timeout=120) == -signal.SIGKILL, "".join(seen)
    return "".join(seen)


@pytest.mark.parametrize(("flavor", "marker"), [("valkey", "replicate "), ("valkey", "remove-node "),
                                               ("valkey", f"{KILL_AT}=remove-node-forgotten"),
                                               ("redis", "remove-node ")])
def test_a_rebalance_killed_mid_move_is_finished_by_the_next_run(tmp_path, capsys, flavor, marker) -> None:
    """SIGKILLed when a step starts (a replacement joined but not replicating yet; or synced, the old one not
    removed) or once the first old member was forgotten everywhere, still running: the same command again finishes
    the moves (no name past the two replacements is ever given: nothing redone); nothing lost, no third member."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        spec.write_text(yaml.safe_dump(with_hosts(data, 4, 5)))
        preload(loaded, 4000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            killed_rebalance(spec, marker)
            code, out, err = rebalance(capsys, spec, "--auto-approve")
            assert code == 0, err + out
            writer.wait_for_writes(len(writer.acked) + 100)
        code, out, err = rebalance(capsys, spec, "--dry-run")
        assert code == 0, err + out
        kept_everything(spec, writer, before, "3 masters")
        live_members_apart(spec)  # exactly two live members per shard: no duplicate, none missing
        assert sorted(live_loads(spec).values()) == [1, 1, 1, 1, 2], live_loads(spec)
        assert max(int(n.rsplit("-", 1)[1]) for n in record_files(spec)) == 8
        with capsys.disabled():
            print(f"\nplacement rebalance {flavor} killed at {marker.strip()}: keys {before[0]}, writes acknowledged "
                  f"{len(writer.acked)}, lost 0", file=sys.stderr)
