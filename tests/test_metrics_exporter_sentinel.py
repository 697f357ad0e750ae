"""metrics.exporter: true on a Sentinel fleet (issue 24): apply runs a redis_exporter beside every server and every
Sentinel, each Sentinel's logged in as opsctl-exporter with the Sentinel rules (nothing refused in ACL LOG, SENTINEL
SET/FAILOVER/RESET and ACL refused); a Sentinel killed and started again from its own file keeps the user; a user
deleted behind opsctl's back is set again; a changed port_offset plans a start-exporter step per node; a password
rotation, overlap and end, leaves every exporter scraping and the old exporter password refused everywhere; destroy
leaves no exporter. Real Redis 7.0 and Valkey 9.1 servers and sentinels, Debian's prometheus-redis-exporter."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
import yaml

from opsctl.base.poll import wait_for
from opsctl.base.secrets import Secret
from opsctl.metrics.exporter import EXPORTER_BINARY
from opsctl.render.exporteruser import EXPORTER_USER, exporter_secret
from opsctl.spec.layout import Node, sentinel_master_name
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD
from tests.test_metrics_exporter_live import _needs, _proc_texts, _redis_up, _scrape
from tests.test_rotation import NEW, _rotate

pytestmark = pytest.mark.integration


def _all_up(loaded: LoadedSpec, offset: int) -> None:
    """Every node's exporter answers redis_up 1 (an exporter that just restarted may need a scrape or two)."""
    for node in loaded.layout.nodes:
        wait_for(lambda n=node: _redis_up(_scrape(n, offset)) == "1", CONDITION_BOUND,
                 f"redis_up 1 from {node.name}'s exporter")


def _logs_in(node: Node, password: str) -> bool:
    client = redis.Redis(node.address, node.port, username=EXPORTER_USER, password=password, socket_timeout=5)
    try:
        return bool(client.info("server"))
    except redis.AuthenticationError:
        return False
    finally:
        client.close()


def _admin(node: Node, password: str = PASSWORD) -> redis.Redis:
    return redis.Redis(node.address, node.port, password=password, socket_timeout=5, decode_responses=True)


def _acl_as_operator(loaded: LoadedSpec, node: Node, *words: str) -> object:
    """An ACL command as an operator would run it: as the admin (ACL mode servers) or the default user, under ACL's
    renamed name."""
    acl_mode = loaded.spec.auth.mode == "acl" and not node.is_sentinel
    client = redis.Redis(node.address, node.port, username=loaded.spec.auth.admin_user if acl_mode else None,
                         password=PASSWORD, socket_timeout=5)
    command = "ACL" if node.is_sentinel else loaded.renames.get("ACL", "ACL")
    try:
        return client.execute_command(command, *words)
    finally:
        client.close()


def _delete_exporter_user(loaded: LoadedSpec, node: Node) -> None:
    assert _acl_as_operator(loaded, node, "DELUSER", EXPORTER_USER) == 1


def _sentinel_refusals(loaded: LoadedSpec, sentinel: Node) -> None:
    """The Sentinel's exporter user: everything the exporter asks passes (empty ACL LOG), nothing that changes or
    reveals anything does."""
    admin = _admin(sentinel)
    assert [e for e in admin.acl_log() if e["username"] == EXPORTER_USER] == []
    password = exporter_secret(loaded.spec.name, Secret(PASSWORD)).reveal()
    client = redis.Redis(sentinel.address, sentinel.port, username=EXPORTER_USER, password=password)
    master = sentinel_master_name(loaded.spec)
    for command in (("SENTINEL", "SET", master, "quorum", "1"), ("SENTINEL", "FAILOVER", master),
                    ("SENTINEL", "RESET", "*"), ("SENTINEL", "REMOVE", master), ("ACL", "LIST"),
                    ("SENTINEL", "CONFIG", "GET", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command(*command)
    client.close()
    admin.close()


def _kill_sentinel(tmp_path: Path, loaded: LoadedSpec, sentinel: Node) -> None:
    pid = int((tmp_path / ".opsctl" / loaded.spec.name / sentinel.name / "server.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _apply(capsys: pytest.CaptureFixture[str], spec: Path) -> None:
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    assert code == 0, err + out
    assert NEW not in out + err and PASSWORD not in out + err


# password mode on both servers; ACL mode (users.acl on the servers, requirepass on the Sentinels) on Valkey 9.1
CASES = {"redis-password": ("redis", {}), "valkey-password": ("valkey", {}),
         "valkey-acl": ("valkey", {"auth": {"mode": "acl", "password": {"env": "OPSCTL_TEST_PASSWORD"}}})}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exporters_beside_sentinels_and_through_a_rotation(tmp_path: Path, case: str,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _needs(EXPORTER_BINARY, "prometheus-redis-exporter")
    flavor, sections = CASES[case]
    with deployed(tmp_path, capsys, "sentinel", flavor, metrics={"exporter": True}, **sections) as (spec, loaded):
        offset = loaded.spec.metrics.port_offset
        sentinels = loaded.layout.sentinels
        assert sentinels
        _all_up(loaded, offset)
        for sentinel in sentinels:
            text = _scrape(sentinel, offset)
            assert "redis_sentinel_masters 1" in text, sentinel.name  # the exporter saw it as a Sentinel
            assert 'redis_sentinel_master_ok_sentinels{' in text, sentinel.name  # SENTINEL SENTINELS answered
            _sentinel_refusals(loaded, sentinel)
        assert plan_json(capsys, spec)["steps"] == []

        _kill_sentinel(tmp_path, loaded, sentinels[0])  # started again from the file Sentinel itself wrote
        _apply(capsys, spec)
        _all_up(loaded, offset)
        assert _logs_in(sentinels[0], exporter_secret(loaded.spec.name, Secret(PASSWORD)).reveal())

        gone = [sentinels[1], loaded.layout.servers[1]]  # the user deleted behind opsctl's back: plan sets it again
        for node in gone:
            _delete_exporter_user(loaded, node)
        steps = plan_json(capsys, spec)["steps"]
        assert sorted((s["kind"], s["node"]) for s in steps) == sorted(("start-exporter", n.name) for n in gone)
        _apply(capsys, spec)
        _all_up(loaded, offset)

        widened = [sentinels[2], loaded.layout.servers[0]]  # its rules widened behind opsctl's back: plan narrows them
        for node in widened:
            _acl_as_operator(loaded, node, "SETUSER", EXPORTER_USER, "+@all", "~*")
        steps = plan_json(capsys, spec)["steps"]
        assert sorted((s["kind"], s["node"]) for s in steps) == sorted(("start-exporter", n.name) for n in widened)
        assert all("has +@all" in s["reason"] and "has ~*" in s["reason"] for s in steps), steps
        _apply(capsys, spec)
        for node in widened:  # narrowed again: what +@all allowed is refused
            client = redis.Redis(node.address, node.port, username=EXPORTER_USER,
                                 password=exporter_secret(loaded.spec.name, Secret(PASSWORD)).reveal())
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*(("ACL", "LIST") if node.is_sentinel else ("SET", "k", "v")))
            client.close()
        assert plan_json(capsys, spec)["steps"] == []

        changed = yaml.safe_load(spec.read_text())
        changed["metrics"]["port_offset"] = offset + 11
        spec.write_text(yaml.safe_dump(changed))
        steps = plan_json(capsys, spec)["steps"]
        assert sorted((s["kind"], s["node"]) for s in steps) == sorted(
            ("start-exporter", n.name) for n in loaded.layout.nodes)
        _apply(capsys, spec)
        offset += 11
        _all_up(loaded, offset)

        old = exporter_secret(loaded.spec.name, Secret(PASSWORD)).reveal()
        new = exporter_secret(loaded.spec.name, Secret(NEW)).reveal()
        _rotate(spec, monkeypatch, keep_previous=True)
        _apply(capsys, spec)
        for node in loaded.layout.nodes:
            assert _logs_in(node, new) and _logs_in(node, old), node.name
        _all_up(loaded, offset)
        _rotate(spec, monkeypatch, keep_previous=False)  # the overlap ends
        _apply(capsys, spec)
        for node in loaded.layout.nodes:
            assert _logs_in(node, new) and not _logs_in(node, old), node.name
        _all_up(loaded, offset)
        assert plan_json(capsys, spec)["steps"] == []
        leaks = [(pid, name) for pid, name, text in _proc_texts() if new.encode() in text or old.encode() in text]
        assert leaks == []
        monkeypatch.setenv("OPSCTL_TEST_PASSWORD", NEW)  # what destroy (deployed's cleanup) now needs
    exporters = [pid for pid, name, text in _proc_texts() if name == "cmdline" and str(tmp_path).encode() in text
                 and b"exporter" in text]
    assert exporters == []
