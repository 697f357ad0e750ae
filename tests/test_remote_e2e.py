"""End to end over real SSH: three network-namespace hosts with their own sshd, provider: ansible.

Deploys a 3-master/3-replica cluster and a Sentinel topology through ansible-runner, checks them with the
referees (redis-cli --cluster check; PING with auth on every node), applies again with zero changed tasks,
plants a canary password and greps every artifact for it, then destroys everything.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsctl.admin import Admin
from opsctl.errors import OpsctlError
from opsctl.providers.ansible import AnsibleProvider
from opsctl.specfile import read_spec
from tests import netns
from tests.support import PASSWORD, PASSWORD_ENV, cluster_check, make_spec, missing, server_binary, write_spec

pytestmark = pytest.mark.remote
CANARY = "canary-pw-7f3e9b1c5d2a4e60"


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    why = netns.unavailable()
    if why:
        missing(why)
    created = netns.up(3)
    try:
        yield created
    finally:
        netns.down(created.id)


def remote_spec(lab: netns.Lab, topology: str, flavor: str, **extra: Any) -> dict[str, Any]:
    spec = make_spec(topology, flavor, **extra)
    spec["provider"] = "ansible"
    spec["hosts"] = lab.spec_hosts()
    if flavor == "valkey":
        spec["server"]["binary"] = server_binary("valkey")
    else:
        server_binary("redis")  # installed from the OS package by the playbook; fail early if it is missing
    return spec


def provider_for(tmp_path: Path, lab: netns.Lab, spec: dict[str, Any], env: dict[str, str] | None = None,
                 events: list[dict[str, Any]] | None = None) -> AnsibleProvider:
    loaded = read_spec(write_spec(tmp_path, spec), env)
    sink = events.append if events is not None else None
    return AnsibleProvider(loaded, tmp_path / "state", known_hosts=lab.known_hosts, on_event=sink)


def wait_ping(provider: AnsibleProvider, timeout: float = 20.0) -> None:
    """Every node answers PING with auth (polled every few ms)."""
    for node in provider.loaded.layout.nodes:
        deadline = time.monotonic() + timeout
        with Admin.for_node(provider.loaded, node, timeout=2.0) as admin:
            while not admin.ping():
                assert time.monotonic() < deadline, f"{node.name} does not answer PING at {node.endpoint}"
                time.sleep(0.02)


def destroy(provider: AnsibleProvider) -> None:
    provider.playbook("destroy.yml", {"opsctl_purge": True})
    provider.close()


def test_cluster_across_three_ssh_hosts(lab: netns.Lab, tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    provider = provider_for(tmp_path, lab, remote_spec(lab, "cluster", "valkey"), events=events)
    try:
        first = provider.deploy()
        assert first.changed > 0
        assert any(e.get("event") == "playbook_on_task_start" for e in events)  # progress from runner events
        wait_ping(provider)
        layout = provider.loaded.layout
        assert {n.host for n in layout.nodes} == {"h1", "h2", "h3"}
        assert all(provider.process_state(n).running for n in layout.nodes)
        form_cluster = pytest.importorskip("opsctl.cluster.ops").form_cluster
        form_cluster(provider.loaded, layout)
        check = cluster_check(layout.nodes[0].endpoint)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "[OK] All 16384 slots covered" in check.stdout
        again = provider.deploy()
        assert again.changed == 0, again.changed_tasks
        own = lab.ssh(lab.hosts[0], f"ls {provider.paths(layout.nodes[0]).dir}")
        assert "redis.conf" in own.stdout
        other = lab.ssh(lab.hosts[1], f"ls {provider.paths(layout.nodes[0]).dir}")
        assert other.returncode != 0  # h2 cannot see h1's files: private mount namespaces
    finally:
        destroy(provider)
    assert lab.ssh(lab.hosts[0], f"ls {provider.paths(layout.nodes[0]).dir}").returncode != 0
    assert all(lab.processes(h) == ["sshd"] for h in lab.hosts), [lab.processes(h) for h in lab.hosts]


def test_sentinel_with_os_package_and_canary(lab: netns.Lab, tmp_path: Path) -> None:
    """Redis from the OS package; the password is a canary that must appear in no artifact, log or event."""
    spec = remote_spec(lab, "sentinel", "redis")
    spec["auth"] = {"mode": "password", "password": {"env": "OPSCTL_CANARY_PW"}}
    events: list[dict[str, Any]] = []
    provider = provider_for(tmp_path, lab, spec, {"OPSCTL_CANARY_PW": CANARY}, events)
    try:
        provider.deploy()
        sentinels = provider.loaded.layout.sentinels
        assert len(sentinels) == 3
        with Admin.for_node(provider.loaded, provider.loaded.layout.servers[0]) as admin:
            deadline = time.monotonic() + 10
            while not admin.ping():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            node = provider.loaded.layout.servers[0]
            assert admin.config_get("port")["port"] == str(node.port)  # authenticated with the canary
        assert provider.deploy().changed == 0
        for host in lab.hosts:  # server logs on the hosts
            found = lab.ssh(host, f"grep -rl {CANARY} /var/lib/opsctl --include=*.log")
            assert found.stdout == "", found.stdout
        restarted = provider.playbook("restart.yml")
        assert restarted.changed == 2 * len(provider.loaded.layout.nodes)  # a stop and a start per node
        wait_ping(provider)
        with provider.tunnel(sentinels[0]) as tunnel, Admin(provider.loaded, "127.0.0.1", tunnel.local_port,
                                                            sentinel=True) as admin:
            assert admin.ping()  # admin traffic through an SSH tunnel
    finally:
        destroy(provider)
    leaks = subprocess.run(["grep", "-rl", CANARY, str(tmp_path)], capture_output=True, text=True, check=False)
    assert leaks.stdout == "", f"canary found in {leaks.stdout}"
    assert CANARY not in repr(events)
    assert not (tmp_path / "state" / "ansible" / "files").exists()


def test_unreachable_host_names_host_and_task(lab: netns.Lab, tmp_path: Path) -> None:
    spec = remote_spec(lab, "standalone", "valkey")
    spec["hosts"][0]["ssh_key"] = str(tmp_path / "wrong_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong_key")], check=True)
    provider = provider_for(tmp_path, lab, spec)
    with pytest.raises(OpsctlError) as caught:
        provider.deploy()
    assert "h1" in caught.value.summary and "task" in caught.value.summary
    assert PASSWORD not in caught.value.render()
    with pytest.raises(OpsctlError) as ssh_caught:
        provider.process_state(provider.loaded.layout.nodes[0])
    assert "h1" in ssh_caught.value.summary
    assert PASSWORD_ENV
