"""Why a node does not answer, said the same way by every command: a refused password first.

Pure: works on the error text an observation kept (or on an exception), so no redis import is needed here.
"""

from __future__ import annotations

AUTH_MARKERS = ("wrongpass", "noauth", "invalid password", "invalid username-password", "authentication",
                "auth <password> called without any password")
AUTH_HINT = ("the node runs with another password than the spec's: fix auth.password (its env variable or file), "
             "or, to rotate it, set auth.previous_password to the password the nodes run with (docs/rotation.md)")


TLS_MARKERS = ("ssl", "certificate verify failed", "wrong version number", "tlsv1 alert", "handshake")
SILENT_CLOSES = ("unexpected_eof_while_reading", "eof occurred in violation of protocol")  # closed, no answer
TLS_HINT = ("opsctl speaks TLS as the spec says but the node does not: a node started before tls.enabled still "
            "speaks plaintext (turning TLS on for running nodes is not automated: stop them with `opsctl destroy` "
            "without --purge, which keeps their data, then apply), or it trusts another CA (docs/tls.md)")


def is_tls_failure(error: object) -> bool:
    """True when the TLS handshake failed (plaintext node, unknown CA, wrong name). A connection closed before any
    answer (an SSH tunnel whose far end found nothing listening, a server shutting down) is no such failure: the peer
    said nothing, as a node that is down says nothing."""
    text = error_text(error).lower()
    if any(marker in text for marker in SILENT_CLOSES):
        return False
    return any(marker in text for marker in TLS_MARKERS)


def error_text(error: object) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error or "")


def is_auth_failure(error: object) -> bool:
    """True when the node answered but refused opsctl's credentials (WRONGPASS, NOAUTH, AuthenticationError)."""
    text = error_text(error).lower()
    return any(marker in text for marker in AUTH_MARKERS)


def auth_failed(node: str) -> str:
    return f"authentication failed for {node}"


def not_answering(node: str, error: object) -> str:
    """`authentication failed for n1` or `n1 does not answer (<why>)`: one phrase for every command."""
    if is_auth_failure(error):
        return auth_failed(node)
    return f"{node} does not answer ({error_text(error) or 'not running'})"
