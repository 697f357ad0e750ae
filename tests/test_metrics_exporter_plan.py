"""The exporter's user and steps, pure (issue 24, items 1-2): its ACL user is rendered in users.acl (ACL mode) or as a
`user` line beside requirepass (password mode), with a password derived from the admin password; the plan starts an
exporter whose settings differ from the running one's and stops one that should not run."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opsctl.base.secrets import MASK, Secret
from opsctl.metrics.exporter import exporter_run, exporter_steps
from opsctl.plan.desired import PREVIOUS, desired_nodes
from opsctl.plan.facts import NodeFacts
from opsctl.plan.rotation import managed_users, rotation_steps, wanted_accepts
from opsctl.plan.servers import config_steps
from opsctl.render import default_paths, render_node
from opsctl.render.exporteruser import EXPORTER_USER, exporter_acl_words, exporter_rule_words, exporter_secret
from opsctl.server.versions import parse_version
from opsctl.spec.deployed import NodeRecord
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


def test_every_sentinel_gets_an_exporter_with_the_sentinel_rules(tmp_path: Path) -> None:
    loaded = read_spec(str(write_spec(tmp_path, make_spec("sentinel", metrics={"exporter": True}))))
    desired = desired_nodes(loaded, lambda n: default_paths(str(tmp_path), n), True)
    facts = {n.name: NodeFacts(n.name, True) for n in loaded.layout.nodes}
    steps = exporter_steps(loaded, desired, facts)
    assert [(s.kind, s.node) for s in steps] == [("start-exporter", n.name) for n in loaded.layout.nodes]
    sentinel = loaded.layout.sentinels[0]
    run = exporter_run(loaded, desired[sentinel.name])
    assert run.args[run.args.index("-redis.addr") + 1] == f"redis://{sentinel.address}:{sentinel.port}"
    words = exporter_acl_words(loaded, reveal=False, sentinel=True)
    assert words is not None and words[2:] == ["-@all", "+info", "+client|setname", "+sentinel|masters",
                                               "+sentinel|slaves", "+sentinel|sentinels", "+sentinel|ckquorum"]
    assert not any(w.startswith("+config") or w.startswith("+acl") or w == "+sentinel" for w in words)


def _rotating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous: bool,
              base: dict[str, Any] | None = None) -> LoadedSpec:
    """A sentinel fleet's spec rotating to a new password (previous: during the overlap); base: the same fleet."""
    monkeypatch.setenv("OPSCTL_TEST_NEW_PASSWORD", "new-pw-for-the-test")
    auth: dict[str, object] = {"mode": "password", "password": {"env": "OPSCTL_TEST_NEW_PASSWORD"}}
    if previous:
        auth["previous_password"] = {"env": PASSWORD_ENV}
    spec = {**(base or make_spec("sentinel", metrics={"exporter": True})), "auth": auth}
    return read_spec(str(write_spec(tmp_path, spec, f"rotating-{previous}.yaml")))


@pytest.mark.parametrize("previous", [True, False], ids=["overlap", "end"])
def test_rotation_covers_the_exporter_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous: bool) -> None:
    """The exporter's user is a managed user: during the overlap it accepts both derived passwords; after it, a node
    where it still accepts the old one gets a set-passwords step. A node without the user yet gets none."""
    loaded = _rotating(tmp_path, monkeypatch, previous)
    server, sentinel = loaded.layout.servers[0], loaded.layout.sentinels[0]
    for node in (server, sentinel):
        current, old = managed_users(loaded, node)[EXPORTER_USER]
        assert current == exporter_secret(loaded.spec.name, Secret("new-pw-for-the-test"))
        assert old == (exporter_secret(loaded.spec.name, Secret(PASSWORD)) if previous else None)
    want = wanted_accepts(loaded, server)
    desired = desired_nodes(loaded, lambda n: default_paths(str(tmp_path), n), True)
    stale = {"default": want["default"], EXPORTER_USER: tuple(sorted((MASK, PREVIOUS)))}
    facts = {n.name: NodeFacts(n.name, True, reachable=True, config={"requirepass": MASK},
                               sentinel_config={"sentinel-pass": MASK}, accepts=stale)
             for n in loaded.layout.nodes}
    steps = rotation_steps(loaded, desired, facts)
    assert [(s.kind, s.node) for s in steps] == ([] if previous else
                                                 [("set-passwords", n.name) for n in loaded.layout.nodes])
    missing = {n: replace(f, accepts={"default": want["default"]}) for n, f in facts.items()}
    assert rotation_steps(loaded, desired, missing) == []


def test_a_changed_user_line_restarts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotation's overlap changes the exporter's `user` line (a second hash): written to the file, set live
    by the rotation phase, never a reason to restart or to switch rename-command names."""
    base = make_spec("sentinel", metrics={"exporter": True})
    before = _rotating(tmp_path, monkeypatch, previous=False, base=base)
    after = _rotating(tmp_path, monkeypatch, previous=True, base=base)
    node = after.layout.servers[0]
    old = desired_nodes(before, lambda n: default_paths(str(tmp_path), n), True)[node.name]
    new = desired_nodes(after, lambda n: default_paths(str(tmp_path), n), True)[node.name]
    assert [d for d in old.directives if d[0] == "user"] != [d for d in new.directives if d[0] == "user"]
    facts = NodeFacts(node.name, True, {}, NodeRecord(old.digest, tuple(old.directives)),
                      reachable=True, config={})
    steps = config_steps(node, new, facts, True, ("redis", parse_version("7.0")))
    assert [s.kind for s in steps] == ["write-config"]


def test_a_running_exporter_whose_user_is_gone_is_started_again(tmp_path: Path) -> None:
    """Deleted behind opsctl's back (ACL DELUSER): ACL GETUSER shows no password, and the step sets the user again."""
    loaded = _loaded(tmp_path, metrics={"exporter": True})
    desired = desired_nodes(loaded, lambda n: default_paths(str(tmp_path), n), True)
    servers = [n.name for n in loaded.layout.servers]
    facts = {name: NodeFacts(name, True, exporter=exporter_run(loaded, desired[name]).digest,
                             accepts={"default": (MASK,), EXPORTER_USER: (MASK,)}) for name in servers}
    assert exporter_steps(loaded, desired, facts) == []
    facts[servers[0]] = replace(facts[servers[0]], accepts={"default": (MASK,), EXPORTER_USER: ()})
    steps = exporter_steps(loaded, desired, facts)
    assert [(s.kind, s.node) for s in steps] == [("start-exporter", servers[0])]
    assert EXPORTER_USER in steps[0].reason


def test_an_exporter_user_whose_rules_changed_live_is_set_again(tmp_path: Path) -> None:
    """Rules widened (or narrowed) behind opsctl's back are drift, named word by word; the order Redis 7.0 reports
    them in is not."""
    loaded = _loaded(tmp_path, metrics={"exporter": True})
    desired = desired_nodes(loaded, lambda n: default_paths(str(tmp_path), n), True)
    servers = [n.name for n in loaded.layout.servers]
    rules = exporter_rule_words(sentinel=False)
    facts = {name: NodeFacts(name, True, exporter=exporter_run(loaded, desired[name]).digest,
                             exporter_rules=tuple(reversed(rules))) for name in servers}
    assert exporter_steps(loaded, desired, facts) == []
    facts[servers[1]] = replace(facts[servers[1]], exporter_rules=(*rules, "+@all", "~*"))
    facts[servers[2]] = replace(facts[servers[2]], exporter_rules=tuple(w for w in rules if w != "+info"))
    steps = exporter_steps(loaded, desired, facts)
    assert [(s.kind, s.node) for s in steps] == [("start-exporter", servers[1]), ("start-exporter", servers[2])]
    assert "(has +@all, has ~*)" in steps[0].reason and "(lacks +info)" in steps[1].reason
