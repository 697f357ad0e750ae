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


def test_the_hosts_table_carries_tombstones_so_a_fresh_runner_never_gives_a_retired_name(tmp_path: Path) -> None:
    """A drained host that held only tombstones leaves the table; the tombstones it held travel in the table on
    every host the deploy touched, and placement on a fresh runner keeps their names taken."""
    from opsctl.providers.remote.bundle import parse_tombstones
    from opsctl.spec.deployed import deployed_from_records
    from opsctl.spec.layout import cluster_layout
    from opsctl.spec.placement import placed_layout
    from tests.test_placement import records_of, spec_with
    from tests.test_planner import load_dict

    spec = load_dict(spec_with()).spec
    deployed = records_of(cluster_layout(spec))
    taken = {d.name for d in deployed}
    grown = load_dict(spec_with(replicas_per_master=2)).spec
    first_new = sorted({n.name for n in placed_layout(grown, deployed).servers} - taken)[0]
    gone = {first_new: {"host": "h9", "port": 7999, "role": "replica", "shard": 1, "address": "127.0.0.9"}}
    text = hosts_table(spec.hosts, gone).decode()
    assert [h.name for h in parse_hosts_table(text)] == [h.name for h in spec.hosts]
    assert hosts_table(spec.hosts, gone) == hosts_table(spec.hosts, gone)  # byte-stable
    carried = deployed_from_records(parse_tombstones(text))
    assert [(d.name, d.host, d.retired) for d in carried] == [(first_new, "h9", True)]
    placed = placed_layout(grown, [*deployed, *carried])
    assert first_new not in {n.name for n in placed.servers}
    assert len(placed.servers) == 9  # 3 masters x (1 + 2 replicas), the new names beyond the tombstone's


def test_a_table_without_tombstones_stays_the_plain_list_and_bad_ones_carry_none(tmp_path: Path) -> None:
    from opsctl.providers.remote.bundle import parse_tombstones

    data = make_spec("cluster", "valkey")
    spec = read_spec(write_spec(tmp_path, {**data, "provider": "ansible"})).spec
    assert hosts_table(spec.hosts, {}) == hosts_table(spec.hosts)
    assert hosts_table(spec.hosts).decode().lstrip().startswith("[")
    for text in (None, "", "[]", "{", '{"retired": []}', '{"retired": {"x": 1}}'):
        assert parse_tombstones(text) == {}
