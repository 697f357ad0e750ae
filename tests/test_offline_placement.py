"""The offline commands that write a deploy's files (render, inventory) place the spec from the nodes' records, as
`metrics targets` does (issue 33, item 1's class): after a change of shape they name the nodes that run, where
they run, never a retired name. Where no record can be read (nothing deployed yet, hosts out of reach) they fall
back to the layout of a first deploy and say so on stderr, exit 0: CI jobs render specs whose hosts they cannot
reach. No server: the records are written as apply leaves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.base.errors import EXIT_OK
from opsctl.spec.layout import Layout, endpoint
from opsctl.state.specfile import read_spec
from tests.lifecycle import applied, run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec
from tests.test_cli_stdin import feed
from tests.test_planner import load_dict
from tests.test_recorded_placement import _endpoints, _write_records


def _grown(provider: str, tmp_path: Path) -> tuple[dict[str, Any], Path, Layout]:
    """A 4-host 3 x 1 cluster deployed with t-1 since drained (a tombstone: its shard's member is t-7), then a
    replica more per master: the records' state dir, and the layout they place (what apply would leave)."""
    from opsctl.runtime.opening import recorded_placement

    first = make_spec("cluster", hosts=4, provider=provider, metrics={"exporter": True})
    deployed = list(load_dict(first).layout.nodes)
    state = tmp_path / "state"
    _write_records(state, deployed, retired=frozenset({deployed[0].name}))
    grown = {**first, "cluster": {**first["cluster"], "replicas_per_master": 2}}
    placed = recorded_placement(load_dict(grown), state)[0].layout
    return grown, state, placed


def _where(layout: Layout) -> dict[str, str]:
    return {n.name: endpoint(n.address, n.port) for n in layout.nodes}


def _rendered(folder: Path) -> dict[str, str]:
    """node folder -> the address:port its redis.conf binds."""
    found = {}
    for conf in sorted(folder.glob("*/redis.conf")):
        text = conf.read_text().splitlines()
        lines = dict(line.split(" ", 1) for line in text if line.startswith(("bind ", "port ")))
        found[conf.parent.name] = endpoint(lines["bind"].split()[0], int(lines["port"]))
    return found


def test_render_writes_the_nodes_the_records_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Render's node folders are the placed layout (names, hosts, ports), not the grown spec's positional one (which
    has the retired t-1); once the new nodes are deployed they are exactly what `metrics targets` lists."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    grown, state, placed = _grown("local", tmp_path)
    spec = write_spec(tmp_path, grown)
    retired = f"{grown['name']}-1"
    code, out, err = run(capsys, "render", "-f", str(spec), "--state-dir", str(state), "--dir", str(tmp_path / "r"))
    assert code == EXIT_OK and not err, err
    assert _rendered(tmp_path / "r") == _where(placed) and retired not in _where(placed)
    assert _where(placed) != _where(read_spec(spec).layout)  # the positional layout renders t-1, elsewhere
    _write_records(state, list(placed.nodes))  # the next apply deployed them
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--state-dir", str(state))
    assert code == EXIT_OK, err
    targets = _endpoints(out)
    assert {name: target.rsplit(":", 1)[0] for name, target in targets.items()} == {
        name: where.rsplit(":", 1)[0] for name, where in _rendered(tmp_path / "r").items()}
    feed(monkeypatch, yaml.safe_dump(grown))  # from standard input with --state-dir: the same records
    code, out, err = run(capsys, "render", "-f", "-", "--state-dir", str(state), "--dir", str(tmp_path / "s"))
    assert code == EXIT_OK and _rendered(tmp_path / "s") == _where(placed), err


def test_render_with_nothing_deployed_is_the_first_deploy_and_says_so(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """No state dir yet (a first deploy): the positional layout, a one-line note, nothing made; --offline reads
    nothing and needs no --state-dir for a spec on standard input."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    data = make_spec("cluster")
    spec = write_spec(tmp_path, data)
    code, _out, err = run(capsys, "render", "-f", str(spec), "--dir", str(tmp_path / "r"))
    assert code == EXIT_OK and _rendered(tmp_path / "r") == _where(read_spec(spec).layout), err
    assert err.count("\n") == 1 and "is deployed in" in err and "where the first apply puts them" in err, err
    assert not (tmp_path / ".opsctl").exists()
    feed(monkeypatch, yaml.safe_dump(data))
    code, _out, err = run(capsys, "render", "-f", "-", "--dir", str(tmp_path / "s"))
    assert code == 1 and "-f - needs --state-dir" in err and "or --offline" in err, err
    feed(monkeypatch, yaml.safe_dump(data))
    code, _out, err = run(capsys, "render", "-f", "-", "--offline", "--dir", str(tmp_path / "s"))
    assert code == EXIT_OK and not err and _rendered(tmp_path / "s") == _where(read_spec(spec).layout), err


def _inventory_nodes(text: str) -> dict[str, str]:
    hosts = yaml.load(text.split("\n", 1)[1], Loader=yaml.BaseLoader)["all"]["hosts"]
    return {n["name"]: endpoint(n["address"], int(n["port"])) for h in hosts.values() for n in h["opsctl_nodes"]}


def test_inventory_lists_the_nodes_the_records_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The records as the hosts hold them (read here from a folder in place of SFTP): the inventory's hosts and ports
    are the placed layout, t-1 (retired) absent; --offline gives the positional layout."""
    from opsctl.providers.ansible import AnsibleProvider
    from opsctl.providers.localfiles import deployed_records_in

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    monkeypatch.setattr(AnsibleProvider, "deployed_records",
                        lambda self: deployed_records_in(self.loaded, tmp_path / "state"))
    grown, _state, placed = _grown("ansible", tmp_path)
    spec = write_spec(tmp_path, grown)
    target = tmp_path / "inv" / f"{grown['name']}.yml"
    code, _out, err = run(capsys, "inventory", "-f", str(spec), "--dir", str(tmp_path / "inv"))
    assert code == EXIT_OK and not err, err
    assert _inventory_nodes(target.read_text()) == _where(placed) and f"{grown['name']}-1" not in _where(placed)
    code, _out, err = run(capsys, "inventory", "-f", str(spec), "--dir", str(tmp_path / "inv"), "--offline")
    assert code == EXIT_OK and not err, err
    assert _inventory_nodes(target.read_text()) == _where(read_spec(spec).layout) != _where(placed)


@pytest.mark.parametrize("command", ["render", "inventory"])
def test_hosts_out_of_reach_fall_back_with_a_note(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """provider: ansible on hosts no sshd answers (tests/test_adversarial.py's shape): exit 0, the positional
    layout, one line on stderr that names why; --offline does not look at all."""
    from opsctl.providers.remote import ssh

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = write_spec(tmp_path, make_spec("cluster", provider="ansible"))
    positional = _where(read_spec(spec).layout)
    code, _out, err = run(capsys, command, "-f", str(spec), "--dir", str(tmp_path / "a"))
    assert code == EXIT_OK and err.count("\n") == 1 and "could not be read on its hosts" in err, err
    assert "cannot connect" in err and "--offline" in err and "Traceback" not in err, err
    assert _written(command, tmp_path / "a", spec) == positional

    def no_ssh(*args: object, **kwargs: object) -> None:
        raise AssertionError("--offline connected")

    monkeypatch.setattr(ssh, "connect", no_ssh)
    code, _out, err = run(capsys, command, "-f", str(spec), "--dir", str(tmp_path / "b"), "--offline")
    assert code == EXIT_OK and not err and _written(command, tmp_path / "b", spec) == positional, err


def _written(command: str, folder: Path, spec: Path) -> dict[str, str]:
    if command == "render":
        return _rendered(folder)
    name = yaml.safe_load(spec.read_text())["name"]
    return _inventory_nodes((folder / f"{name}.yml").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_render_after_a_drained_host_is_what_apply_leaves_running(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  flavor: str) -> None:
    """Live: a replication fleet on 3 hosts, h2 removed from the spec. Render (before the apply that drains it) names
    t-1 and t-3 where they run; the positional layout would render t-2 on h3. After that apply render's folders are
    the node folders left running, with their ports."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    data = make_spec("replication", flavor)
    with applied(tmp_path, capsys, data) as (spec, loaded):
        ran = _where(loaded.layout)
        spec.write_text(yaml.safe_dump({**data, "hosts": [data["hosts"][0], data["hosts"][2]]}))
        state = tmp_path / ".opsctl" / data["name"]
        code, _out, err = run(capsys, "render", "-f", str(spec), "--dir", str(tmp_path / "r"))
        assert code == EXIT_OK and not err, err
        kept = {name: ran[name] for name in (f"{data['name']}-1", f"{data['name']}-3")}
        assert _rendered(tmp_path / "r") == kept != _where(read_spec(spec).layout)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == EXIT_OK, err + out
        running = {p.parent.name for p in state.glob("*/server.pid")}
        assert running == set(kept), sorted(state.iterdir())


def test_render_places_the_moves_of_rebalance_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Review 3, finding 5: a 3 x 1 cluster on 3 hosts, a 4th added with cluster.rebalance_placement: the next apply
    moves one member to h4 (a new name replaces it); render writes that new node, where apply puts it, and not the
    one it replaces (before: the six deployed nodes, nothing on h4)."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    four = make_spec("cluster", hosts=4)
    first = {**four, "hosts": four["hosts"][:3]}
    state = tmp_path / "state"
    _write_records(state, list(load_dict(first).layout.nodes))
    grown = {**four, "cluster": {**four["cluster"], "rebalance_placement": True}}
    spec = write_spec(tmp_path, grown)
    code, _out, err = run(capsys, "render", "-f", str(spec), "--state-dir", str(state), "--dir", str(tmp_path / "r"))
    assert code == EXIT_OK and not err, err
    rendered = _rendered(tmp_path / "r")
    on_h4 = four["hosts"][3]["address"]
    assert f"{four['name']}-7" in rendered and rendered[f"{four['name']}-7"].startswith(on_h4), rendered
    assert len(rendered) == 6, rendered  # the moved member's old node is not rendered


@pytest.mark.parametrize(("field", "value", "said"), [
    ("port", 70000, "deployed.port: is not a port from 1 to 65535"), ("port", 0, "deployed.port"),
    ("shard", -7, "deployed.shard: is not a shard number"), ("shard", 0, "deployed.shard"),
    ("address", "evil host\nport 1", "deployed.address: is not an IP address or host name"),
    ("address", "user@h", "deployed.address"),
])
def test_a_record_out_of_range_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], field: str, value: object,
                                                  said: str) -> None:
    """Review 3, finding 6: before, port 70000 was rendered into redis.conf (exit 0) and shard -7 left metrics
    targets an empty list, exit 0. Every command that reads the records refuses it, naming the file and field."""
    import json

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    data = make_spec("cluster")
    state = tmp_path / "state"
    nodes = list(load_dict(data).layout.nodes)
    _write_records(state, nodes)
    path = state / nodes[0].name / "opsctl-node.json"
    record = json.loads(path.read_text())
    record["deployed"][field] = value
    path.write_text(json.dumps(record))
    spec = str(write_spec(tmp_path, data))
    for argv in (["render", "-f", spec, "--dir", str(tmp_path / "r")], ["metrics", "targets", "-f", spec]):
        code, out, err = run(capsys, *argv, "--state-dir", str(state))
        assert code == 1 and said in err and "opsctl-node.json" in err and not out, (argv, err, out)
    assert not (tmp_path / "r").exists()


def test_options_the_run_would_ignore_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Review 3, finding 13: `render --offline --state-dir X` and `inventory -o json --dir X` (which prints the
    inventory, writing nothing) exited 0 and ignored the option."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    local = str(write_spec(tmp_path, make_spec("cluster"), "local.yaml"))
    remote = str(write_spec(tmp_path, make_spec("cluster", provider="ansible"), "remote.yaml"))
    cases = [(["render", "-f", local, "--dir", str(tmp_path / "r"), "--offline", "--state-dir", str(tmp_path)],
              "--state-dir goes with"),
             (["inventory", "-f", remote, "-o", "json", "--offline", "--dir", str(tmp_path / "i")], "--dir goes with")]
    for argv, said in cases:
        code, out, err = run(capsys, *argv)
        assert code == 1 and said in err and not out, (argv, err, out)
    assert not (tmp_path / "r").exists() and not (tmp_path / "i").exists()
    code, out, err = run(capsys, "inventory", "-f", remote, "-o", "json", "--offline")
    assert code == 0 and '"all"' in out, err
    code, out, err = run(capsys, "render", "-f", local, "--dir", str(tmp_path / "r"), "--offline")
    assert code == 0 and (tmp_path / "r").is_dir(), err


@pytest.mark.parametrize("command", ["render", "inventory"])
def test_a_record_that_cannot_be_read_on_a_reached_host_is_an_error_not_a_fallback(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 3, finding 18: any error reading the records over SSH (a corrupt record on a host that answered, a
    refused login) became the note and the first-deploy layout, exit 0. Only a host out of reach falls back."""
    from opsctl.providers.ansible import AnsibleProvider
    from opsctl.state.safefs import FileProblem

    def corrupt(self: AnsibleProvider) -> dict[str, dict[str, Any]]:
        raise FileProblem("h1:/srv/opsctl/t-1/opsctl-node.json", "deployed.port: is not a port from 1 to 65535",
                          "delete the file")

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    monkeypatch.setattr(AnsibleProvider, "deployed_records", corrupt)
    spec = write_spec(tmp_path, make_spec("cluster", provider="ansible"))
    code, out, err = run(capsys, command, "-f", str(spec), "--dir", str(tmp_path / "a"))
    assert code == 1 and "deployed.port" in err and "note:" not in err, err + out
    assert not (tmp_path / "a").exists()


def test_a_link_is_never_written_through_and_render_checks_every_folder_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 3, findings 12 and 20: `render --dir LINK` wrote through the link (inventory --dir, metrics rules --dir
    and plan --out refused one), `init --out LINK/x.yaml` too; render wrote the first nodes' files before it refused
    a later node's folder that is a link. One rule: a path written is never a link (the command line's or not)."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    data = make_spec("cluster")
    spec = str(write_spec(tmp_path, data))
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    cases = [["render", "-f", spec, "--dir", str(tmp_path / "link")], ["init", "--out", str(tmp_path / "link/x.yaml")]]
    for argv in cases:
        code, _out, err = run(capsys, *argv)
        assert code == 1 and "symbolic link" in err and "never writes through" in err, (argv, err)
    assert list(real.iterdir()) == []
    out_dir = tmp_path / "r"
    out_dir.mkdir()
    (out_dir / f"{data['name']}-6").symlink_to(real)  # the last node's folder
    code, _out, err = run(capsys, "render", "-f", spec, "--dir", str(out_dir))
    assert code == 1 and f"{data['name']}-6" in err and "symbolic link" in err, err
    assert [p.name for p in out_dir.iterdir()] == [f"{data['name']}-6"] and list(real.iterdir()) == []


def test_a_node_on_a_lost_host_is_built_one_way_with_its_bus_port() -> None:
    """Review 3, finding 16: recorded_nodes (what destroy removes) built the drained node without its bus port,
    placement's _drain with it; one function builds both."""
    from opsctl.spec.deployed import Deployed
    from opsctl.spec.placement import drained_node, recorded_nodes

    loaded = load_dict(make_spec("cluster"))
    gone = Deployed("t-9", "gone", 7009, "replica", 2, address="127.9.9.9")
    (node,) = recorded_nodes(loaded.spec, loaded.layout, [gone])
    assert node == drained_node(loaded.spec, gone) and node.bus_port == 7009 + 10000 and node.address == "127.9.9.9"
