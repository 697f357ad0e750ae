"""Password rotation without downtime, under a writer that reconnects with the new password (real servers)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import yaml

from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, admin_for
from tests.writer import Writer

pytestmark = pytest.mark.integration
NEW = "rotated-pw-7d3e9a1c5b2f"


class Reconnecting:
    """A client that opens a new connection every few writes, with the new password first, then the old."""

    def __init__(self, address: str, port: int, username: str | None = None, every: int = 20) -> None:
        self.address, self.port, self.username, self.every = address, port, username, every
        self.count = 0
        self.client = self._connect()

    def _connect(self) -> redis.Redis:
        for password in (NEW, PASSWORD):
            client = redis.Redis(host=self.address, port=self.port, username=self.username, password=password,
                                 socket_timeout=2.0, decode_responses=True)
            try:
                client.ping()
                return client
            except redis.AuthenticationError:
                client.close()
        raise redis.AuthenticationError("neither password is accepted")

    def set(self, key: str, value: str) -> Any:
        self.count += 1
        if self.count % self.every == 0:
            self.client.close()
            self.client = self._connect()
        return self.client.set(key, value)


def _accepts(node, password: str, username: str | None = None) -> bool:
    try:
        return bool(redis.Redis(host=node.address, port=node.port, username=username, password=password).ping())
    except redis.AuthenticationError:
        return False


def _rotate(spec, monkeypatch, keep_previous: bool) -> None:
    monkeypatch.setenv("OPSCTL_TEST_NEW_PASSWORD", NEW)
    data = yaml.safe_load(spec.read_text())
    data["auth"]["password"] = {"env": "OPSCTL_TEST_NEW_PASSWORD"}
    data["auth"].pop("previous_password", None)
    if keep_previous:
        data["auth"]["previous_password"] = {"env": "OPSCTL_TEST_PASSWORD"}
    spec.write_text(yaml.safe_dump(data))


def _no_secret(text: str) -> None:
    assert NEW not in text and PASSWORD not in text


def test_password_mode_rotation_keeps_writes_and_replication(tmp_path, capsys, monkeypatch) -> None:
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        master = loaded.layout.node(loaded.layout.shards[0].master)
        with Writer(lambda: Reconnecting(master.address, master.port)) as writer:
            writer.wait_for_writes(100)
            _rotate(spec, monkeypatch, keep_previous=False)  # a new password alone: opsctl says how to rotate
            code, out, err = run(capsys, "plan", "-f", str(spec))
            assert code == 1 and "authentication failed" in err and "auth.previous_password" in err, out + err
            _no_secret(out + err)
            _rotate(spec, monkeypatch, keep_previous=True)
            code, out, err = run(capsys, "plan", "-f", str(spec), "--output", "json")
            assert code == 2, out + err
            _no_secret(out + err)
            kinds = [(s["kind"], s["node"]) for s in json.loads(out)["steps"]]
            first = [k for k, _ in kinds[:len(loaded.layout.nodes)]]
            assert first == ["set-passwords"] * len(loaded.layout.nodes), kinds
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            _no_secret(out + err)
            for node in loaded.layout.nodes:
                assert _accepts(node, NEW) and _accepts(node, PASSWORD), node.name
            assert plan_json(capsys, spec)["steps"] == []
            written = len(writer.acked)
            writer.wait_for_writes(written + 100)
            _rotate(spec, monkeypatch, keep_previous=False)  # the overlap ends
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            _no_secret(out + err)
            writer.wait_for_writes(len(writer.acked) + 100)
        for node in loaded.layout.nodes:
            assert _accepts(node, NEW) and not _accepts(node, PASSWORD), node.name
        assert plan_json(capsys, spec)["steps"] == []
        code, out, err = run(capsys, "restart", "-f", str(spec), "--auto-approve")  # nothing old comes back
        assert code == 0, out + err
        for node in loaded.layout.nodes:
            assert _accepts(node, NEW) and not _accepts(node, PASSWORD), node.name
        assert plan_json(capsys, spec)["steps"] == []
        code, out, _ = run(capsys, "status", "-f", str(spec), "--output", "json")
        assert code == 0 and json.loads(out)["healthy"], out
        client = redis.Redis(host=master.address, port=master.port, password=NEW, decode_responses=True)
        assert writer.verify(client) == [] and len(writer.acked) > 300
        assert writer.errors == []
        for node in loaded.layout.servers:  # roles moved in the restart's failover; links are what counts
            with admin_for(read_spec(spec), node) as admin:
                info = admin.info("replication")
            assert "master_link_status:up" in info or "connected_slaves:2" in info, info


def test_acl_mode_rotation_overlaps_for_the_admin_and_an_app_user(tmp_path, capsys, monkeypatch) -> None:
    app_old, app_new = "app-old-pw-1a2b3c4d5e", "app-new-pw-6f7a8b9c0d"
    monkeypatch.setenv("OPSCTL_TEST_APP_PW", app_old)
    auth = {"mode": "acl", "password": {"env": "OPSCTL_TEST_PASSWORD"},
            "users": [{"name": "app", "password": {"env": "OPSCTL_TEST_APP_PW"},
                       "rules": "~* +@read +@write +ping"}]}
    with deployed(tmp_path, capsys, "replication", "redis", auth=auth) as (spec, loaded):
        master = loaded.layout.node(loaded.layout.shards[0].master)
        with Writer(lambda: Reconnecting(master.address, master.port, "opsctl")) as writer:
            writer.wait_for_writes(100)
            monkeypatch.setenv("OPSCTL_TEST_APP_NEW", app_new)
            monkeypatch.setenv("OPSCTL_TEST_APP_OLD", app_old)
            _rotate(spec, monkeypatch, keep_previous=True)
            data = yaml.safe_load(spec.read_text())
            data["auth"]["users"][0] |= {"password": {"env": "OPSCTL_TEST_APP_NEW"},
                                         "previous_password": {"env": "OPSCTL_TEST_APP_OLD"}}
            spec.write_text(yaml.safe_dump(data))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            _no_secret(out + err)
            assert app_new not in out + err and app_old not in out + err
            for node in loaded.layout.servers:
                assert _accepts(node, NEW, "opsctl") and _accepts(node, PASSWORD, "opsctl")
                assert _accepts(node, app_new, "app") and _accepts(node, app_old, "app")
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
            _rotate(spec, monkeypatch, keep_previous=False)
            data = yaml.safe_load(spec.read_text())
            data["auth"]["users"][0].pop("previous_password")
            spec.write_text(yaml.safe_dump(data))
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            writer.wait_for_writes(len(writer.acked) + 100)
        for node in loaded.layout.servers:
            assert _accepts(node, NEW, "opsctl") and not _accepts(node, PASSWORD, "opsctl")
            assert _accepts(node, app_new, "app") and not _accepts(node, app_old, "app")
        assert plan_json(capsys, spec)["steps"] == []
        client = redis.Redis(host=master.address, port=master.port, username="opsctl", password=NEW,
                             decode_responses=True)
        assert writer.verify(client) == [] and writer.errors == []
        code, out, _ = run(capsys, "status", "-f", str(spec), "--output", "json")
        assert code == 0 and json.loads(out)["healthy"], out


def test_the_overlap_holds_when_acl_getuser_does_not_answer(tmp_path, capsys, monkeypatch) -> None:
    """opsctl cannot read which passwords the default user accepts (ACL GETUSER refused): the rotation still
    keeps both passwords, instead of a CONFIG SET requirepass that locks out every client on the old one."""
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        node = loaded.layout.servers[0]
        with admin_for(loaded, node) as admin:
            admin.call("ACL", "SETUSER", "default", "-acl|getuser")
        _rotate(spec, monkeypatch, keep_previous=True)
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        _no_secret(out + err)
        assert _accepts(node, NEW) and _accepts(node, PASSWORD)
