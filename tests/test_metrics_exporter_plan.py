"""The exporter's user and steps, pure (issue 24, items 1-2): its ACL user is rendered in users.acl (ACL mode) or as a
`user` line beside requirepass (password mode), with a password derived from the admin password; the plan starts an
exporter whose settings differ from the running one's and stops one that should not run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from opsctl.base.secrets import MASK, Secret
from opsctl.plan.desired import desired_nodes
from opsctl.plan.exporters import exporter_run, exporter_steps
from opsctl.plan.facts import NodeFacts
from opsctl.render import default_paths, render_node
from opsctl.render.exporter import EXPORTER_USER, exporter_secret
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec


@pytest.fixture(autouse=True)
def password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


def _loaded(tmp_path: Path, **sections: object) -> LoadedSpec:
    return read_spec(str(write_spec(tmp_path, make_spec("cluster", **sections))))


ACL = {"mode": "acl", "password": {"env": PASSWORD_ENV}}


@pytest.mark.parametrize("auth", [{}, ACL], ids=["password", "acl"])
def test_the_exporter_user_is_rendered_masked_and_with_its_derived_hash(tmp_path: Path, auth: dict[str, str]) -> None:
    loaded = _loaded(tmp_path, metrics={"exporter": True}, **({"auth": auth} if auth else {}))
    node = loaded.layout.servers[0]
    paths = default_paths(str(tmp_path), node)
    masked = "\n".join(render_node(loaded, node, paths).files.values())
    real = "\n".join(render_node(loaded, node, paths, reveal=True).files.values())
    line = next(x for x in real.splitlines() if f"{EXPORTER_USER} on #" in x)
    assert line.startswith("user ") and line.split()[4:6] == ["-@all", "+info"] and "+latency|latest" in line
    assert f"{EXPORTER_USER} on #{MASK} -@all" in masked
    secret = exporter_secret(loaded.spec.name, Secret(PASSWORD)).reveal()
    assert line.split()[3] == f"#{hashlib.sha256(secret.encode()).hexdigest()}"
    assert secret not in real and PASSWORD not in masked
    assert exporter_secret(loaded.spec.name, Secret("another")) != exporter_secret(loaded.spec.name, Secret(PASSWORD))


def test_no_exporter_no_user(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path)
    node = loaded.layout.servers[0]
    assert EXPORTER_USER not in "".join(render_node(loaded, node, default_paths(str(tmp_path), node)).files.values())


def test_steps_start_what_differs_and_stop_what_should_not_run(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, metrics={"exporter": True})
    desired = desired_nodes(loaded, lambda n: default_paths(str(tmp_path), n), True)
    runs = {name: exporter_run(loaded, want) for name, want in desired.items()}
    servers = [n.name for n in loaded.layout.servers]
    first = runs[servers[0]]
    assert "-config-command" in first.args and PASSWORD not in " ".join(first.args)
    assert first.password.reveal() not in " ".join(first.args) and first.password.reveal() in first.password_file
    facts = {name: NodeFacts(name, True, exporter=runs[name].digest) for name in servers}
    assert exporter_steps(loaded, desired, facts) == []
    facts[servers[1]] = NodeFacts(servers[1], True, exporter="old")
    facts[servers[2]] = NodeFacts(servers[2], True)
    steps = exporter_steps(loaded, desired, facts)
    assert [(s.kind, s.node) for s in steps] == [("start-exporter", servers[1]), ("start-exporter", servers[2])]
    spec = make_spec("cluster", metrics={"exporter": False})
    spec.update({k: v for k, v in loaded.spec.model_dump(mode="json").items() if k in ("name", "hosts", "cluster")})
    off = read_spec(str(write_spec(tmp_path, spec, "off.yaml")))
    assert [(s.kind, s.node) for s in exporter_steps(off, desired, facts)] == \
        [("stop-exporter", name) for name in servers if name != servers[2]]
