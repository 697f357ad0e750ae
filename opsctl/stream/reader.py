"""The one replication-stream reader: attach to a node as a replica would (PSYNC), keep its snapshot in a file,
then hand over the commands with their replication offsets (docs/internals.md, "The replication stream").

Shared by live migration and point-in-time recovery; the contract is /tmp/h/stream-api.md's, kept in
docs/internals.md. The socket comes from the connector (route, AUTH, TLS); the bytes are framed by the pure
opsctl.stream.framing.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Protocol

from opsctl.base.errors import EXIT_REFUSED, OpsctlError, PipeClosed
from opsctl.base.stop import Stopped
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.resp import encode
from opsctl.observe.replies import parse_info
from opsctl.spec.layout import Node
from opsctl.state.safefs import disk_full, open_dir
from opsctl.stream.framing import (
    Entry,
    Position,
    StreamProtocolError,
    frame,
    gap_reason,
    is_getack,
    parse_bulk_header,
    parse_psync_reply,
    psync_args,
)

READ_SIZE = 1 << 20
ACK_EVERY = 1.0  # a replica acknowledges every second; a master counts a silent one as lagging (min-replicas-max-lag)
# a master PINGs its replicas every repl-ping-replica-period (10 s by default): a link silent for three periods is
# gone (a split drops packets silently: without this the reader waited on a dead link for TCP's ~15 minutes)
SILENT_AFTER = 30.0
PING_PERIOD = "repl-ping-replica-period"


class Writable(Protocol):
    """Where a snapshot's bytes go, in order: a file, or a writer that also hashes them."""

    def write(self, data: bytes, /) -> object: ...


def _no_tick() -> None:
    return None


class StreamGap(OpsctlError):
    """Asked to continue from a position the node no longer serves: it answered FULLRESYNC. reason is "backlog
    overrun" (the offset left its backlog) or "history changed" (the replication id is unknown to it)."""

    exit_code = EXIT_REFUSED

    def __init__(self, node: str, since: Position, reason: str) -> None:
        super().__init__(f"{node} cannot continue the replication stream at offset {since.offset}: {reason}",
                         f"asked for {since.replid} {since.offset + 1}; the node offered a full copy instead",
                         "must start over: remove the journal and run again (a larger repl-backlog-size keeps "
                         "more history)" if reason == "backlog overrun" else
                         "the node's history does not hold that replication id: start over from a full copy")
        self.reason = reason
        self.since = since


class Stream:
    """An attached replication link. full: whether a snapshot came; start: where its stream begins; position:
    after the last Entry handed over. Not thread-safe: one reader at a time."""

    def __init__(self, sock: socket.socket, label: str, tick: Callable[[], None] = _no_tick) -> None:
        self._link = sock
        self.label = label
        self._tick = tick  # before each receive: the caller's stop check and deadline (raises to give up)
        self._buffer = b""
        self.full = False
        self.start = Position("", 0)
        self.position = self.start
        self._acked = 0
        self._ack_sent = 0.0
        self.silent_after = SILENT_AFTER
        self._heard = time.monotonic()  # when the node last sent a byte

    # -- the handshake -------------------------------------------------------------------------------------------

    def _line(self) -> bytes:
        """The next CRLF line, skipping the bare newlines a master sends while it prepares a snapshot."""
        while True:
            eol = self._buffer.find(b"\n")
            if eol >= 0:
                line, self._buffer = self._buffer[:eol].rstrip(b"\r"), self._buffer[eol + 1:]
                if line:
                    return line
                continue
            self._fill()

    def _fill(self) -> None:
        self._tick()
        chunk = self._link.recv(READ_SIZE)
        if not chunk:
            raise PipeClosed(f"{self.label} closed the replication link", "the node stopped, restarted or dropped "
                             "a replica that fell behind (client-output-buffer-limit replica)",
                             "run the same command again: it continues from the journaled position")
        self._buffer += chunk
        self._heard = time.monotonic()

    def _ask(self, *args: bytes) -> bytes:
        self._link.sendall(encode(list(args)))
        line = self._line()
        if line.startswith(b"-"):
            raise OpsctlError(f"{self.label} refused {args[0].decode()} {args[1].decode() if len(args) > 1 else ''}",
                              line[1:200].decode("utf-8", "replace"),
                              "opsctl's user needs PSYNC and REPLCONF (ACL +psync +replconf, or +@all)")
        return line

    def _info(self) -> dict[str, str]:
        self._link.sendall(encode([b"INFO", b"replication"]))
        header = self._line()
        length, _ = parse_bulk_header(header) if header.startswith(b"$") else (None, None)
        if length is None:
            raise StreamProtocolError(f"{self.label} answered INFO oddly", header[:200].decode("utf-8", "replace"))
        while len(self._buffer) < length + 2:
            self._fill()
        text, self._buffer = self._buffer[:length], self._buffer[length + 2:]
        return parse_info(text.decode("utf-8", "replace"))

    def handshake(self, since: Position | None, rdb_to: Path) -> None:
        info = self._info()
        self._ask(b"REPLCONF", b"listening-port", b"0")
        self._ask(b"REPLCONF", b"capa", b"eof", b"capa", b"psync2")
        kind, replid, offset = parse_psync_reply(self._ask(*psync_args(since)))
        if kind == "CONTINUE":
            assert since is not None
            self.start = Position(replid or since.replid, since.offset)
        elif since is not None:
            raise StreamGap(self.label, since, gap_reason(since, info))
        else:
            assert offset is not None
            self._receive_rdb(rdb_to)
            self.full = True
            self.start = Position(replid, offset)
        self.position = self.start
        self.ack(self.start.offset)

    def snapshot(self, out: Writable, diskless: bool) -> Position:
        """Only a snapshot: REPLCONF rdb-only (the node forks, sends its RDB and lets the link go, keeping no
        backlog for it; a server without the option sends its stream on, and the caller closes), then PSYNC ? -1.
        The RDB's bytes go to out; its position (the node's history and offset at the fork) is returned.
        diskless=False leaves out `capa eof`: the node saves to its disk and sends the file, at once even where
        repl-diskless-sync-delay holds diskless copies back to wait for more replicas."""
        self._ask(b"REPLCONF", *((b"capa", b"eof") if diskless else ()), b"capa", b"psync2")
        with suppress(OpsctlError):
            self._ask(b"REPLCONF", b"rdb-only", b"1")
        kind, replid, offset = parse_psync_reply(self._ask(*psync_args(None)))
        if kind != "FULLRESYNC" or offset is None:
            raise StreamProtocolError(f"{self.label} answered a full-copy request with {kind}",
                                      hint="run the same command again")
        self._copy_rdb(out)
        return Position(replid, offset)

    def _receive_rdb(self, rdb_to: Path) -> None:
        """The snapshot into rdb_to: a new private temp file in its folder, fsynced, renamed over it; on any failure
        the temp file is gone (no half snapshot is left behind)."""
        with _private_file(rdb_to) as out:
            self._copy_rdb(out)

    def _copy_rdb(self, out: Writable) -> None:
        length, mark = parse_bulk_header(self._line())
        if length is not None:
            self._copy_counted(out, length)
        else:
            assert mark is not None
            self._copy_marked(out, mark)

    def _copy_counted(self, out: Writable, length: int) -> None:
        left = length
        while left > 0:
            if not self._buffer:
                self._fill()
            piece, self._buffer = self._buffer[:left], self._buffer[left:]
            out.write(piece)
            left -= len(piece)

    def _copy_marked(self, out: Writable, mark: bytes) -> None:
        """Diskless form: the data ends with the 40-byte mark; hold back the last 40 bytes until more comes."""
        keep = len(mark)
        while True:
            found = self._buffer.find(mark)
            if found >= 0:
                out.write(self._buffer[:found])
                self._buffer = self._buffer[found + keep:]
                return
            if len(self._buffer) > keep:
                out.write(self._buffer[:-keep])
                self._buffer = self._buffer[-keep:]
            self._fill()

    # -- the stream ----------------------------------------------------------------------------------------------

    def read(self, timeout: float) -> list[Entry]:
        """The whole commands that arrived within timeout, in order (possibly none). PING and REPLCONF GETACK are
        handed over too; GETACK is answered here with the acknowledged offset, and an ACK goes out every second."""
        framed, used = frame(self._buffer, 0)  # framed once: a stream of 10k writes/s parses 10k commands a second
        if not framed:
            self._link.settimeout(timeout)
            with suppress(TimeoutError):
                self._fill()
            self._check_heard()
            framed, used = frame(self._buffer, 0)
        self._buffer = self._buffer[used:]
        now = time.time()
        offset = self.position.offset
        entries: list[Entry] = []
        for args, length in framed:
            offset += length
            entries.append(Entry(args, offset, now))
        if entries:
            self.position = Position(self.position.replid, offset)
        if any(is_getack(e.args) for e in entries) or time.monotonic() - self._ack_sent >= ACK_EVERY:
            self._send_ack()
        return entries

    def _check_heard(self) -> None:
        silent = time.monotonic() - self._heard
        if silent > self.silent_after:
            raise PipeClosed(f"{self.label} sent nothing on the replication link for {silent:.0f}s",
                             "a master pings its replicas every repl-ping-replica-period (10 s by default): the node "
                             "or the network to it is gone (a split drops packets without a word)",
                             "attached again once it answers; run the same command again if it stopped")

    def ack(self, offset: int) -> None:
        """REPLCONF ACK offset: the caller made everything up to offset durable."""
        self._acked = max(self._acked, offset)
        self._send_ack()

    def _send_ack(self) -> None:
        self._link.sendall(encode([b"REPLCONF", b"ACK", str(self._acked).encode()]))
        self._ack_sent = time.monotonic()

    def close(self) -> None:
        self._link.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stream(connector: Connector, node: Node, *, since: Position | None, rdb_to: Path,
                timeout: float) -> Stream:
    """Attach to node as a replica: continue after since (StreamGap when it cannot), or, without since, take a
    full copy into rdb_to. The stream is ready to read when this returns."""
    silent_after = silence_limit(connector, node, timeout)
    sock = connector.socket(node, timeout)
    stream = Stream(sock, node.name)
    stream.silent_after = silent_after
    try:
        sock.settimeout(timeout)
        stream.handshake(since, rdb_to)
    except BaseException:
        stream.close()
        raise
    return stream


def silence_limit(connector: Connector, node: Node, timeout: float) -> float:
    """How long node's link may stay silent before it counts as lost: three of its PINGs (its
    repl-ping-replica-period, where its CONFIG answers), SILENT_AFTER at least. Why: a primary set to ping every
    60 s would otherwise lose an idle link every 30 s."""
    try:
        with connection_to(connector, node, timeout) as handle:
            period = handle.config_get(PING_PERIOD).get(PING_PERIOD, "")
    except Stopped:
        raise  # a stop request, not a refused CONFIG
    except OpsctlError:
        return SILENT_AFTER  # CONFIG refused (a user without it) or renamed away: the default period
    return max(SILENT_AFTER, 3 * int(period)) if period.isdigit() else SILENT_AFTER


def copy_snapshot(connector: Connector, node: Node, out: Writable, *, diskless: bool, timeout: float,
                  tick: Callable[[], None]) -> Position:
    """node's data as one RDB written to out, the way a replica receives its first copy (Stream.snapshot); the
    node forks for it, nothing else. tick runs before each receive (at least once a second: a node preparing a
    copy sends a newline every second); timeout bounds each receive."""
    with Stream(connector.socket(node, timeout), node.name, tick) as stream:
        return stream.snapshot(out, diskless)


@contextmanager
def _private_file(path: Path) -> Iterator[BinaryIO]:
    """A new 0600 file at path, written whole or not at all (temp name, fsync, rename; removed on failure)."""
    with open_dir(path.parent) as folder:
        tmp = f".{path.name}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
            os.fsync(folder)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            if (problem := disk_full(path, exc, None)) is not None:
                raise problem from None
            raise
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
