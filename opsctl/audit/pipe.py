"""A raw RESP pipe over an Admin-authenticated connection, and a throttle. The only I/O the scan needs.

Commands go out as pre-packed bytes and replies come back through a hiredis reader fed whole reads; redis-py's
per-reply path is too slow for a million keys a few seconds.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from opsctl.admin import Admin
from opsctl.audit.resp import Arg, Reply, encode, reader
from opsctl.errors import OpsctlError

READ_SIZE = 1 << 20


def throttle_delay(started: float, spent: int, rate: float | None, now: float) -> float:
    """Seconds to wait so that `spent` operations since `started` stay within `rate` per second."""
    if not rate:
        return 0.0
    return max(0.0, started + spent / rate - now)


@dataclass
class Throttle:
    rate: float | None
    started: float = field(default_factory=time.monotonic)
    spent: int = 0

    def spend(self, ops: int) -> None:
        self.spent += ops
        delay = throttle_delay(self.started, self.spent, self.rate, time.monotonic())
        if delay > 0:
            time.sleep(delay)


def _flat(reply: dict[Reply, Reply] | set[Reply]) -> Reply:
    """A RESP3 map or set (a connection that negotiated RESP3) as the RESP2 reply's flat list."""
    if isinstance(reply, dict):
        return [part for pair in reply.items() for part in pair]
    return list(reply)


class RawPipe:
    """One dedicated connection (auth done by redis-py), then bytes out and parsed replies in."""

    def __init__(self, admin: Admin, timeout: float = 30.0) -> None:
        self._open(admin.client, admin.name, admin.command, timeout)

    @classmethod
    def on_client(cls, client: redis.Redis, label: str, timeout: float = 30.0) -> RawPipe:
        """A pipe on a connection of any client (a scratch server's unix socket), commands unrenamed."""
        pipe = cls.__new__(cls)
        pipe._open(client, label, str.upper, timeout)
        return pipe

    def _open(self, client: redis.Redis, label: str, rename: Callable[[str], str], timeout: float) -> None:
        self.label = label
        self._rename = rename
        self._conn = client.connection_pool.make_connection()
        self._conn.connect()
        sock = getattr(self._conn, "_sock", None)
        if not isinstance(sock, socket.socket):
            raise OpsctlError(f"no socket to {label}", hint="is the node reachable?")
        sock.settimeout(timeout)
        self._sock = sock
        self._reader = reader()

    def name(self, command: str) -> bytes:
        """A command under the spec's rename, as bytes."""
        return self._rename(command).encode()

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def read(self, count: int) -> list[Reply]:
        out: list[Reply] = []
        gets = self._reader.gets
        while len(out) < count:
            reply = gets()
            if reply is not False:
                out.append(_flat(reply) if isinstance(reply, dict | set) else reply)
                continue
            chunk = self._sock.recv(READ_SIZE)
            if not chunk:
                raise OpsctlError(f"{self.label} closed the connection mid-scan")
            self._reader.feed(chunk)
        return out

    def call(self, command: str, *args: Arg) -> Reply:
        self.send(encode([self.name(command), *args]))
        return self.read(1)[0]

    def close(self) -> None:
        self._conn.disconnect()

    def __enter__(self) -> RawPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
