"""Addresses and endpoints, written one way: IP addresses compared in their canonical form (::1 and
0:0:0:0:0:0:0:1 are one host), IPv6 endpoints printed with brackets ([::1]:7000). Pure."""

from __future__ import annotations

import ipaddress
import re

from opsctl.base.text import ascii_decimal

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


PORTS = range(1, MAX_PORT + 1)  # a port above MAX_PORT would quietly become another one in a socket call


def valid_port(text: str) -> bool:
    """1..65535 written in ASCII digits: no sign, no blank, no other script's digits."""
    return ascii_decimal(text, 1, MAX_PORT) is not None


def split_endpoint(text: str) -> tuple[str, int] | None:
    """'host:port', '[v6]:port' or 'v6:port' (the last colon separates the port) -> (canonical address, port); None
    for anything else: a host that is no address or name (empty, user@, a blank inside), a port outside 1..65535 or not
    in plain digits."""
    address, _, port = text.strip().rpartition(":")
    if not valid_port(port) or not valid_host(address):
        return None
    return canonical_address(address), int(port)


def valid_host(text: str) -> bool:
    """An IP address (IPv6 with or without brackets) or a DNS name: letters, digits, '.', '-', '_' only (no
    user@, no path, no blank: what would reach a resolver as something else)."""
    try:
        ipaddress.ip_address(text.removeprefix("[").removesuffix("]") if text.startswith("[") else text)
        return True
    except ValueError:
        return bool(_HOST.match(text))


_HOST = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._\-]{0,252}[A-Za-z0-9_])?$")


def same_endpoint(a: str, b: str) -> bool:
    left, right = split_endpoint(a), split_endpoint(b)
    return left is not None and left == right
