"""Raw RESP over authenticated connector sockets, for the audit's scans, restores, slot moves and observation.
RawPipe is one connection; NodePipes keeps a node's connections between round trips. Commands go out pre-packed and
hiredis parses replies from whole reads: redis-py's per-reply path is too slow for a scan of millions of keys.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice

import hiredis

from opsctl.base.errors import NodeRefused, NodeUnreachable, OpsctlError, PipeClosed
from opsctl.net.connector import Connector
from opsctl.net.resp import INCOMPLETE, encode, reader
from opsctl.observe.replies import Arg, Command, Reply, RespError
from opsctl.spec.layout import Node

READ_SIZE = 1 << 20


# What goes wrong on a raw connection, in three words (docs/internals.md, "Connections"): the connection broke
# (NodeUnreachable; PIPE_ERRORS), the node refused a command (NodeRefused), or one reply among others is an error
# (resp.RespError).


# What a raw connection raises when its node is gone, stalls, closes the connection, refuses opsctl's AUTH or the
# TLS handshake, or sends bytes that are not RESP.
# AuthRefused and PipeClosed are NodeUnreachable (opsctl.base.errors), which opsctl.net.connection raises for the
# others: the old name stays while call sites move onto the node handle (issue 34, WP6).
PIPE_ERRORS = (OSError, NodeUnreachable, hiredis.ProtocolError)
RAW_ERRORS = (OSError, hiredis.ProtocolError)  # what the socket and the parser raise themselves

# How a pipe's own failure (one of RAW_ERRORS) is said: the node handle's NodeUnreachable naming the node
# (opsctl.net.connection), or None to raise it as it came (a bare pipe on a scratch server's socket).
Failed = Callable[[BaseException], BaseException] | None


def link_error(exc: BaseException) -> str:
    """Why a pipe failed, as an observation keeps it (the server's words for a refused AUTH, which
    opsctl.base.errors recognises)."""
    if isinstance(exc, NodeUnreachable):
        return exc.why
    if isinstance(exc, OpsctlError):
        return f"{exc.summary}: {exc.detail}" if exc.detail else exc.summary
    return f"{type(exc).__name__}: {exc}"


def refused(reply: Reply, summary: str, hint: str = "") -> Reply:
    """reply, where an error reply raises NodeRefused(summary, its words, hint)."""
    if isinstance(reply, RespError):
        raise NodeRefused(summary, reply.message, hint)
    return reply


def _flat(reply: dict[Reply, Reply] | set[Reply]) -> Reply:
    """A RESP3 map or set (a connection that negotiated RESP3) as the RESP2 reply's flat list."""
    if isinstance(reply, dict):
        return [part for pair in reply.items() for part in pair]
    return list(reply)


class RawPipe:
    """One dedicated connection from the connector (route, AUTH and TLS done), then bytes out and parsed
    replies in. Its caller owns it whole: a scan or a copy that holds per-connection state (SELECT) or runs long."""

    def __init__(self, connector: Connector, node: Node, timeout: float = 30.0, failed: Failed = None) -> None:
        loaded = connector.loaded
        try:
            sock = connector.socket(node, timeout)
        except RAW_ERRORS as exc:
            if failed is None:
                raise
            raise failed(exc) from exc
        self._open(sock, node.name, lambda c: loaded.command_name(node, c), failed)

    @classmethod
    def on_socket(cls, sock: socket.socket, label: str, failed: Failed = None) -> RawPipe:
        """A pipe on a connected socket (a scratch server's, from opsctl.net.connector.unix_socket), commands
        unrenamed."""
        pipe = cls.__new__(cls)
        pipe._open(sock, label, str.upper, failed)
        return pipe

    def _open(self, sock: socket.socket, label: str, rename: Callable[[str], str], failed: Failed) -> None:
        self.label = label
        self._rename = rename
        self._stream = sock
        self._reader = reader()
        self._failed = failed

    # Only the pipe's own calls (opening, send, read) convert its errors: an error raised beside it while its owner
    # holds it (another node's pipe, a file) keeps its own words and node.

    def name(self, command: str) -> bytes:
        """A command under the spec's rename, as bytes."""
        return self._rename(command).encode()

    @contextmanager
    def _own_errors(self) -> Iterator[None]:
        """This pipe's own failures as its handle's error (failed), when it was given one; else as they are."""
        try:
            yield
        except RAW_ERRORS as exc:
            if self._failed is None:
                raise
            raise self._failed(exc) from exc

    def send(self, data: bytes) -> None:
        with self._own_errors():
            self._stream.sendall(data)

    def settimeout(self, seconds: float) -> None:
        """How long one send or read may wait for the node (a silent peer: a split that drops packets)."""
        with self._own_errors():
            self._stream.settimeout(seconds)

    def read(self, count: int) -> list[Reply]:
        with self._own_errors():
            return self._read(count)

    def _read(self, count: int) -> list[Reply]:
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

    def call_all(self, commands: Sequence[Command]) -> list[Reply]:
        """Commands in one round trip (one buffer out), their replies in order; an error reply is a RespError."""
        self.send(b"".join(encode([self.name(name), *args]) for name, *args in commands))
        return self.read(len(commands))

    def ask(self, command: str, *args: Arg) -> Reply:
        """call, where an error reply raises NodeRefused naming the node and the command."""
        words = " ".join(str(a) for a in (command, *args[:1]))
        return refused(self.call(command, *args), f"{self.label} refused {words}")

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> RawPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodePipes:
    """A node's raw connections kept between round trips (the connector's route, AUTH and TLS). Each caller holds
    one alone for its round trip, as many at once as callers, with as many commands in flight as it sends. One goes
    back only whole (every reply read) and idle; a broken one is closed and the next round trip opens another (a
    node that restarted closed it)."""

    def __init__(self, connector: Connector, node: Node, timeout: float, failed: Failed = None) -> None:
        self.connector, self.node, self.timeout, self.failed = connector, node, timeout, failed
        self._idle: list[RawPipe] = []
        self._lock = threading.Lock()
        self._closed = False
        self._names: dict[str, str] = {}  # the renames asked so far: a wave packs ~10k commands of a few names

    def command(self, name: str) -> str:
        """A command's name as this node knows it (the spec's renames)."""
        known = self._names.get(name)
        if known is None:
            known = self._names[name] = self.connector.loaded.command_name(self.node, name)
        return known

    def packed(self, commands: Sequence[Command]) -> bytes:
        """Commands under the node's renames, packed in one buffer."""
        name = self.command
        return b"".join([encode([name(str(c[0])), *c[1:]]) for c in commands])

    def pipeline(self, commands: Sequence[Command], chunk: int = 0, timeout: float | None = None) -> list[Reply]:
        """One round trip: replies in order, error replies as RespError values. chunk > 0 packs and sends that
        many at a time, so the server starts on the first commands while the rest are still being packed;
        timeout: this trip's wait for each reply, when it may be longer than the connection's (a big MIGRATE)."""
        step = chunk or max(1, len(commands))

        def send(pipe: RawPipe) -> None:
            for at in range(0, len(commands), step):
                pipe.send(self.packed(commands[at:at + step]))

        return self.round_trip(send, len(commands), timeout)

    def round_trip(self, send: Callable[[RawPipe], None], count: int, timeout: float | None = None) -> list[Reply]:
        """What send writes, then count replies in order; error replies as RespError values."""
        with self.held() as pipe:
            if timeout is not None:
                pipe.settimeout(timeout)
            send(pipe)
            replies = pipe.read(count)
            if timeout is not None:
                pipe.settimeout(self.timeout)
            return replies

    @contextmanager
    def held(self) -> Iterator[RawPipe]:
        """A connection for this thread alone until the block ends, so writes and reads may interleave (a stream
        that keeps the next commands queued while it reads the replies to the ones before). Raises PIPE_ERRORS (the
        pipe's own, as failed says them)."""
        with self._lock:
            pipe = self._idle.pop() if self._idle else None
        while pipe is not None and not pipe.idle():
            pipe.close()
            with self._lock:
                pipe = self._idle.pop() if self._idle else None
        pipe = pipe or RawPipe(self.connector, self.node, self.timeout, self.failed)
        try:
            yield pipe
        except BaseException:
            pipe.close()
            raise
        with self._lock:
            if self._closed:
                pipe.close()
            else:
                self._idle.append(pipe)

    def close(self) -> None:
        """Close the idle connections; one held now is closed when its round trip ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for pipe in idle:
            pipe.close()
