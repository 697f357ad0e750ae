"""A Sentinel topology changes shape on real SSH hosts (issue 22, "On the Ansible lab: ... one drained", Sentinel):
four network-namespace hosts with their own sshd, provider: ansible, driven through the CLI as a user would.

Valkey, the master on h1, replicas on h2-h4, sentinels on h1-h3, 2000 preloaded keys and a writer through redis-py's
Sentinel client throughout. h4 is removed from the spec: its replica is stopped and purged down to its tombstone
record on h4 (found through the hosts table the other hosts keep), the sentinels are reset and count two replicas;
every acknowledged write is on every server, the next plan is empty, also from an empty state dir, and still so
with the tombstone's name known after a later deploy has left h4 out of the hosts table.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from opsctl.base.poll import wait_for
from tests import netns
from tests.lifecycle import plan_json, run
from tests.support import CONDITION_BOUND, netns_lab, write_spec
from tests.test_fleet_shape_sentinel import node_client, preload, sentinel_client
from tests.test_remote_e2e import cleanup, remote_spec
from tests.test_remote_fleet_shape import deployed_records, fresh_runner_steps, live
from tests.writer import Writer

pytestmark = pytest.mark.remote
KEYS = 2000


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    yield from netns_lab(4)


def servers(placed: dict[str, dict[str, Any]]) -> list[redis.Redis]:
    return [node_client(w["address"], w["port"]) for w in placed.values() if w["role"] != "sentinel"]


def holds(client: redis.Redis, keys: int) -> bool | None:
    return True if int(client.dbsize()) >= keys else None


def tombstones_outlive_a_later_deploy(capsys: pytest.CaptureFixture[str], spec: Path, tmp_path: Path,
                                      known_hosts: str, retired: list[str]) -> None:
    """A later deploy (a config change) leaves the drained host out of hosts.json; the tombstones it holds are still
    known to a fresh runner (carried in the other hosts' tables), so their names are never given again."""
    data = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**data, "memory": {**data["memory"], "maxmemory": "72mb"}}))
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    assert code == 0 and "write-config" in out, err + out
    records = deployed_records(spec, known_hosts)
    assert all(records.get(name, {}).get("retired") for name in retired), (retired, records)
    assert fresh_runner_steps(capsys, spec, tmp_path) == []


def test_a_replica_host_removed_is_drained(lab: netns.Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """hosts h1-h4 -> h1-h3 (sentinels on h1-h3 throughout): h4's replica retires, its tombstone stays on h4, the
    sentinels count 2 replicas and 3 sentinels, the master untouched, 0 acknowledged writes lost."""
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)
    data = remote_spec(lab, "sentinel", "valkey", sentinel={"hosts": ["h1", "h2", "h3"]})
    spec = write_spec(tmp_path, data)
    with cleanup(spec):
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        before = live(deployed_records(spec, lab.known_hosts))
        on_h4 = sorted(name for name, where in before.items() if where["host"] == "h4")
        assert [before[name]["role"] for name in on_h4] == ["replica"], before
        preload(sentinel_client(spec), KEYS)
        with Writer(lambda: sentinel_client(spec)) as writer:
            writer.wait_for_writes(100)
            spec.write_text(yaml.safe_dump({**data, "hosts": data["hosts"][:3]}))
            code, out, err = run(capsys, "plan", "-f", str(spec))
            assert code == 2 and "h4 removed from the spec" in out, err + out
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0 and "sentinel-reset" in err + out, err + out
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(sentinel_client(spec)) == []
        assert fresh_runner_steps(capsys, spec, tmp_path) == []
        records = deployed_records(spec, lab.known_hosts)
        left = live(records)
        assert all(records[name].get("retired") and not records[name].get("purging") for name in on_h4), records
        assert left == {name: was for name, was in before.items() if name not in on_h4}, (before, left)
        h4 = next(h for h in lab.hosts if h.name == "h4")
        assert lab.processes(h4) == ["sshd"], lab.processes(h4)
        folder = lab.ssh(h4, f"ls -A /var/lib/opsctl/{data['name']}/{on_h4[0]}")
        assert folder.stdout.split() == ["opsctl-node.json"], folder
        everything = KEYS + len(writer.acked)
        for client in servers(left):
            wait_for(partial(holds, client, everything), CONDITION_BOUND, "every server to hold every key")
        roles = [client.execute_command("ROLE")[0] for client in servers(left)]
        assert roles.count("master") == 1 and before[f"{data['name']}-1"]["role"] == "master", roles
        for where in (w for w in left.values() if w["role"] == "sentinel"):
            info = node_client(where["address"], where["port"]).info("sentinel")["master0"]
            assert (info["slaves"], info["sentinels"], info["status"]) == (2, 3, "ok"), (where, info)
        tombstones_outlive_a_later_deploy(capsys, spec, tmp_path, lab.known_hosts, on_h4)
        with capsys.disabled():  # the figures for the closing note
            print(f"\nlab sentinel replica host drained valkey: keys {KEYS}, writes acknowledged {len(writer.acked)}, "
                  f"lost 0, apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)
