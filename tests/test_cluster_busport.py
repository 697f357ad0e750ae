"""The cluster bus port is a spec field (issue 33, item 4): cluster.bus_port_offset (default 10000, the servers' own).
A cluster on another offset forms, and every port a node binds (its port, its bus port, its exporter's) is range- and
clash-checked against every other on its address, named on both sides with file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.poll import Pending, wait_for
from opsctl.cluster.ops import meet_command
from opsctl.migrate.foreign import parse_endpoints
from opsctl.net.connector import Connector
from opsctl.observe.replies import ClusterNodeLine, parse_cluster_nodes
from opsctl.plan.facts import NodeFacts
from opsctl.plan.refusals import refuse_bus_port_clash
from opsctl.render import default_paths, render_node
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import applied, plan_json, run
from tests.support import (
    CONDITION_BOUND,
    PASSWORD,
    PASSWORD_ENV,
    admin_for,
    cluster_check,
    free_base_port,
    make_spec,
    write_spec,
)
from tests.test_metrics_targets import fixed_spec
from tests.test_planner import load_dict

OFFSET, MOVED = 20, 30  # the bus right above the spec's own ports: base + 20 .. base + 25, then base + 30 ..


@pytest.fixture(autouse=True)
def password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _bus_ports_seen(loaded: LoadedSpec, offset: int) -> bool | Pending:
    """True once every node's CLUSTER NODES gives every node the bus port port + offset."""
    want = {(n.address, n.port): n.port + offset for n in loaded.layout.servers}
    connector = Connector(loaded)
    for node in loaded.layout.servers:
        with admin_for(connector, node) as admin:
            seen = {(line.address, line.port): line.bus_port
                    for line in parse_cluster_nodes(str(admin.raw("CLUSTER", "NODES")))}
        if seen != want:
            return Pending(f"{node.name} sees bus ports {sorted(seen.values())}, want {sorted(want.values())}")
    return True


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_cluster_on_another_bus_offset_forms_moves_to_a_third_and_grows(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          flavor: str) -> None:
    """Formed on offset 20 (MEET names the bus port), refused an offset that restarts a node onto another's live bus
    port (review 1, finding 2), moved to 30 by apply (a rolling restart), then a fourth shard
    joins (its nodes MEET a member at its bus port): after each, every node's CLUSTER NODES shows every bus port,
    redis-cli --cluster check passes, and a plan is empty."""
    spec = make_spec("cluster", flavor)
    addresses = [h["address"] for h in spec["hosts"]]
    spec["cluster"] |= {"base_port": free_base_port(addresses, 8 + MOVED, bus=False), "bus_port_offset": OFFSET}
    with applied(tmp_path, capsys, spec) as (spec_path, loaded):
        for change in ({}, {"bus_port_offset": MOVED}, {"masters": 4}):
            if change.get("bus_port_offset") == MOVED:
                _clashing_offset_refused(tmp_path, capsys, spec, loaded)
            if change:
                spec["cluster"] |= change
                write_spec(tmp_path, spec)
                code, out, err = run(capsys, "apply", "-f", str(spec_path), "--auto-approve")
                assert code == 0, err + out
                loaded = read_spec(spec_path)
            offset = spec["cluster"]["bus_port_offset"]
            wait_for(lambda lo=loaded, o=offset: _bus_ports_seen(lo, o), CONDITION_BOUND,
                     f"every node to see bus ports +{offset}")
            check = cluster_check(loaded.layout.servers[0].endpoint)
            assert check.returncode == 0 and "All 16384 slots covered" in check.stdout, check.stdout + check.stderr
            assert plan_json(capsys, spec_path)["steps"] == []  # the live cluster-port is the rendered one


def _clashing_offset_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any],
                             loaded: LoadedSpec) -> None:
    """The offset moved by the port gap of two nodes on one address: apply refuses (exit 3) before it restarts
    anything (before, the restart failed on 'Address already in use', and so did every re-run), naming both."""
    first, second = next((a, b) for a in loaded.layout.servers for b in loaded.layout.servers
                         if a.address == b.address and b.port > a.port)
    clashing = {**spec, "cluster": {**spec["cluster"], "bus_port_offset": OFFSET + second.port - first.port}}
    code, out, err = run(capsys, "apply", "-f", str(write_spec(tmp_path, clashing)), "--auto-approve")
    assert code == 3 and f"restart {first.name} onto a bus port {second.name} holds" in err, err + out
    assert _bus_ports_seen(loaded, OFFSET) is True  # nothing restarted


def test_the_bus_port_is_rendered_only_off_the_default() -> None:
    spec = fixed_spec("cluster")
    default = load_dict(spec)
    moved = load_dict({**spec, "cluster": {**spec["cluster"], "bus_port_offset": 5000}})
    node = moved.layout.servers[0]
    conf = render_node(moved, node, default_paths("/var/lib/opsctl/orders", node)).files["redis.conf"]
    assert f"\ncluster-port {node.port + 5000}\n" in conf
    node = default.layout.servers[0]
    conf = render_node(default, node, default_paths("/var/lib/opsctl/orders", node)).files["redis.conf"]
    assert "cluster-port" not in conf


def test_meet_names_the_bus_port_only_off_the_default() -> None:
    spec = fixed_spec("cluster")
    node = load_dict({**spec, "cluster": {**spec["cluster"], "bus_port_offset": 5000}}).layout.servers[1]
    assert meet_command(node) == ("CLUSTER", "MEET", "127.0.0.2", 7102, 12102)
    assert meet_command(load_dict(spec).layout.servers[1]) == ("CLUSTER", "MEET", "127.0.0.2", 7102)


def _validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, object]) -> tuple[int, str]:
    code, out, err = run(capsys, "validate", "-f", str(write_spec(tmp_path, spec)), "--no-secrets")
    assert out == "" or code == 0, out
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def test_an_exporter_on_another_nodes_bus_port_is_named_with_both(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """orders-1 (7101) and orders-6 (7106) share 127.0.0.1: 7106 + 995 is orders-1's exporter port 7101 + 1000."""
    spec = fixed_spec("cluster")
    spec["cluster"]["bus_port_offset"] = 995
    spec["metrics"] = {"exporter": True}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1, err
    assert "exporter port 8101 on 127.0.0.1 is orders-6's cluster bus port" in err and "orders-1" in err, err
    assert "topology.yaml:" in err and "metrics.port_offset" in err, err


def test_replication_and_sentinels_have_no_bus_an_exporter_could_clash_with(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: every node's port + 10000 counted as a cluster bus port, so an exporter there was refused."""
    spec = fixed_spec("sentinel")
    spec["metrics"] = {"exporter": True, "port_offset": 10000}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 0, err


def test_a_bastion_port_outside_the_range_is_a_located_error(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_spec("standalone", provider="ansible")
    spec["hosts"][0] |= {"address": "10.0.0.1", "bastion": "ops@jump.example.com:99999"}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1 and "hosts[0].bastion: bastion port 99999 is outside 1..65535" in err, err
    spec["hosts"][0]["bastion"] = "ops@jump.example.com:2222"
    assert _validate(tmp_path, capsys, spec)[0] == 0


@pytest.mark.parametrize("text", ["10.0.0.1:0", "10.0.0.1:70000", "[::1]:99999"])
def test_a_migrate_endpoint_port_outside_the_range_is_an_error(text: str) -> None:
    with pytest.raises(OpsctlError, match=r"a number from 1 to 65535"):
        parse_endpoints(text)


def test_a_plaintext_port_on_a_bus_port_names_what_takes_it(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = fixed_spec("cluster")
    spec["cluster"]["bus_port_offset"] = 1000
    spec["tls"] = {"enabled": True, "generate": True, "plaintext_port": True}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1, err
    assert "orders-1's plaintext port 8101 (port + 1000) is taken by orders-1's cluster bus port" in err, err


def test_the_ephemeral_range_warning_counts_bus_and_exporter_ports_at_their_offsets() -> None:
    from opsctl.apply.planning import ephemeral_port_warning

    spec = fixed_spec("cluster")
    loaded = load_dict({**spec, "cluster": {**spec["cluster"], "bus_port_offset": 30000},
                        "metrics": {"exporter": True, "port_offset": 40000}})
    warning = ephemeral_port_warning(loaded, 37101, 47101) or ""
    assert warning.startswith("orders-1 (37101, 47101), ") and "6 more" not in warning, warning
    assert "port + 30000 (cluster.bus_port_offset)" in warning and "port + 40000 (metrics.port_offset)" in warning


def _running_on_offset(loaded: LoadedSpec, offset: int) -> dict[str, NodeFacts]:
    """Every server running, its own CLUSTER NODES line with the bus port port + offset (what it binds now)."""
    def me(n: Node) -> ClusterNodeLine:
        return ClusterNodeLine(n.name, n.address, n.port, n.port + offset, frozenset({"myself", "master"}), None, 1,
                               "connected", ())
    return {n.name: NodeFacts(n.name, True, reachable=True, cluster_nodes=(me(n),)) for n in loaded.layout.servers}


def test_an_offset_change_onto_another_nodes_live_bus_port_is_refused_up_front() -> None:
    """Review 1, finding 2: orders-1 (7101) and orders-6 (7106) share 127.0.0.1; offset 20 -> 25 would restart
    orders-1 onto 7126, orders-6's bus port until its own restart later in the rolling order: the restart failed
    with 'Address already in use', and every re-run stopped at the same node. Refused before anything is touched,
    naming both and an offset that avoids it; 20 -> 30 (no clash) is planned as before."""
    spec = fixed_spec("cluster")
    moved = load_dict({**spec, "cluster": {**spec["cluster"], "bus_port_offset": 25}})
    facts = _running_on_offset(moved, 20)
    with pytest.raises(RefusedError) as refused:
        refuse_bus_port_clash(moved.layout, facts)
    error = refused.value
    assert error.exit_code == 3 and "would restart orders-1 onto a bus port orders-6 holds" in error.summary
    assert "orders-1's new bus port 7126 on 127.0.0.1 is orders-6's bus port now" in error.detail
    assert "e.g. 26" in error.hint, error.hint
    refuse_bus_port_clash(load_dict({**spec, "cluster": {**spec["cluster"], "bus_port_offset": 30}}).layout, facts)
    refuse_bus_port_clash(load_dict({**spec, "cluster": {**spec["cluster"], "bus_port_offset": 26}}).layout, facts)
    refuse_bus_port_clash(moved.layout, _running_on_offset(moved, 25))  # already moved: each holds its own


def test_a_port_clash_on_a_bind_address_of_another_host_is_named(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Review 1, finding 5: a node binds every port on every bind address. h1 binds 127.0.0.2 too (h2's address, one
    machine): orders-1's bus port 7101 + 2 = 7103 there is orders-3's port. Before: validate exited 0 (only each
    node's own address was looked at), and the start failed on 'Address already in use'."""
    spec = fixed_spec("cluster")
    spec["hosts"][0]["bind"] = ["127.0.0.1", "127.0.0.2"]
    spec["cluster"]["bus_port_offset"] = 2
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1, err
    assert "orders-3 and orders-1's cluster bus port both use 127.0.0.2:7103" in err or \
        "orders-1's cluster bus port and orders-3 both use 127.0.0.2:7103" in err, err
    spec["metrics"] = {"exporter": True, "port_offset": 4}  # orders-2's exporter: 127.0.0.2:7106, orders-6's port
    del spec["cluster"]["bus_port_offset"]
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1 and "orders-2: exporter port 7106 on 127.0.0.2 is orders-6's port" in err, err


@pytest.mark.parametrize("directive", ["cluster-announce-client-ipv4", "cluster-announce-client-ipv6"])
def test_a_client_announce_address_is_managed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              directive: str) -> None:
    """Review 1, finding 4: Valkey's client announce addresses rewrite the address CLUSTER NODES shows a client
    (opsctl, which knows each node by it): refused under config: like cluster-announce-ip. Before: validate passed."""
    spec = fixed_spec("cluster")
    spec["config"] = {directive: "10.9.9.9" if directive.endswith("ipv4") else "fd00::9"}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1 and f"{directive} is managed by opsctl" in err and "hosts[].address" in err, err


def test_a_hostname_announce_is_left_free(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cluster-announce-hostname and cluster-preferred-endpoint-type leave CLUSTER NODES' address as it is."""
    spec = fixed_spec("cluster")
    spec["config"] = {"cluster-announce-hostname": "orders.example.com", "cluster-preferred-endpoint-type": "ip"}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 0, err


def test_a_plaintext_port_on_another_hosts_port_at_a_bind_address_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same class as finding 5 in the plaintext port's check: h1 binds 127.0.0.2 too, where orders-2 listens on
    8101, orders-1's plaintext port (7101 + 1000). Before: validate passed."""
    spec = fixed_spec("cluster")
    spec["hosts"][0]["bind"] = ["127.0.0.1", "127.0.0.2"]
    spec["nodes"] = {"orders-2": {"port": 8101}}
    spec["tls"] = {"enabled": True, "generate": True, "plaintext_port": True}
    code, err = _validate(tmp_path, capsys, spec)
    assert code == 1 and "orders-1's plaintext port 8101 (port + 1000) is taken by orders-2" in err, err
