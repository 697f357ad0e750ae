"""A refused password is said as such by every command (issue 11 item 18, issue 14 case 7)."""

from __future__ import annotations

from pathlib import Path

from opsctl.base.errors import is_auth_failure, not_answering
from opsctl.plan.facts import NodeFacts
from opsctl.plan.health import health_hint, health_line
from opsctl.state.specfile import read_spec
from opsctl.status.looks import node_status
from tests.support import make_spec, write_spec

WRONGPASS = "AuthenticationError: invalid username-password pair or user is disabled."


def test_auth_errors_are_told_apart() -> None:
    for text in (WRONGPASS, "ResponseError: WRONGPASS invalid username-password pair",
                 "NOAUTH Authentication required.", "AuthenticationError: Authentication required."):
        assert is_auth_failure(text), text
        assert not_answering("n1", text) == "authentication failed for n1"
    assert not is_auth_failure("ConnectionError: Error 111 connecting to 127.0.0.1:7001. Connection refused.")
    assert not_answering("n1", "") == "n1 does not answer (not running)"


def test_status_says_authentication_failed_and_is_unhealthy(tmp_path: Path) -> None:
    loaded = read_spec(write_spec(tmp_path, make_spec("replication", "valkey", hosts=2)))
    names = [n.name for n in loaded.layout.nodes]
    facts = {names[0]: NodeFacts(names[0], True, "", {}, False, WRONGPASS),
             names[1]: NodeFacts(names[1], False, "not running (no pidfile)", {})}
    healthy, line = health_line(loaded, facts)
    assert not healthy
    assert line == f"replication degraded: authentication failed for {names[0]}; 1 node(s) down: {names[1]}"
    assert "auth.password" in health_hint(facts)
    states = {row.name: row.state for row in node_status(loaded.layout, facts)}
    assert states == {names[0]: "authentication failed", names[1]: "down"}


def test_a_connection_closed_before_any_answer_is_silence_not_a_tls_mismatch() -> None:
    """Through an SSH tunnel whose far end finds nothing listening, the TLS handshake ends in EOF: the node is down,
    not speaking plaintext (a CI run's first TLS apply over tunnels was refused as 'no TLS answer')."""
    import ssl

    from opsctl.base.errors import is_tls_failure

    eof = ssl.SSLEOFError(8, "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol (_ssl.c:1006)")
    assert not is_tls_failure(eof)
    assert is_tls_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)"))
    assert is_tls_failure("SSLCertVerificationError: certificate verify failed: unable to get local issuer")
