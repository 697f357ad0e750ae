"""Drift in files and secrets, planned from synthetic facts (pure)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from opsctl.base.secrets import MASK, Secret
from opsctl.observe.replies import RoleInfo, is_config_directive
from opsctl.plan.desired import DIFFERS, PREVIOUS, sentinel_file_values, server_file_values, single_valued
from opsctl.plan.facts import NodeFacts
from opsctl.plan.planner import make_plan
from opsctl.render.directives import SECRET_DIRECTIVES
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.load import load_spec, make_resolver
from opsctl.spec.text import split_args
from tests.support import PASSWORD, make_spec
from tests.test_planner import desired, formed_cluster, loaded_spec

SECRET = Secret("the-spec-secret-123")


def test_file_values_read_aliases_quotes_and_save_lines_and_hide_secrets() -> None:
    text = ('# comment\nprimaryauth "the-spec-secret-123"\nrequirepass "old-one-4567890"\n'
            'save 900 1\nsave 300 10\ncommandlog-execution-slower-than 10000\nslave-read-only yes\n'
            'dir "/var/lib/x"\nrename-command KEYS ""\n')
    values = server_file_values(text, SECRET_DIRECTIVES, SECRET, Secret("old-one-4567890"))
    assert values == {"masterauth": MASK, "requirepass": PREVIOUS, "save": "900 1 300 10",
                      "slowlog-log-slower-than": "10000", "replica-read-only": "yes", "dir": "/var/lib/x"}
    assert server_file_values('requirepass "x"\nsave ""\n', SECRET_DIRECTIVES, SECRET) == \
        {"requirepass": DIFFERS, "save": ""}


def test_sentinel_file_values_give_auth_pass_as_a_verdict() -> None:
    text = 'sentinel monitor m 127.0.0.1 7000 2\nsentinel auth-pass m wrong-one-123456\n' \
           'sentinel rename-command m CONFIG OPS_C\n'
    assert sentinel_file_values(text, SECRET) == {"auth-pass": DIFFERS, "rename-command CONFIG": "OPS_C"}


def _with_disk(facts, name, **values):
    want = dict(values)
    return {**facts, name: dataclasses.replace(facts[name], on_disk=want)}


def _disk_of(loaded, name):
    want = desired(loaded)[name]
    return {k: " ".join(split_args(v)) if k not in SECRET_DIRECTIVES else MASK
            for k, v in single_valued(want.directives).items() if is_config_directive(k)}


def test_a_file_that_matches_the_spec_changes_nothing_and_a_drifted_file_is_written_again() -> None:
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    name = loaded.layout.servers[0].name
    clean = {n: dataclasses.replace(f, on_disk=_disk_of(loaded, n)) for n, f in facts.items()}
    assert make_plan(loaded, desired(loaded), clean, "d").steps == ()
    drifted = _with_disk(clean, name, **{**_disk_of(loaded, name), "maxmemory-policy": "allkeys-random"})
    steps = make_plan(loaded, desired(loaded), drifted, "d").steps
    assert [(s.kind, s.node) for s in steps][:1] == [("write-config", name)]
    assert "file on disk has maxmemory-policy 'allkeys-random'" in steps[0].reason
    secret = _with_disk(clean, name, **{**_disk_of(loaded, name), "masterauth": DIFFERS})
    steps = make_plan(loaded, desired(loaded), secret, "d").steps
    assert steps[0].kind == "write-config" and "masterauth '(differs from the spec)'" in steps[0].reason


def test_a_dropped_config_is_reset_live_or_by_a_restart_when_it_cannot_be() -> None:
    loaded = loaded_spec("standalone")
    want = desired(loaded)
    name = loaded.layout.servers[0].name
    extra = [["hz", "20"], ["io-threads", "4"], ["not-a-known-one", "x"]]
    record = NodeRecord.from_json({"digest": "old", "directives": [*map(list, want[name].directives), *extra]})
    live = {"maxmemory": "67108864", "maxmemory-policy": "allkeys-lru", "appendonly": "yes", "hz": "20",
            "io-threads": "4", "not-a-known-one": "x"}
    facts = {name: NodeFacts(name, True, record=record, reachable=True, config=live)}
    steps = make_plan(loaded, want, facts, "d").steps
    assert [(s.kind, getattr(s, "directive", "")) for s in steps] == \
        [("write-config", ""), ("config-set", "hz"), ("restart", "")]
    assert steps[1].value == '"10"' and "server default" in steps[1].reason
    assert "io-threads (left the spec)" in steps[2].reason and "not-a-known-one (left the spec)" in steps[2].reason


@pytest.mark.parametrize("accepts", [{"default": (PREVIOUS,)}, None])  # None: ACL GETUSER did not answer
def test_a_rotation_makes_every_node_accept_both_passwords_before_anything_uses_the_new_one(accepts) -> None:
    """Unknown accepted passwords are no reason to drop the overlap: a plain CONFIG SET requirepass would reset
    the default user to the new password alone and lock out every client still on the old one."""
    from tests.test_planner import load_dict

    data = make_spec("replication")
    data["auth"] |= {"previous_password": {"env": "OPSCTL_TEST_OLD"}}


    loaded = load_spec(yaml.safe_dump(data), "t.yaml",
                       make_resolver({"OPSCTL_TEST_PASSWORD": PASSWORD, "OPSCTL_TEST_OLD": "old-password-123"},
                                     lambda _: None))
    assert load_dict  # the same loader shape as the planner tests
    want = desired(loaded)
    facts = {}
    for node in loaded.layout.servers:
        record = NodeRecord(want[node.name].digest, tuple(want[node.name].directives))
        config = {"maxmemory": "67108864", "maxmemory-policy": "allkeys-lru", "appendonly": "yes",
                  "requirepass": PREVIOUS, "masterauth": PREVIOUS}
        role = RoleInfo("master", replicas=()) if node.role == "master" else \
            RoleInfo("replica", master=(loaded.layout.servers[0].address, loaded.layout.servers[0].port))
        facts[node.name] = NodeFacts(node.name, True, record=record, reachable=True, config=config, role=role,
                                     accepts=accepts)
    steps = make_plan(loaded, want, facts, "d").steps
    kinds = [s.kind for s in steps]
    servers = len(loaded.layout.servers)
    assert kinds[:servers] == ["set-passwords"] * servers
    assert kinds.count("config-set") == servers and all(
        s.directive == "masterauth" for s in steps if s.kind == "config-set")
    assert "previous password" in steps[0].reason


def test_a_missing_config_file_is_written_again_before_a_start() -> None:
    loaded = loaded_spec("standalone")
    want = desired(loaded)
    name = loaded.layout.servers[0].name
    record = NodeRecord(want[name].digest, tuple(want[name].directives))
    facts = {name: NodeFacts(name, False, "died", record=record, on_disk={})}
    steps = make_plan(loaded, want, facts, "d").steps
    assert [s.kind for s in steps] == ["write-config", "start"]
    assert steps[0].reason == "the config file on disk is missing or empty"


def test_a_default_user_line_holding_another_password_is_file_drift() -> None:
    """CONFIG REWRITE persists the default user; an old password there would come back at a restart."""
    import hashlib

    other = hashlib.sha256(b"old-one-4567890").hexdigest()
    mine = hashlib.sha256(SECRET.reveal().encode()).hexdigest()
    text = f"user default on #{mine} #{other} ~* &* +@all\n"
    verdicts = server_file_values(text, SECRET_DIRECTIVES, SECRET)["user default"]
    assert DIFFERS in verdicts and MASK in verdicts
    verdicts = server_file_values(text, SECRET_DIRECTIVES, SECRET, Secret("old-one-4567890"))["user default"]
    assert DIFFERS not in verdicts and PREVIOUS in verdicts
    loaded = loaded_spec("standalone")
    name = loaded.layout.servers[0].name
    facts = {name: NodeFacts(name, False, "died", record=NodeRecord(desired(loaded)[name].digest),
                             on_disk={**_disk_of(loaded, name), "user default": f"{MASK} {DIFFERS}"})}
    steps = make_plan(loaded, desired(loaded), facts, "d").steps
    assert steps[0].kind == "write-config" and "default user" in steps[0].reason


def test_password_mode_renders_the_overlap_so_it_survives_a_restart() -> None:
    from opsctl.render import default_paths, render_node

    data = make_spec("standalone")
    data["auth"] |= {"previous_password": {"env": "OPSCTL_TEST_OLD"}}
    loaded = load_spec(yaml.safe_dump(data), "t.yaml",
                       make_resolver({"OPSCTL_TEST_PASSWORD": PASSWORD, "OPSCTL_TEST_OLD": "old-password-123"},
                                     lambda _: None))
    node = loaded.layout.servers[0]
    masked = render_node(loaded, node, default_paths("/x", node), reveal=False).files["redis.conf"]
    real = render_node(loaded, node, default_paths("/x", node), reveal=True).files["redis.conf"]
    assert "user default on #*** #*** ~* &* +@all" in masked and "old-password-123" not in real
    assert real.count("user default on #") == 1
