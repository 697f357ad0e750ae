"""A raw RESP pipe over an authenticated connector socket: how audit scans, restores and observation talk to
nodes without redis-py.

Commands go out as pre-packed bytes and replies come back through a hiredis reader fed whole reads; redis-py's
per-reply path is too slow for a million keys a few seconds, and importing it costs every `plan` and `status`
more than their whole look at the nodes.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from itertools import islice

import hiredis

from opsctl.base.errors import OpsctlError
from opsctl.net.connector import AuthRefused, Connector
from opsctl.net.resp import INCOMPLETE, Arg, Reply, RespError, encode, reader
from opsctl.spec.layout import Node

READ_SIZE = 1 << 20


class PipeClosed(OpsctlError):
    """The node closed the connection while replies were due."""


class NodeRefused(OpsctlError):
    """A node answered a command with an error reply (a rename the spec does not know, an ACL, a disabled
    command)."""


# What a pipe raises when its node is gone, stalls, closes the connection, refuses opsctl's AUTH or the TLS
# handshake, or sends bytes that are not RESP.
PIPE_ERRORS = (OSError, AuthRefused, PipeClosed, hiredis.ProtocolError)


def link_error(exc: BaseException) -> str:
    """Why a pipe failed, as an observation keeps it (the server's words for a refused AUTH, which
    opsctl.base.connerr recognises)."""
    if isinstance(exc, OpsctlError):
        return f"{exc.summary}: {exc.detail}" if exc.detail else exc.summary
    return f"{type(exc).__name__}: {exc}"


def _flat(reply: dict[Reply, Reply] | set[Reply]) -> Reply:
    """A RESP3 map or set (a connection that negotiated RESP3) as the RESP2 reply's flat list."""
    if isinstance(reply, dict):
        return [part for pair in reply.items() for part in pair]
    return list(reply)


class RawPipe:
    """One dedicated connection from the connector (route, AUTH and TLS done), then bytes out and parsed
    replies in."""

    def __init__(self, connector: Connector, node: Node, timeout: float = 30.0) -> None:
        loaded = connector.loaded
        self._open(connector.socket(node, timeout), node.name, lambda c: loaded.command_name(node, c))

    @classmethod
    def on_socket(cls, sock: socket.socket, label: str) -> RawPipe:
        """A pipe on a connected socket (a scratch server's, from opsctl.net.connector.unix_socket), commands
        unrenamed."""
        pipe = cls.__new__(cls)
        pipe._open(sock, label, str.upper)
        return pipe

    def _open(self, sock: socket.socket, label: str, rename: Callable[[str], str]) -> None:
        self.label = label
        self._rename = rename
        self._stream = sock
        self._reader = reader()

    def name(self, command: str) -> bytes:
        """A command under the spec's rename, as bytes."""
        return self._rename(command).encode()

    def send(self, data: bytes) -> None:
        self._stream.sendall(data)

    def read(self, count: int) -> list[Reply]:
        out: list[Reply] = []
        gets = self._reader.gets
        while True:
            # the replies already whole, taken in C: a scan reads a million, one Python step each was a third of
            # its CPU
            out += islice(iter(gets, INCOMPLETE), count - len(out))
            if len(out) >= count:
                break
            chunk = self._stream.recv(READ_SIZE)
            if not chunk:
                raise PipeClosed(f"{self.label} closed the connection", "the node stopped or restarted mid-way",
                                 "`opsctl status -f SPEC` shows it; once it answers, run the same command again")
            self._reader.feed(chunk)
        kinds = set(map(type, out))
        if dict in kinds or set in kinds:
            return [_flat(r) if isinstance(r, dict | set) else r for r in out]
        return out

    def idle(self) -> bool:
        """Open, with nothing unread: a node that closed the connection (a restart) makes it readable."""
        readable, _, _ = select.select([self._stream], [], [], 0)
        return not readable

    def call(self, command: str, *args: Arg) -> Reply:
        self.send(encode([self.name(command), *args]))
        return self.read(1)[0]

    def ask(self, command: str, *args: Arg) -> Reply:
        """call, where an error reply raises NodeRefused naming the node and the command."""
        reply = self.call(command, *args)
        if isinstance(reply, RespError):
            words = " ".join(str(a) for a in (command, *args[:1]))
            raise NodeRefused(f"{self.label} refused {words}", reply.message)
        return reply

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> RawPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
