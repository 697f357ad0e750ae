"""TLS: spec and render (pure), certificates, and live fleets on Redis 7.0 (Debian's build has TLS)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from opsctl.binaries import tls_support
from opsctl.errors import SpecError
from opsctl.render import NodePaths, render_sections
from opsctl.spec.load import LoadedSpec, load_spec, make_resolver
from opsctl.tls.certs import covers, facts, issue, make_ca
from tests.support import PASSWORD, PASSWORD_ENV, make_spec

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


def test_a_server_without_tls_is_recognised_by_what_it_says() -> None:
    assert tls_support("# Missing implement of connection type tls\n# Failed finding TLS support.") is False
    assert tls_support("# No tls-cert-file configured!\n# Failed to configure TLS.") is True
    assert tls_support("Configured to not listen anywhere") is None


def test_bad_tls_input_is_refused_with_a_field() -> None:
    with pytest.raises(SpecError) as refused:
        _loaded(make_spec("standalone", "redis", hosts=1, tls={"enabled": True, "generate": True,
                                                              "protocols": ["SSLv3"]}))
    assert "tls.protocols[0]" in refused.value.render() and "TLSv1.3" in refused.value.render()
