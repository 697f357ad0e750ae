"""Commands that read what is deployed read it from the nodes' records, not from the spec (issue 33, item 1): after
a change of shape a node keeps its name, host and port, so the positional layout of the changed spec (where a fresh
deploy would put the nodes) is not where they run. No server: the records are written as apply leaves them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from opsctl.base.errors import EXIT_OK
from opsctl.spec.layout import Layout, Node, deployed_record, endpoint
from opsctl.state.specfile import read_spec
from tests.lifecycle import run
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec
from tests.test_cli_stdin import feed
from tests.test_planner import load_dict


def _write_records(state: Path, nodes: list[Node], retired: frozenset[str] = frozenset()) -> None:
    """The records apply leaves in the state dir's node folders (what placement reads), tombstones for retired."""
    for node in nodes:
        folder = state / node.name
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = {"deployed": deployed_record(node), **({"retired": True} if node.name in retired else {})}
        (folder / "opsctl-node.json").write_text(json.dumps(record))


def _endpoints(out: str) -> dict[str, str]:
    return {g["labels"]["node"]: g["targets"][0] for g in json.loads(out)}


def test_targets_are_the_nodes_deployed_where_their_records_place_them(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A 3 x 1 cluster grown by a host and replicas_per_master 1 -> 2 (issue 33, item 1): the targets are the nodes
    the records place, at their recorded hosts and ports (the positional layout of the grown spec would put t-2 ...
    t-6 elsewhere), a node not deployed yet is left out until it is, a tombstone is never one; the spec read from
    standard input with --state-dir reads the same records."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    monkeypatch.chdir(tmp_path)
    first = make_spec("cluster", metrics={"exporter": True})
    fourth = first["hosts"][0]["address"].rsplit(".", 1)[0] + ".4"
    grown = {**first, "hosts": [*first["hosts"], {"name": "h4", "address": fourth}],
             "cluster": {**first["cluster"], "replicas_per_master": 2}}
    spec = write_spec(tmp_path, grown)
    state = tmp_path / "state"
    deployed = list(load_dict(first).layout.nodes)
    _write_records(state, deployed)

    def targets() -> dict[str, str]:
        feed(monkeypatch, yaml.safe_dump(grown))
        code, out, err = run(capsys, "metrics", "targets", "-f", "-", "--state-dir", str(state))
        assert code == EXIT_OK, err
        return _endpoints(out)

    recorded = {n.name: endpoint(n.address, n.port + 1000) for n in deployed}
    assert targets() == recorded  # the three new replicas run nowhere yet
    placed = read_spec(spec).layout  # not placed: the positional layout of the grown spec
    assert {n.name: endpoint(n.address, n.port + 1000) for n in placed.nodes} != recorded
    new = [n for n in _placed(grown, state).nodes if n.name not in recorded]
    assert sorted(n.name for n in new) == [f"{first['name']}-{k}" for k in (7, 8, 9)]
    _write_records(state, new)
    assert targets() == recorded | {n.name: endpoint(n.address, n.port + 1000) for n in new}
    _write_records(state, new[:1], retired=frozenset({new[0].name}))  # a tombstone: retired, never a target
    assert new[0].name not in targets()


def _placed(spec: dict, state: Path) -> Layout:
    from opsctl.runtime.opening import recorded_placement

    return recorded_placement(load_dict(spec), state)[0].layout


def test_targets_need_state_dir_with_a_spec_from_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    feed(monkeypatch, yaml.safe_dump(make_spec("cluster")))
    code, out, err = run(capsys, "metrics", "targets", "-f", "-")
    assert code == 1 and not out and "-f - needs --state-dir" in err and "Traceback" not in err, err


def test_tls_rotate_names_the_nodes_deployed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The nodes a rotation asks about (and a dry run lists) are the deployed ones, by their records: with t-1
    retired (a tombstone) t-2 ... t-6; not t-7, its shard's new member, which the next apply adds (with its
    certificate: review 3, finding 3), nor t-1, which the spec alone would name."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    first = make_spec("cluster", hosts=4, tls={"enabled": True, "generate": True})
    deployed = list(load_dict(first).layout.nodes)
    state = tmp_path / "state"
    _write_records(state, deployed, retired=frozenset({deployed[0].name}))  # t-1 drained: a tombstone
    spec = write_spec(tmp_path, first)
    code, out, err = run(capsys, "tls", "rotate", "-f", str(spec), "--state-dir", str(state), "--dry-run",
                         "--output", "json")
    assert code == EXIT_OK, err
    names = json.loads(out)["nodes"]
    assert names == [n.name for n in deployed[1:]], names
    assert (tmp_path / "state").exists() and sorted(p.name for p in state.iterdir()) == sorted(
        n.name for n in deployed)  # a dry run writes nothing


def test_targets_with_nothing_deployed_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """No record in the state dir (nothing deployed yet, or a mistyped --state-dir): every node where the first apply
    puts it, and a note on stderr that says so; nothing is written."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    spec = write_spec(tmp_path, make_spec("cluster"))
    code, out, err = run(capsys, "metrics", "targets", "-f", str(spec), "--state-dir", str(tmp_path / "typo"))
    assert code == EXIT_OK and len(json.loads(out)) == 6, err
    assert f"is deployed in {tmp_path / 'typo'}: the targets are where the first apply puts the nodes" in err, err
    assert not (tmp_path / "typo").exists()
