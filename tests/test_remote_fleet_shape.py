"""The fleet changes shape on real SSH hosts (issue 22, "On the Ansible lab: a host added and one drained"): four
network-namespace hosts with their own sshd, provider: ansible, driven through the CLI as a user would.

A 3 x 1 Valkey cluster on h1-h3 with 3000 preloaded keys and a cluster client writing throughout. h4 is added to the
spec with masters 3 -> 4: the new shard's master lands on h4, existing nodes keep their names, hosts and ports (as
the records on the hosts say, read over SFTP); every acknowledged write and the preloaded keys' checksum are there,
redis-cli --cluster check passes, the next plan is empty, no shard has two members on one host.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from opsctl.providers.ansible import AnsibleProvider
from opsctl.state.specfile import read_spec
from tests import netns
from tests.lifecycle import plan_json, run
from tests.support import PASSWORD, netns_lab, write_spec
from tests.test_remote_e2e import cleanup, remote_spec, state_dir
from tests.test_scale_cluster import kept_everything
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.remote
KEYS = 3000


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    yield from netns_lab(4)


def deployed_records(spec: Path, known_hosts: str) -> dict[str, dict[str, Any]]:
    """Each node's record as it lies on its host (read over SFTP, as a fresh state dir would)."""
    loaded = read_spec(spec)
    provider = AnsibleProvider(loaded, state_dir(loaded), known_hosts=known_hosts)
    try:  # as the files hold them: the tests read them as JSON
        return {name: record.to_json() for name, record in provider.deployed_records().items()}
    finally:
        provider.close()


def live(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: r["deployed"] for name, r in records.items() if not r.get("retired") and r.get("deployed")}


def members_apart(placed: dict[str, dict[str, Any]]) -> None:
    by_shard: dict[object, list[object]] = {}
    for where in placed.values():
        by_shard.setdefault(where["shard"], []).append(where["host"])
    for shard, hosts in by_shard.items():
        assert len(hosts) == len(set(hosts)), f"shard {shard} has two members on one host: {hosts}"


def fresh_runner_steps(capsys: pytest.CaptureFixture[str], spec: Path, tmp_path: Path) -> list[Any]:
    """The plan's steps from an empty state dir (a pipeline on a fresh runner): what is deployed is read from the
    records on the hosts over SSH, so it must plan what the deploying state dir plans."""
    empty = tmp_path / f"fresh-{time.monotonic_ns()}"
    empty.mkdir()
    code, out, err = run(capsys, "plan", "-f", str(spec), "--state-dir", str(empty), "--output", "json")
    assert code in (0, 2), err + out
    steps: list[Any] = json.loads(out)["steps"]
    return steps


def known_addresses(placed: dict[str, dict[str, Any]]) -> set[str]:
    """The address of every node any live node's CLUSTER NODES lists (itself included)."""
    seen = set()
    for where in placed.values():
        client = redis.Redis(host=where["address"], port=where["port"], password=PASSWORD, decode_responses=True)
        lines = str(client.execute_command("CLUSTER", "NODES")).splitlines()
        seen |= {line.split()[1].rsplit(":", 1)[0] for line in lines if line}
    return seen


def applied(capsys: pytest.CaptureFixture[str], spec: Path, masters: str) -> float:
    started = time.monotonic()
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    took = time.monotonic() - started
    assert code == 0 and masters in out, err + out
    assert plan_json(capsys, spec)["steps"] == []
    return took


def test_a_host_added_takes_the_new_shard(lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    data = remote_spec(lab, "cluster", "valkey")
    all_hosts = data["hosts"]
    data["hosts"] = all_hosts[:3]
    spec = write_spec(tmp_path, data)
    with cleanup(spec):
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        loaded = read_spec(spec)
        preload(loaded, KEYS)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        first = live(deployed_records(spec, lab.known_hosts))
        assert len(first) == 6
        assert fresh_runner_steps(capsys, spec, tmp_path) == []
        with Writer(lambda: cluster_client(read_spec(spec))) as writer:
            writer.wait_for_writes(100)
            grown = {**data, "hosts": all_hosts, "cluster": {**data["cluster"], "masters": 4}}
            spec.write_text(yaml.safe_dump(grown))
            added = applied(capsys, spec, "4 masters")
            assert fresh_runner_steps(capsys, spec, tmp_path) == []
            writer.wait_for_writes(len(writer.acked) + 100)
            placed = live(deployed_records(spec, lab.known_hosts))
            assert all(placed[name] == was for name, was in first.items()), (first, placed)
            new = {name: where for name, where in placed.items() if name not in first}
            assert len(new) == 2 and [w["host"] for w in new.values() if w["role"] == "master"] == ["h4"], new
            members_apart(placed)
        kept_everything(spec, writer, before, "4 masters")
        with capsys.disabled():  # the figures for the closing note
            print(f"\nlab add valkey: keys {KEYS}, writes acknowledged {len(writer.acked)}, lost 0, "
                  f"apply {added:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)


def test_a_host_removed_from_the_spec_is_drained(lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 x 1 cluster over h1-h4; h2 removed from the spec: its nodes are replaced on the other hosts (a master failed
    over first), forgotten, stopped and purged down to their tombstone records; opsctl finds h2 through the hosts
    table the other hosts hold (hosts.json), with the SSH settings h2 had."""
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    data = remote_spec(lab, "cluster", "valkey")
    spec = write_spec(tmp_path, data)
    with cleanup(spec):
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        loaded = read_spec(spec)
        preload(loaded, KEYS)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        placed = live(deployed_records(spec, lab.known_hosts))
        on_h2 = sorted(name for name, where in placed.items() if where["host"] == "h2")
        assert on_h2, placed
        with Writer(lambda: cluster_client(read_spec(spec))) as writer:
            writer.wait_for_writes(100)
            drained = {**data, "hosts": [h for h in data["hosts"] if h["name"] != "h2"]}
            spec.write_text(yaml.safe_dump(drained))
            code, out, err = run(capsys, "plan", "-f", str(spec))
            assert code == 2 and "h2 removed from the spec" in out, err + out
            took = applied(capsys, spec, "3 masters")
            assert fresh_runner_steps(capsys, spec, tmp_path) == []  # h2's tombstones found through hosts.json
            writer.wait_for_writes(len(writer.acked) + 100)
        records = deployed_records(spec, lab.known_hosts)
        left = live(records)
        assert not any(where["host"] == "h2" for where in left.values()), left
        assert all(left[name] == was for name, was in placed.items() if name not in on_h2)
        assert all(records[name].get("retired") for name in on_h2), {n: records.get(n) for n in on_h2}
        members_apart(left)
        h2 = next(h for h in lab.hosts if h.name == "h2")
        assert lab.processes(h2) == ["sshd"], lab.processes(h2)
        known = known_addresses(left)  # h2's nodes forgotten on every node
        assert h2.address not in known and {where["address"] for where in left.values()} <= known, known
        kept_everything(spec, writer, before, "3 masters")
        with capsys.disabled():  # the figures for the closing note
            print(f"\nlab drain valkey: keys {KEYS}, writes acknowledged {len(writer.acked)}, lost 0, "
                  f"apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)
