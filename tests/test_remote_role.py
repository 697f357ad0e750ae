"""The role `opsctl` (playbooks/roles/opsctl) from a site playbook of the user's own, as its docs say: `opsctl
inventory --with-files`, then inventories/site.example.yml with ansible-playbook against the netns lab, logged in
as the unprivileged `ops` (become through sudo). `--check --diff` names what would change and changes nothing; the
real run deploys and starts the node; a second `--check` finds nothing to change; `opsctl destroy` cleans up."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from opsctl.cli.main import main
from opsctl.state.specfile import read_spec
from tests import netns
from tests.support import PASSWORD, make_spec, netns_lab, server_binary, write_spec

pytestmark = pytest.mark.remote
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.Lab]:
    yield from netns_lab(1)


def site_playbook(tmp_path: Path, group: str) -> Path:
    """inventories/site.example.yml aimed at this spec's group, as a user edits it."""
    text = (REPO / "inventories" / "site.example.yml").read_text()
    assert "hosts: opsctl_orders\n" in text
    path = tmp_path / "site.yml"
    path.write_text(text.replace("hosts: opsctl_orders\n", f"hosts: {group}\n"))
    return path


def ansible_playbook(inventory: Path, playbook: Path, *extra: str) -> str:
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": os.environ.get("HOME", "/root"), "ANSIBLE_ROLES_PATH": str(REPO / "playbooks" / "roles"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PIPELINING": "True", "ANSIBLE_RETRY_FILES_ENABLED": "False"}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                           str(playbook), *extra], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def recap_changed(output: str) -> int:
    """changed=N of the host's PLAY RECAP line."""
    line = next(line for line in output.splitlines() if " changed=" in line and "ok=" in line)
    return int(line.split(" changed=")[1].split()[0])


def test_the_role_from_a_site_playbook_with_check_and_become(lab: netns.Lab, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_SSH_KNOWN_HOSTS", lab.known_hosts)  # opsctl destroy checks host keys there
    spec_data = make_spec("standalone", "valkey", hosts=1)
    spec_data["provider"] = "ansible"
    spec_data["hosts"] = lab.spec_hosts(netns.LOGIN_USER)
    spec_data["server"]["binary"] = server_binary("valkey")
    spec_data["config"] = {"tcp-backlog": 8192}  # above the lab's somaxconn (4096): the deploy raises it
    spec = write_spec(tmp_path, spec_data)
    loaded = read_spec(spec)
    name, node = loaded.spec.name, loaded.layout.nodes[0]
    host = lab.hosts[0]
    root = f"/var/lib/opsctl/{name}"
    inventories = tmp_path / "inventories"
    assert main(["inventory", "-f", str(spec), "--dir", str(inventories), "--with-files",
                 "--known-hosts", lab.known_hosts]) == 0
    inventory, site = inventories / f"{name}.yml", site_playbook(tmp_path, f"opsctl_{name}".replace("-", "_"))
    try:
        checked = ansible_playbook(inventory, site, "--check", "--diff")
        assert "would change: base" in checked and f"would change: node-{node.name}" in checked, checked
        assert PASSWORD not in checked
        assert lab.ssh(host, f"test -e {root}").returncode == 1  # --check changed nothing
        overcommit = Path("/proc/sys/vm/overcommit_memory").read_text()
        deployed = ansible_playbook(inventory, site)
        assert recap_changed(deployed) > 0 and "Report each node's state" in deployed
        assert_host_settings(lab, host, name, deployed)
        assert Path("/proc/sys/vm/overcommit_memory").read_text() == overcommit  # this machine's, untouched
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=5)
        assert client.ping()
        client.close()
        again = ansible_playbook(inventory, site, "--check", "--diff")
        assert recap_changed(again) == 0 and "would change:" not in again, again
    finally:
        assert main(["destroy", "-f", str(spec), "--auto-approve", "--purge"]) == 0
    assert lab.ssh(host, f"test -e {root}").returncode == 1
    assert lab.ssh(host, f"ls /etc/sysctl.d/60-opsctl-{name}.conf /etc/logrotate.d/opsctl-{name}").returncode != 0


def assert_host_settings(lab: netns.Lab, host: netns.TestHost, name: str, output: str) -> None:
    """The files under /etc are written; somaxconn (the host's network namespace's own) is raised to the spec's
    tcp-backlog; what the lab keeps read-only (vm.*, transparent huge pages: this machine's) is reported, not
    fatal."""
    files = lab.ssh(host, f"cat /etc/sysctl.d/60-opsctl-{name}.conf /etc/tmpfiles.d/opsctl-{name}-thp.conf "
                          f"/etc/logrotate.d/opsctl-{name}; cat /proc/sys/net/core/somaxconn")
    assert files.returncode == 0, files.stderr
    assert "vm.overcommit_memory = 1" in files.stdout and "copytruncate" in files.stdout
    assert files.stdout.splitlines()[-1] == "8192"
    assert "Report host settings the host refuses" in output and "not tuned: vm.overcommit_memory" in output
