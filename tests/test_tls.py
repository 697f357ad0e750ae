"""TLS: spec and render (pure), certificates, and live fleets on Redis 7.0 (Debian's build has TLS)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from opsctl.base.errors import SpecError
from opsctl.providers.binaries import tls_support
from opsctl.render import NodePaths, render_sections
from opsctl.runtime.opening import make_connector
from opsctl.spec.load import LoadedSpec, load_spec, make_resolver
from opsctl.tls.certs import covers, facts, issue, make_ca
from tests.lifecycle import deployed, plan_json, run
from tests.support import (
    PASSWORD,
    PASSWORD_ENV,
    admin_for,
    cluster_check,
    make_spec,
    redis_cli,
    server_binary,
    tls_cli_args,
    tls_client_options,
    write_spec,
)
from tests.writer import Writer, cluster_client

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _loaded(spec: dict[str, Any]) -> LoadedSpec:
    import yaml

    return load_spec(yaml.safe_dump(spec), "spec.yaml", make_resolver({PASSWORD_ENV: PASSWORD}, lambda _: None))


def _directives(loaded: LoadedSpec, index: int = 0) -> dict[str, str]:
    node = loaded.layout.nodes[index]
    paths = NodePaths("/n", "/n/redis.conf", "/n/users.acl", "/n/log", "/n/pid")
    return {k: v for s in render_sections(loaded, node, paths, reveal=False) for k, v in s.directives}


def test_tls_renders_a_tls_port_only_and_tls_for_replication_and_the_bus() -> None:
    loaded = _loaded(make_spec("cluster", "redis", tls={"enabled": True, "generate": True}))
    d = _directives(loaded)
    node = loaded.layout.nodes[0]
    assert (d["port"], d["tls-port"]) == ("0", str(node.port))
    assert d["tls-cert-file"] == '"/n/tls.crt"' and d["tls-ca-cert-file"] == '"/n/tls-ca.crt"'
    assert (d["tls-replication"], d["tls-cluster"], d["tls-auth-clients"]) == ("yes", "yes", "yes")
    assert d["tls-protocols"] == '"TLSv1.2 TLSv1.3"'
    sentinel = _loaded(make_spec("sentinel", "redis", tls={"enabled": True, "generate": True,
                                                           "plaintext_port": True, "client_auth": "optional"}))
    s = _directives(sentinel, len(sentinel.layout.nodes) - 1)
    assert s["tls-port"] == s["sentinel announce-port"] and int(s["port"]) == int(s["tls-port"]) + 1000
    assert (s["tls-replication"], s["tls-auth-clients"]) == ("yes", "optional") and "tls-cluster" not in s
    assert "tls-port" not in _directives(_loaded(make_spec("standalone", "redis", hosts=1)))


def test_given_certificates_must_cover_every_node() -> None:
    spec = make_spec("replication", "redis", tls={"enabled": True, "ca": {"file": "ca.pem"}, "cert": {"file": "c"}})
    with pytest.raises(SpecError) as refused:
        _loaded(spec)
    assert "has no tls key file" in refused.value.render()
    spec["hosts"] = [{**h, "tls": {"key": {"file": f"{h['name']}.key"}}} for h in spec["hosts"]]
    _loaded(spec)
    with pytest.raises(SpecError) as refused:
        _loaded(make_spec("standalone", "redis", hosts=1, tls={"enabled": True, "generate": True,
                                                              "ca": {"file": "ca.pem"}}))
    assert "not both" in refused.value.render()


def test_generated_certificates_name_the_node_and_chain_to_the_ca() -> None:
    ca = make_ca("test CA", NOW)
    cert = issue(ca, "n1", ("127.0.0.9", "host-a"), NOW)
    fact = facts(cert.cert)[0]
    assert covers(fact, ("127.0.0.9", "host-a")) and not covers(fact, ("127.0.0.8",))
    assert 390 < fact.days_left(NOW) < 400 and "CN=n1" in fact.subject
    assert len(facts(ca.cert + make_ca("next", NOW).cert)) == 2


def test_the_tls_audit_judges_expiry_protocols_and_plaintext() -> None:
    from opsctl.tls.judge import TlsSeen, findings

    cert = facts(issue(make_ca("ca", NOW), "n1", ("127.0.0.9",), NOW, days=20).cert)[0]
    seen = TlsSeen("n1", cert, "TLSv1.3", "TLSv1.2 TLSv1.3", None)
    assert [(f.rule, f.severity) for f in findings(seen, NOW, False)] == [("tls-expiry", "medium")]
    later = NOW + datetime.timedelta(days=21)
    assert [(f.rule, f.severity) for f in findings(seen, later, False)] == [("tls-expiry", "critical")]
    fresh = facts(issue(make_ca("ca", NOW), "n1", (), NOW).cert)[0]
    old = TlsSeen("n1", fresh, "TLSv1.2", "TLSv1.1 TLSv1.2", "port 7101 answers without TLS")
    assert [(f.rule, f.severity) for f in findings(old, NOW, False)] == [("tls", "high"), ("tls", "high")]
    assert [f.severity for f in findings(old, NOW, True)] == ["high", "low"]


def test_a_tls_node_with_a_plaintext_port_is_recognised_by_its_title() -> None:
    from opsctl.providers.proc import ProcFacts, is_node_process

    titled = ProcFacts(7, "/usr/bin/redis-server", "/s/n1", ("/usr/bin/redis-server", "127.0.0.1:8101"))
    assert is_node_process(titled, "/usr/bin/redis-server", "/s/n1", "/s/n1/redis.conf", 7101, 8101)
    assert not is_node_process(titled, "/usr/bin/redis-server", "/s/n1", "/s/n1/redis.conf", 7101)


def test_a_server_without_tls_is_recognised_by_what_it_says() -> None:
    assert tls_support("# Missing implement of connection type tls\n# Failed finding TLS support.") is False
    assert tls_support("# No tls-cert-file configured!\n# Failed to configure TLS.") is True
    assert tls_support("Configured to not listen anywhere") is None


def test_bad_tls_input_is_refused_with_a_field() -> None:
    with pytest.raises(SpecError) as refused:
        _loaded(make_spec("standalone", "redis", hosts=1, tls={"enabled": True, "generate": True,
                                                              "protocols": ["SSLv3"]}))
    assert "tls.protocols[0]" in refused.value.render() and "TLSv1.3" in refused.value.render()


# --- live, Redis 7.0 ---------------------------------------------------------------------------------------

TLS = {"enabled": True, "generate": True}


def _state(spec: Path, loaded: LoadedSpec) -> Path:
    return spec.parent / ".opsctl" / loaded.spec.name


def _pids(state: Path, loaded: LoadedSpec) -> dict[str, str]:
    return {n.name: (state / n.name / "server.pid").read_text().strip() for n in loaded.layout.nodes}


def _assert_tls_only(loaded: LoadedSpec, state: Path) -> None:
    """No plaintext answer; redis-cli --tls answers; CONFIG GET shows TLS for replication and the bus."""
    connector = make_connector(loaded, state)
    for node in loaded.layout.nodes:
        with pytest.raises(redis.ConnectionError):
            redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=2).ping()
        cli = subprocess.run([redis_cli(), *tls_cli_args(state), "-h", node.address, "-p", str(node.port), "PING"],
                             capture_output=True, text=True, env={**os.environ, "REDISCLI_AUTH": PASSWORD},
                             timeout=30, check=False)
        assert cli.stdout.strip() == "PONG", cli.stdout + cli.stderr
        if not node.is_sentinel:
            with admin_for(connector, node) as admin:
                live = admin.config_get("tls-*") | admin.config_get("port")
            assert (live["port"], live["tls-port"], live["tls-replication"]) == ("0", str(node.port), "yes")
            assert live["tls-cluster"] == ("yes" if loaded.spec.topology == "cluster" else "no")


@pytest.mark.integration
def test_a_server_without_tls_is_refused_before_anything_starts(tmp_path: Path, capsys) -> None:
    server_binary("valkey")
    spec = write_spec(tmp_path, make_spec("standalone", "valkey", hosts=1, tls=TLS))
    for command in ("validate", "plan", "apply"):
        code, out, err = run(capsys, command, "-f", str(spec), *(["--auto-approve"] if command == "apply" else []))
        assert code == 1 and "built without TLS" in err and "distribution package" in err, out + err
        assert "connection type tls" in err and "Traceback" not in err
    assert not (tmp_path / ".opsctl").exists()


@pytest.mark.integration
@pytest.mark.parametrize("topology", ["standalone", "replication"])
def test_tls_only_fleets(tmp_path: Path, capsys, topology: str) -> None:
    with deployed(tmp_path, capsys, topology, "redis", tls=TLS, hosts=1 if topology == "standalone" else 3) as (
            spec, loaded):
        state = _state(spec, loaded)
        _assert_tls_only(loaded, state)
        assert plan_json(capsys, spec)["steps"] == []
        code, out, _ = run(capsys, "tls", "ca", "-f", str(spec))
        assert code == 0 and out == (state / "tls" / "ca-bundle.crt").read_text()
        assert oct((state / "tls" / "ca.key").stat().st_mode & 0o777) == "0o600"
        if topology == "replication":
            _rotate_the_ca(capsys, spec, loaded, state)


def _rotate_the_ca(capsys, spec: Path, loaded: LoadedSpec, state: Path) -> None:
    """--new-ca (trust both), rotate (certs from the new CA), --drop-old-ca; dropping early is refused."""
    old_ca = (state / "tls" / "ca.crt").read_text()
    pids = _pids(state, loaded)
    code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec), "--new-ca")
    assert code == 0 and len(facts((state / "tls" / "ca-bundle.crt").read_text())) == 2, out + err
    code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec), "--drop-old-ca")
    assert code == 3 and "still come from an older CA" in err, out + err
    code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec))
    assert code == 0, out + err
    code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec), "--drop-old-ca")
    assert code == 0 and (state / "tls" / "ca-bundle.crt").read_text() != old_ca, out + err
    assert len(facts((state / "tls" / "ca-bundle.crt").read_text())) == 1 and _pids(state, loaded) == pids
    _assert_tls_only(loaded, state)
    assert plan_json(capsys, spec)["steps"] == []


@pytest.mark.integration
def test_sentinel_with_tls_fails_over_and_rotates(tmp_path: Path, capsys) -> None:
    with deployed(tmp_path, capsys, "sentinel", "redis", tls=TLS) as (spec, loaded):
        state = _state(spec, loaded)
        _assert_tls_only(loaded, state)
        code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--yes")
        assert code == 0, out + err
        before = _pids(state, loaded)
        code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec))
        assert code == 0 and "restarted (Sentinel cannot reload TLS files)" in out, out + err
        after = _pids(state, loaded)
        assert all(before[n.name] == after[n.name] for n in loaded.layout.servers)
        _assert_tls_only(loaded, state)
        code, out, err = run(capsys, "audit", "-f", str(spec), "tls", "--output", "json")
        assert code == 0 and len(json.loads(out)["tables"]["tls"]) == len(loaded.layout.nodes), out + err


@pytest.mark.integration
def test_tls_cluster_under_a_writer_fails_over_reshards_rotates_and_restarts(tmp_path: Path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "redis", tls=TLS) as (spec, loaded):
        state = _state(spec, loaded)
        _assert_tls_only(loaded, state)
        first = loaded.layout.servers[0].endpoint
        check = cluster_check(first, tls=tls_cli_args(state))
        assert check.returncode == 0, check.stdout + check.stderr
        masters = [s.master for s in loaded.layout.shards]
        with Writer(lambda: cluster_client(loaded, **tls_client_options(state))) as writer:
            writer.wait_for_writes(300)
            code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--yes")
            assert code == 0, out + err
            code, out, err = run(capsys, "cluster", "reshard", "-f", str(spec), "--from", masters[1], "--to",
                                 masters[2], "--slots", "300", "--auto-approve")
            assert code == 0, out + err
            writer.wait_for_writes(len(writer.acked) + 300)
            errors, pids = len(writer.errors), _pids(state, loaded)
            code, out, err = run(capsys, "tls", "rotate", "--auto-approve", "-f", str(spec))
            assert code == 0 and out.count(": reloaded, presents") == 6, out + err
            writer.wait_for_writes(len(writer.acked) + 300)
            assert _pids(state, loaded) == pids and len(writer.errors) == errors, writer.errors[errors:]
            code, out, err = run(capsys, "restart", "-f", str(spec), "--auto-approve")
            assert code == 0, out + err
            writer.wait_for_writes(len(writer.acked) + 300)
        assert writer.verify(cluster_client(loaded, **tls_client_options(state))) == []
        check = cluster_check(first, tls=tls_cli_args(state))
        assert check.returncode == 0, check.stdout + check.stderr
        code, out, err = run(capsys, "audit", "-f", str(spec), "tls", "config")
        assert code == 0 and "0 findings" in out, out + err
        assert plan_json(capsys, spec)["steps"] == []
