"""Addresses and endpoints, written one way: IP addresses compared in their canonical form (::1 and
0:0:0:0:0:0:0:1 are one host), IPv6 endpoints printed with brackets ([::1]:7000). Pure."""

from __future__ import annotations

import ipaddress

MAX_PORT = 65535  # TCP's last port: every port opsctl derives or is given is checked against it


def canonical_address(address: str) -> str:
    """An IP address in its canonical text (compressed IPv6, no brackets); a host name in lowercase."""
    try:
        return str(ipaddress.ip_address(address.strip().removeprefix("[").removesuffix("]")))
    except ValueError:
        return address.strip().lower()


def endpoint(address: str, port: int) -> str:
    """address:port, with the address in brackets when it is IPv6 ([::1]:7000)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def split_endpoint(text: str) -> tuple[str, int] | None:
    """'host:port', '[v6]:port' or 'v6:port' (the last colon separates the port) -> (canonical address, port)."""
    address, _, port = text.strip().rpartition(":")
    if not address or not port.isdigit():
        return None
    return canonical_address(address), int(port)


def same_endpoint(a: str, b: str) -> bool:
    left, right = split_endpoint(a), split_endpoint(b)
    return left is not None and left == right
