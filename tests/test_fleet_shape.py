"""The fleet changes shape in place (issue 22): one spec edit 3 hosts -> 4, replicas_per_master 1 -> 2 and masters
3 -> 4, in one apply, under a concurrent writer; then replicas_per_master back to 1. Real servers on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opsctl.cli.main import main
from opsctl.failover.actions import KILL_AT
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import cluster_check
from tests.test_scale_cluster import kept_everything
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def records(spec: Path) -> dict[str, dict[str, object]]:
    """Each node folder's deployed placement (the local provider's records in the state dir)."""
    state = spec.parent / ".opsctl" / yaml.safe_load(spec.read_text())["name"]
    found = {}
    for record in state.glob("*/opsctl-node.json"):
        found[record.parent.name] = json.loads(record.read_text())["deployed"]
    return found


def members_apart(spec: Path) -> None:
    """No shard has two members on one host (anti-affinity), as the nodes' records say."""
    loaded = read_spec(spec)
    placed = records(spec)
    names = {n.name for n in loaded.layout.nodes} | set(placed)
    by_shard: dict[object, list[object]] = {}
    for name in names:
        if name in placed:
            by_shard.setdefault(placed[name]["shard"], []).append(placed[name]["host"])
    for shard, hosts in by_shard.items():
        assert len(hosts) == len(set(hosts)), f"shard {shard} has two members on one host: {hosts}"


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_one_edit_adds_a_host_a_replica_per_shard_and_a_shard_and_loses_nothing(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        before_records = records(spec)
        fourth = data["hosts"][0]["address"].rsplit(".", 1)[0] + ".4"
        grown = {**data, "hosts": [*data["hosts"], {"name": "h4", "address": fourth}],
                 "cluster": {**data["cluster"], "masters": 4, "replicas_per_master": 2}}
        try:
            preload(loaded, 4000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(100)
                spec.write_text(yaml.safe_dump(grown))
                code, out, err = run(capsys, "plan", "-f", str(spec))
                assert code == 2, err + out
                assert "to add" in out and "new replica of shard 2 (replicas_per_master 1 -> 2)" in out, out
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
                after = records(spec)
                assert all(after[name] == was for name, was in before_records.items()), (before_records, after)
                assert len(after) == 12 and any(r["host"] == "h4" for r in after.values())
                members_apart(spec)

                state = spec.parent / ".opsctl" / data["name"]  # the state dir with the node folders only
                aside = tmp_path / "fresh"
                aside.mkdir(mode=0o700)
                for entry in state.iterdir():
                    if not entry.name.startswith(data["name"] + "-"):
                        entry.rename(aside / entry.name)
                try:
                    assert plan_json(capsys, spec)["steps"] == []
                finally:
                    for entry in aside.iterdir():
                        entry.rename(state / entry.name)

                shrunk = {**grown, "cluster": {**grown["cluster"], "replicas_per_master": 1}}
                spec.write_text(yaml.safe_dump(shrunk))
                plan = plan_json(capsys, spec)
                removed = [s["node"] for s in plan["steps"] if s["kind"] == "remove-node"]
                assert len(removed) == 4, plan["steps"]
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            kept_everything(spec, writer, before, "4 masters")
            cluster_check(read_spec(spec).layout.nodes[0].endpoint)
        finally:
            spec.write_text(yaml.safe_dump(grown))
            main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
            shutil.rmtree(tmp_path / "fresh", ignore_errors=True)
            capsys.readouterr()


def served_slots(endpoint: str, address: str, port: int) -> int:
    """How many slots the node at address:port serves in the cluster's view from endpoint."""
    check = cluster_check(endpoint)
    assert check.returncode == 0, check.stdout
    mine = [line for line in check.stdout.splitlines() if f"{address}:{port}" in line and line.startswith("M:")]
    if not mine:
        return 0
    index = check.stdout.splitlines().index(mine[0])
    slots_line = check.stdout.splitlines()[index + 1]
    return int(slots_line.split("(")[1].split(" slots")[0]) if "slots:" in slots_line else 0


def tombstones(spec: Path, names: list[str]) -> None:
    """Each retired node's folder was purged down to its record, marked retired (its name is kept from reuse)."""
    state = spec.parent / ".opsctl" / yaml.safe_load(spec.read_text())["name"]
    for name in names:
        assert [p.name for p in (state / name).iterdir()] == ["opsctl-node.json"], name
        assert json.loads((state / name / "opsctl-node.json").read_text())["retired"] is True


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_fewer_replicas_after_a_failover_keep_the_shards_master_and_retire_a_replica(tmp_path, capsys,
                                                                                    flavor) -> None:
    """Shard 1 is failed over by hand to the replica placement would retire by its records (the newest); then
    replicas_per_master 2 -> 1: that node stays the shard's master with its slots, another member retires."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        wide = {**data, "cluster": {**data["cluster"], "replicas_per_master": 2}}
        try:
            spec.write_text(yaml.safe_dump(wide))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
            placed = records(spec)
            shard1 = sorted((n for n, r in placed.items() if r["shard"] == 1), key=lambda n: int(n.rsplit("-")[1]))
            promoted = shard1[-1]  # the newest: the member the records alone would retire
            code, out, err = run(capsys, "failover", "-f", str(spec), "--to", promoted, "--auto-approve")
            assert code == 0, err + out
            preload(loaded, 4000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            address = next(h["address"] for h in data["hosts"] if h["name"] == placed[promoted]["host"])
            port = int(str(placed[promoted]["port"]))
            first = loaded.layout.servers[0].endpoint
            slots = served_slots(first, address, port)
            assert slots > 0
            started = time.monotonic()
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(100)
                spec.write_text(yaml.safe_dump({**wide, "cluster": {**wide["cluster"], "replicas_per_master": 1}}))
                plan = plan_json(capsys, spec)
                kinds = {s["kind"] for s in plan["steps"]}
                removed = [s["node"] for s in plan["steps"] if s["kind"] == "remove-node"]
                assert "move-slots" not in kinds and promoted not in removed and len(removed) == 3, plan["steps"]
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            took = time.monotonic() - started
            assert served_slots(first, address, port) == slots  # still the shard's master, its slots kept
            kept_everything(spec, writer, before, "3 masters")
            tombstones(spec, removed)
            spec.write_text(yaml.safe_dump(wide))  # back to 2 replicas: new names, never a retired one
            added = {s["node"] for s in plan_json(capsys, spec)["steps"] if s["kind"] == "start"}
            assert len(added) == 3 and not added & set(removed), added
            with capsys.disabled():
                print(f"\n[{flavor}] failover then replicas 2 -> 1: keys {before[0]}, acked {len(writer.acked)}, "
                      f"lost 0, time {took:.1f} s, max write gap {writer.max_gap_ms:.0f} ms, retired {removed}")
        finally:
            spec.write_text(yaml.safe_dump(wide))
            capsys.readouterr()


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_fewer_replicas_killed_after_a_forget_are_purged_by_the_next_apply(tmp_path, capsys, flavor) -> None:
    """replicas_per_master 2 -> 1, opsctl SIGKILLed once the first surplus replica is forgotten, before its purge:
    the next plan purges it (no node of the cluster knows it) and retires the rest; nothing acknowledged lost."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        wide = {**data, "cluster": {**data["cluster"], "replicas_per_master": 2}}
        try:
            spec.write_text(yaml.safe_dump(wide))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
            preload(loaded, 4000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            started = time.monotonic()
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(100)
                spec.write_text(yaml.safe_dump(data))
                removed = sorted(s["node"] for s in plan_json(capsys, spec)["steps"] if s["kind"] == "remove-node")
                killed = subprocess.run([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec),
                                         "--auto-approve"], env={**os.environ, KILL_AT: "remove-node-forgotten"},
                                        capture_output=True, text=True, timeout=120, check=False)
                assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
                steps = plan_json(capsys, spec)["steps"]
                again = sorted(s["node"] for s in steps if s["kind"] == "remove-node")
                assert again == removed and all(s["purge"] for s in steps if s["kind"] == "remove-node"), steps
                assert any("no node of the cluster knows it" in s["reason"] for s in steps), steps
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            took = time.monotonic() - started
            kept_everything(spec, writer, before, "3 masters")
            tombstones(spec, removed)
            with capsys.disabled():
                print(f"\n[{flavor}] replicas 2 -> 1 killed after a forget: keys {before[0]}, acked "
                      f"{len(writer.acked)}, lost 0, time {took:.1f} s, max write gap {writer.max_gap_ms:.0f} ms")
        finally:
            spec.write_text(yaml.safe_dump(wide))
            capsys.readouterr()


def killed_at(spec: Path, marker: str) -> None:
    """Run apply in a child opsctl and SIGKILL it as soon as a step naming marker starts ("[i/N] <step> ...")."""
    child = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(spec), "--auto-approve"],
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    seen = []
    assert child.stdout is not None
    for line in child.stdout:
        seen.append(line)
        if line.lstrip().startswith("[") and marker in line:
            child.send_signal(signal.SIGKILL)
            break
    child.stdout.close()
    assert child.wait(timeout=120) == -signal.SIGKILL, "".join(seen)


@pytest.mark.parametrize("marker", ["replicate ", "move-slots "])
def test_one_shape_edit_killed_at_a_step_converges_on_the_next_apply(tmp_path, capsys, marker) -> None:
    """hosts 3 -> 4, replicas_per_master 1 -> 2 and masters 3 -> 4, opsctl SIGKILLed when a step starts: the next
    apply converges (next plan empty, every deployed node's record unchanged), nothing acknowledged lost."""
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        before_records = records(spec)
        fourth = data["hosts"][0]["address"].rsplit(".", 1)[0] + ".4"
        grown = {**data, "hosts": [*data["hosts"], {"name": "h4", "address": fourth}],
                 "cluster": {**data["cluster"], "masters": 4, "replicas_per_master": 2}}
        try:
            preload(loaded, 4000)
            before = dataset_checksum(cluster_client(loaded), "pre:*")
            started = time.monotonic()
            with Writer(lambda: cluster_client(read_spec(spec))) as writer:
                writer.wait_for_writes(100)
                spec.write_text(yaml.safe_dump(grown))
                killed_at(spec, marker)
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0 and "4 masters" in out, err + out
                assert plan_json(capsys, spec)["steps"] == []
                writer.wait_for_writes(len(writer.acked) + 100)
            took = time.monotonic() - started
            after = records(spec)
            assert all(after[name] == was for name, was in before_records.items()), (before_records, after)
            assert len(after) == 12
            members_apart(spec)
            kept_everything(spec, writer, before, "4 masters")
            with capsys.disabled():
                print(f"\n[valkey] grow killed at {marker.strip()}: keys {before[0]}, acked {len(writer.acked)}, "
                      f"lost 0, time {took:.1f} s, max write gap {writer.max_gap_ms:.0f} ms")
        finally:
            spec.write_text(yaml.safe_dump(grown))
            capsys.readouterr()
