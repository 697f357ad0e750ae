"""What the TLS audit makes of one node's answers (certificate, protocol, plaintext port). Pure."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from opsctl.observe.findings import Finding, finding
from opsctl.tls.certs import CertFacts

WARN_DAYS = 30
OLD_PROTOCOLS = ("SSLv3", "TLSv1", "TLSv1.0", "TLSv1.1")


@dataclass(frozen=True)
class TlsSeen:
    node: str
    cert: CertFacts | None  # None: no TLS handshake
    protocol: str  # negotiated, e.g. TLSv1.3
    configured: str  # tls-protocols as the node runs it
    plaintext: str | None  # "port N answers PING without TLS", or None
    error: str = ""


def row(seen: TlsSeen, now: datetime.datetime) -> dict[str, Any]:
    days = round(seen.cert.days_left(now), 1) if seen.cert else None
    return {"node": seen.node, "days_left": days, "subject": seen.cert.subject if seen.cert else "",
            "protocol": seen.protocol, "tls_protocols": seen.configured, "plaintext": seen.plaintext or "closed",
            "error": seen.error}


def findings(seen: TlsSeen, now: datetime.datetime, plaintext_allowed: bool) -> list[Finding]:
    out: list[Finding] = []
    if seen.cert is None:
        return [finding("tls", "high", seen.node, f"no TLS handshake: {seen.error}",
                        "apply the spec (tls.enabled) and check the node's log")]
    days = seen.cert.days_left(now)
    if days <= 0:
        out.append(finding("tls-expiry", "critical", seen.node, f"its certificate expired {-days:.0f} days ago",
                           "opsctl tls rotate -f SPEC (generated certificates), or new files and the same command",
                           days_left=round(days, 1)))
    elif days < WARN_DAYS:
        out.append(finding("tls-expiry", "medium", seen.node, f"its certificate expires in {days:.0f} days",
                           "opsctl tls rotate -f SPEC before it does", days_left=round(days, 1)))
    old = [p for p in seen.configured.split() if p in OLD_PROTOCOLS]
    if old or seen.protocol in OLD_PROTOCOLS:
        out.append(finding("tls", "high", seen.node, f"old TLS versions allowed: {' '.join(old) or seen.protocol}",
                           "tls.protocols: [TLSv1.2, TLSv1.3]"))
    if seen.plaintext:
        out.append(finding("tls", "low" if plaintext_allowed else "high", seen.node, seen.plaintext,
                           "tls.plaintext_port: false closes it" if plaintext_allowed
                           else "apply the spec: a TLS node listens with `port 0`"))
    return out
