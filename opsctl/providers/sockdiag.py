"""Which sockets listen on a TCP port, asked of the kernel through sock_diag netlink (as `ss -ltn 'sport = :P'` does).
The kernel walks only that port's listening sockets, so the cost does not grow with the machine's connections, as
reading /proc/net/tcp does. Linux only; None when the kernel does not answer, so callers fall back to /proc."""

from __future__ import annotations

import ipaddress
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, extensions, pad, states
SOCKID = struct.Struct("!HH16s16s")  # inet_diag_sockid: ports and addresses in network order, then if + cookie
MESSAGE = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retransmits, then the sockid
SOCKID_SIZE = SOCKID.size + 12  # idiag_if (u32) and idiag_cookie (2 x u32), host order
TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode


def request(family: int, port: int, sequence: int = 1) -> bytes:
    """A dump request for the listening TCP sockets of `family` on `port`. Pure."""
    body = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    body += SOCKID.pack(port, 0, b"", b"") + bytes(12)
    return HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0) + body


def parse_replies(data: bytes) -> tuple[list[tuple[bytes, int, int]], bool]:
    """(local address bytes, local port, socket inode) per listening socket in a chunk of netlink replies, and
    whether the dump is complete. Pure. ValueError for an error reply or a short message."""
    found: list[tuple[bytes, int, int]] = []
    at = 0
    while at + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, at)
        if length < HEADER.size or at + length > len(data):
            raise ValueError(f"truncated netlink message ({length} bytes at {at})")
        if kind == NLMSG_DONE:
            return found, True
        if kind == NLMSG_ERROR:
            raise ValueError("the kernel refused the sock_diag request")
        if kind == SOCK_DIAG_BY_FAMILY:
            body = at + HEADER.size
            if length < HEADER.size + MESSAGE.size + SOCKID_SIZE + TAIL.size:
                raise ValueError(f"short sock_diag message ({length} bytes)")
            family = data[body]
            sport, _, source, _ = SOCKID.unpack_from(data, body + MESSAGE.size)
            inode = TAIL.unpack_from(data, body + MESSAGE.size + SOCKID_SIZE)[4]
            found.append((source[:4] if family == socket.AF_INET else source, sport, inode))
        at += (length + 3) & ~3  # NLMSG_ALIGN
    return found, False


def listening_inodes(address: str, port: int, timeout: float = 1.0) -> set[str] | None:
    """Inodes of the sockets listening on address:port or on the wildcard address of its family; None when
    sock_diag is not available (not Linux, a sandbox that forbids it, an odd reply)."""
    ip = ipaddress.ip_address(address.strip("[]"))
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    wanted = {ip.packed, bytes(len(ip.packed))}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(timeout)
            sock.sendall(request(family, port))
            inodes: set[str] = set()
            done = False
            while not done:
                found, done = parse_replies(sock.recv(65536))
                inodes |= {str(inode) for source, sport, inode in found if sport == port and source in wanted}
            return inodes
    except (OSError, ValueError, AttributeError):  # AttributeError: no AF_NETLINK on this platform
        return None
