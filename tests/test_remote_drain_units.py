"""The pure side of draining a host with provider: ansible (issue 22): the hosts table every host keeps
(hosts.json, how opsctl finds a host the spec no longer has), a retired node's archive (its record, no settings),
and an inventory that reaches a removed host. No host needed."""

from __future__ import annotations

from pathlib import Path

from opsctl.providers.remote.bundle import archive, hosts_table, node_members, parse_hosts_table
from opsctl.providers.remote.inventory import build_inventory, settings_path
from opsctl.spec.model import Host
from opsctl.state.specfile import read_spec
from tests.support import make_spec, write_spec


def test_the_hosts_table_names_each_hosts_ssh_settings_and_reads_back(tmp_path: Path) -> None:
    data = make_spec("cluster", "valkey")
    data["provider"] = "ansible"
    data["hosts"][1].update(ssh_user="ops", ssh_port=2222, ssh_key="/keys/id", admin_via_ssh=True)
    spec = read_spec(write_spec(tmp_path, data)).spec
    text = hosts_table(spec.hosts).decode()
    assert "password" not in text.lower()
    back = parse_hosts_table(text)
    assert [(h.name, h.address, h.ssh_user, h.ssh_port, h.ssh_key, h.admin_via_ssh) for h in back] == \
        [(h.name, h.address, h.ssh_user, h.ssh_port, h.ssh_key, h.admin_via_ssh) for h in spec.hosts]
    assert hosts_table(spec.hosts) == hosts_table(spec.hosts)  # byte-stable: a second deploy changes nothing


def test_an_unreadable_hosts_table_finds_no_host() -> None:
    for text in (None, "", "{", "{}", '[{"name": "h9"}]', '[{"name": 1, "address": 2}]x'):
        assert parse_hosts_table(text) == []


def test_a_retired_node_ships_its_record_but_no_settings(tmp_path: Path) -> None:
    loaded = read_spec(write_spec(tmp_path, {**make_spec("cluster", "valkey"), "provider": "ansible"}))
    node = loaded.layout.servers[0]
    files = {"opsctl-node.json": '{"retired": true}\n'}
    live = [m.path for m in node_members(loaded.spec, node, files)]
    retired = [m.path for m in node_members(loaded.spec, node, files, retired=True)]
    assert settings_path(loaded.spec, node) in live and settings_path(loaded.spec, node) not in retired
    assert retired == [p for p in live if p != settings_path(loaded.spec, node)]
    assert archive(node_members(loaded.spec, node, files, retired=True))


def test_the_inventory_reaches_a_removed_host(tmp_path: Path) -> None:
    data = {**make_spec("cluster", "valkey"), "provider": "ansible"}
    loaded = read_spec(write_spec(tmp_path, data))
    gone = Host(name="h9", address="198.18.9.9", ssh_user="ops")
    inventory = build_inventory(loaded, "/files", "/known", removed=[gone])
    assert "h9" not in inventory["all"]["hosts"]  # no node of the layout lies there
    assert set(inventory["all"]["hosts"]) == {h.name for h in loaded.spec.hosts}
