"""Drift behind opsctl's back, live changes the server refuses, dropped config entries: real servers."""

from __future__ import annotations

import json

import pytest
import redis
import yaml

from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, admin_for

pytestmark = pytest.mark.integration
CONFIG = "OPS_CONFIG_T3ST"


def _live(loaded, node, name: str) -> str:
    with admin_for(loaded, node) as admin:
        return admin.config_get(name)[name]


def _conf(tmp_path, loaded, node: str) -> str:
    return (tmp_path / ".opsctl" / loaded.spec.name / node / "redis.conf").read_text()


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_drift_persisted_with_config_rewrite_is_fixed_in_the_file_too(tmp_path, capsys, flavor) -> None:
    """Issue 14 case 5: CONFIG SET + CONFIG REWRITE behind opsctl's back; apply fixes live and file."""
    with deployed(tmp_path, capsys, "standalone", flavor) as (spec, loaded):
        node = loaded.layout.servers[0]
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)
        client.execute_command(CONFIG, "SET", "maxmemory-policy", "allkeys-random")
        client.execute_command(CONFIG, "REWRITE")
        assert "allkeys-random" in _conf(tmp_path, loaded, node.name)
        plan = plan_json(capsys, spec)
        kinds = [s["kind"] for s in plan["steps"]]
        assert kinds == ["write-config", "config-set"], plan
        assert "file on disk has maxmemory-policy" in plan["steps"][0]["reason"]
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert "maxmemory-policy allkeys-lru" in _conf(tmp_path, loaded, node.name)
        assert "allkeys-random" not in _conf(tmp_path, loaded, node.name)
        assert _live(loaded, node, "maxmemory-policy") == "allkeys-lru"
        assert plan_json(capsys, spec)["steps"] == []
        # the file alone drifted (live is right): still a change, and the restart brings back the spec's value
        conf = tmp_path / ".opsctl" / loaded.spec.name / node.name / "redis.conf"
        conf.write_text(conf.read_text() + "\nmaxmemory-policy noeviction\n")
        plan = plan_json(capsys, spec)
        assert [s["kind"] for s in plan["steps"]] == ["write-config"], plan
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        code, out, err = run(capsys, "restart", "-f", str(spec), "--auto-approve", "--allow-downtime")
        assert code == 0, err + out
        assert _live(loaded, node, "maxmemory-policy") == "allkeys-lru"
        assert plan_json(capsys, spec)["steps"] == []


def test_a_value_the_server_refuses_rolls_the_node_back(tmp_path, capsys) -> None:
    """Issue 11 item 4: the refused CONFIG SET leaves the old file, record and live values; a restart with the
    original spec still works."""
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        original = spec.read_text()
        before = {n.name: _conf(tmp_path, loaded, n.name) for n in loaded.layout.servers}
        data = yaml.safe_load(original)
        data["memory"]["maxmemory"] = "96mb"  # accepted, applied first on each node
        data["config"] = {"notify-keyspace-events": "KQ"}  # refused by the server (validate knows no event classes)
        spec.write_text(yaml.safe_dump(data))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 1, out + err
        first = loaded.layout.shards[0].replicas[0]
        assert f"{first} refused CONFIG SET notify-keyspace-events" in err and "argument" in err.lower(), err
        assert "rolled back" in err and "Traceback" not in err
        for node in loaded.layout.servers:
            assert _conf(tmp_path, loaded, node.name) == before[node.name]
            with admin_for(loaded, node) as admin:
                assert admin.config_get("maxmemory")["maxmemory"] == str(64 * 1024 * 1024)
        spec.write_text(original)
        assert plan_json(capsys, spec)["steps"] == []
        code, out, err = run(capsys, "restart", "-f", str(spec), "--auto-approve", "--allow-downtime")
        assert code == 0, err + out
        code, out, _ = run(capsys, "status", "-f", str(spec), "--output", "json")
        assert code == 0 and json.loads(out)["healthy"]


def test_a_changed_user_password_changes_the_plan_and_no_secret_shows(tmp_path, capsys, monkeypatch) -> None:
    """Issue 14 case 8: the plan digest covers masked files, so a new password looked like "no changes"."""
    old, new = "app-old-pw-5e1d2c3b4a", "app-new-pw-9f8e7d6c5b"
    monkeypatch.setenv("OPSCTL_TEST_APP_PW", old)
    auth = {"mode": "acl", "password": {"env": "OPSCTL_TEST_PASSWORD"},
            "users": [{"name": "app", "password": {"env": "OPSCTL_TEST_APP_PW"},
                       "rules": "~app:* +@read +@write +ping"}]}
    with deployed(tmp_path, capsys, "standalone", "valkey", auth=auth) as (spec, loaded):
        node = loaded.layout.servers[0]
        monkeypatch.setenv("OPSCTL_TEST_APP_PW", new)
        code, out, err = run(capsys, "plan", "-f", str(spec), "--output", "json")
        assert code == 2, out + err
        assert old not in out + err and new not in out + err
        assert [s["kind"] for s in json.loads(out)["steps"]] == ["write-config", "acl-load"]
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert old not in out + err and new not in out + err
        assert redis.Redis(host=node.address, port=node.port, username="app", password=new).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=node.address, port=node.port, username="app", password=old).ping()
        assert plan_json(capsys, spec)["steps"] == []


def test_sentinel_auth_pass_and_timing_drift_show_in_the_plan_and_apply_fixes_them(tmp_path, capsys) -> None:
    """Issue 11: Sentinel auth-pass drift left the plan empty while status said degraded."""
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        first, second = loaded.layout.sentinels[:2]
        name = loaded.spec.name
        wrong = "wrong-pass-0123456789"
        redis.Redis(host=first.address, port=first.port, password=PASSWORD).execute_command(
            "SENTINEL", "SET", name, "auth-pass", wrong)
        redis.Redis(host=second.address, port=second.port, password=PASSWORD).execute_command(
            "SENTINEL", "SET", name, "down-after-milliseconds", "9999")
        code, out, err = run(capsys, "plan", "-f", str(spec), "--output", "json")
        assert code == 2 and wrong not in out + err
        steps = {s["node"]: s for s in json.loads(out)["steps"] if s["kind"] == "sentinel-set"}
        assert set(steps) == {first.name, second.name}, out
        assert "auth-pass" in steps[first.name]["reason"] and "down-after" in steps[second.name]["reason"]
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        assert plan_json(capsys, spec)["steps"] == []
        sentinel = redis.Redis(host=second.address, port=second.port, password=PASSWORD, decode_responses=True)
        assert sentinel.execute_command("SENTINEL", "MASTER", name)["down-after-milliseconds"] == "1000"
        conf = (tmp_path / ".opsctl" / name / first.name / "sentinel.conf").read_text()
        assert wrong not in conf and PASSWORD in conf


def test_a_config_entry_removed_from_the_spec_goes_back_to_the_server_default(tmp_path, capsys) -> None:
    """Issue 11: removing a `config:` entry never reset the live value."""
    with deployed(tmp_path, capsys, "replication", "redis", config={"hz": 20, "maxmemory-samples": 7}) \
            as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        del data["config"]
        spec.write_text(yaml.safe_dump(data))
        plan = plan_json(capsys, spec)
        sets = {(s["node"], s["directive"], s["value"]) for s in plan["steps"] if s["kind"] == "config-set"}
        assert sets == {(n.name, d, v) for n in loaded.layout.servers
                        for d, v in (("hz", '"10"'), ("maxmemory-samples", '"5"'))}, plan
        assert "restart" not in {s["kind"] for s in plan["steps"]}
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, out + err
        for node in loaded.layout.servers:
            assert (_live(loaded, node, "hz"), _live(loaded, node, "maxmemory-samples")) == ("10", "5")
            assert "hz" not in _conf(tmp_path, loaded, node.name).split()
        assert plan_json(capsys, spec)["steps"] == []
