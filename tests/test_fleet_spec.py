"""A folder of specs as a fleet (opsctl.state.fleetfile.read_fleet, opsctl.spec.fleet): bases skipped, --only's
order, an unknown name refused, and the fleet-level checks (a name twice, a shared host:port of any kind, a host
with two addresses), each naming both topologies and both files."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.base.errors import OpsctlError, SpecError
from opsctl.spec.fleet import refuse
from opsctl.state.fleetfile import read_fleet
from tests.support import PASSWORD_ENV

BASE = f"""\
server: {{flavor: valkey, version: "9.1"}}
hosts:
  - {{name: h1, address: 127.0.0.1}}
  - {{name: h2, address: 127.0.0.2}}
  - {{name: h3, address: 127.0.0.3}}
auth:
  mode: password
  password: {{env: {PASSWORD_ENV}}}
hardening:
  renamed_commands: {{CONFIG: OPS_CONFIG_T3ST}}
memory: {{maxmemory: 64mb, policy: allkeys-lru}}
"""


def standalone(name: str, port: int, host: str = "h1", extra: str = "") -> str:
    return (f"extends: base.yaml\nname: {name}\ntopology: standalone\n"
            f"standalone: {{host: {host}, port: {port}}}\n{extra}")


def cluster(name: str, base_port: int) -> str:
    return (f"extends: base.yaml\nname: {name}\ntopology: cluster\n"
            f"cluster: {{masters: 3, replicas_per_master: 0, base_port: {base_port}}}\n")


def sentinel(name: str, base_port: int, sentinel_port: int) -> str:
    return (f"extends: base.yaml\nname: {name}\ntopology: sentinel\n"
            f"replication: {{master: h1, replicas: [h2], base_port: {base_port}}}\n"
            f"sentinel: {{hosts: [h1, h2, h3], port: {sentinel_port}}}\n")


def folder(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "base.yaml").write_text(BASE)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def findings(path: Path) -> list[str]:
    fleet = read_fleet(str(path), None)
    with pytest.raises(SpecError) as caught:
        refuse(fleet)
    return [p.render() for p in caught.value.problems]


def test_bases_are_skipped_and_topologies_come_in_name_order(tmp_path: Path) -> None:
    path = folder(tmp_path, {"zeta.yaml": standalone("zeta", 17001), "alpha.yml": standalone("alpha", 17002),
                             "notes.txt": "not a spec", "ci.yaml": "stages: [plan]\n"})
    fleet = read_fleet(str(path), None)
    assert [s.spec.name for s in fleet.specs] == ["alpha", "zeta"]
    assert {Path(f).name for f in fleet.files} == {"alpha.yml", "base.yaml", "ci.yaml", "zeta.yaml"}
    assert fleet.findings == ()
    refuse(fleet)  # nothing to refuse


def test_only_selects_in_its_order(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": standalone("a", 17001), "b.yaml": standalone("b", 17002),
                             "c.yaml": standalone("c", 17003)})
    assert [s.spec.name for s in read_fleet(str(path), ["c", "a"]).specs] == ["c", "a"]


def test_an_unknown_only_name_is_refused(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": standalone("a", 17001)})
    with pytest.raises(OpsctlError) as caught:
        read_fleet(str(path), ["a", "nope"])
    assert "no topology named nope" in caught.value.summary and "a" in caught.value.hint


def test_a_bad_topology_is_a_located_spec_error(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": standalone("a", 17001, extra="memory: {policy: nope}\n")})
    with pytest.raises(SpecError) as caught:
        read_fleet(str(path), None)
    assert caught.value.problems[0].render().startswith(f"{path / 'a.yaml'}:5: memory.policy")


def test_a_folder_without_topologies_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OpsctlError, match="no topology here"):
        read_fleet(str(folder(tmp_path, {})), None)


def test_a_name_used_twice_names_both_files(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": standalone("orders", 17001), "b.yaml": standalone("orders", 17002)})
    (problem,) = findings(path)
    assert problem.startswith(f"{path / 'b.yaml'}:2: name: topology orders is named in {path / 'a.yaml'}:2 too")


def test_two_servers_on_one_host_port(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": standalone("a", 17001), "b.yaml": standalone("b", 17001)})
    (problem,) = findings(path)
    assert problem.startswith(f"{path / 'b.yaml'}:4: standalone.port: topologies b and a both use 127.0.0.1:17001: "
                              f"b-1 and a-1 ({path / 'a.yaml'}:4)")


def test_a_server_on_another_topology_s_cluster_bus_port(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": cluster("a", 17001), "b.yaml": standalone("b", 27001)})
    (problem,) = findings(path)
    assert "both use 127.0.0.1:27001: b-1 and a-1's cluster bus port" in problem
    assert str(path / "a.yaml") in problem and problem.startswith(str(path / "b.yaml"))


def test_a_server_on_another_topology_s_sentinel_port(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": sentinel("a", 17001, 17100), "b.yaml": standalone("b", 17100, host="h2")})
    (problem,) = findings(path)
    assert "sentinel" in problem and "127.0.0.2:17100" in problem and str(path / "a.yaml") in problem


def test_a_server_on_another_topology_s_exporter_port(tmp_path: Path) -> None:
    path = folder(tmp_path, {"a.yaml": standalone("a", 17001, extra="metrics: {exporter: true}\n"),
                             "b.yaml": standalone("b", 18001)})
    (problem,) = findings(path)
    assert problem.startswith(f"{path / 'b.yaml'}:4: standalone.port: topologies b and a both use 127.0.0.1:18001: "
                              f"b-1 and a-1's exporter ({path / 'a.yaml'}:5)")


def test_a_host_named_with_two_addresses(tmp_path: Path) -> None:
    other = "hosts:\n  - {name: h1, address: 127.0.0.9}\n"
    path = folder(tmp_path, {"a.yaml": standalone("a", 17001), "b.yaml": standalone("b", 17002, extra=other)})
    (problem,) = findings(path)
    assert problem.startswith(f"{path / 'b.yaml'}:6: hosts[0].address: host h1 is 127.0.0.9 in b and 127.0.0.1 "
                              f"in a ({path / 'base.yaml'}:3)")
