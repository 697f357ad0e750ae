"""The pure parts of reading a master's replication stream: positions in its history, the commands framed with
their replication offsets, and the journal's text form (docs/internals.md, "The replication stream").

A position is (replid, offset): the master_repl_offset reached after the last byte taken. PSYNC asks for the byte
after it, so a reader that journals a position and dies continues exactly there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from opsctl.base.errors import OpsctlError

REPLID_LENGTH = 40


@dataclass(frozen=True)
class Position:
    """A point in a master's replication history: everything up to offset is taken."""

    replid: str
    offset: int

    def to_json(self) -> dict[str, str | int]:
        return {"replid": self.replid, "offset": self.offset}


@dataclass(frozen=True)
class Entry:
    """One command of the stream; end is the replication offset just after its bytes, arrived when they were read
    (time.time())."""

    args: tuple[bytes, ...]
    end: int
    arrived: float


class StreamProtocolError(OpsctlError):
    """The replication stream held bytes that are not a RESP array of bulk strings."""


MAX_OFFSET = (1 << 63) - 1  # a server's replication offset is a signed 64-bit number


def position_from(data: object, where: str) -> Position:
    """A Position from its JSON form (a journal's), or a StreamProtocolError naming where it came from."""
    if isinstance(data, dict):
        replid, offset = data.get("replid"), data.get("offset")
        if isinstance(replid, str) and len(replid) == REPLID_LENGTH and replid.isascii() and replid.isalnum() \
                and isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= MAX_OFFSET:
            return Position(replid, offset)
    raise StreamProtocolError(f"{where}: not a replication position", json.dumps(data)[:200],
                              "it holds {\"replid\": <40 hex>, \"offset\": <n>}; remove the file to start over")


def psync_args(since: Position | None) -> tuple[bytes, ...]:
    """The PSYNC a reader sends: continue after since, or ask for a full copy."""
    if since is None:
        return (b"PSYNC", b"?", b"-1")
    return (b"PSYNC", since.replid.encode(), str(since.offset + 1).encode())


def parse_psync_reply(line: bytes) -> tuple[str, str, int | None]:
    """("FULLRESYNC", replid, offset) or ("CONTINUE", new replid or "", None) from the status line's words."""
    words = line.decode("ascii", "replace").split()
    if len(words) == 3 and words[0] == "+FULLRESYNC" and words[2].isdigit():
        return "FULLRESYNC", words[1], int(words[2])
    if words and words[0] == "+CONTINUE" and len(words) <= 2:
        return "CONTINUE", words[1] if len(words) == 2 else "", None
    raise StreamProtocolError("the node answered PSYNC with something other than FULLRESYNC or CONTINUE",
                              line[:200].decode("utf-8", "replace"),
                              "is it a Redis/Valkey server that allows opsctl's user to PSYNC?")


def parse_bulk_header(line: bytes) -> tuple[int | None, bytes | None]:
    """An RDB transfer's header: (length, None) for `$<len>`, (None, mark) for the diskless `$EOF:<40 bytes>`."""
    if line.startswith(b"$EOF:") and len(line) == 5 + REPLID_LENGTH:
        return None, line[5:]
    if line.startswith(b"$") and line[1:].isdigit():
        return int(line[1:]), None
    raise StreamProtocolError("the node sent no snapshot header after FULLRESYNC", line[:100].decode("ascii",
                              "replace"), "run the same command again; the node may be restarting")


def frame(buffer: bytes, at: int) -> tuple[list[tuple[tuple[bytes, ...], int]], int]:
    """The whole commands in buffer from at: (each command's arguments and its length in bytes), and where the
    unread rest begins. A command cut off at the end stays for the next read."""
    out: list[tuple[tuple[bytes, ...], int]] = []
    size = len(buffer)
    while at < size:
        start = at
        parsed = _one(buffer, at, size)
        if parsed is None:
            break
        args, at = parsed
        out.append((args, at - start))
    return out, at


def _one(buffer: bytes, at: int, size: int) -> tuple[tuple[bytes, ...], int] | None:
    if buffer[at] != 0x2A:  # '*'
        raise StreamProtocolError("the replication stream is out of step", repr(buffer[at:at + 40]),
                                  "run the same command again: it continues from the journaled offset")
    eol = buffer.find(b"\r\n", at)
    if eol < 0:
        return None
    count = int(buffer[at + 1:eol])
    at = eol + 2
    args: list[bytes] = []
    for _ in range(count):
        eol = buffer.find(b"\r\n", at)
        if eol < 0:
            return None
        if buffer[at] != 0x24:  # '$'
            raise StreamProtocolError("the replication stream holds a non-bulk argument", repr(buffer[at:at + 40]))
        length = int(buffer[at + 1:eol])
        start = eol + 2
        if start + length + 2 > size:
            return None
        args.append(buffer[start:start + length])
        at = start + length + 2
    return tuple(args), at


def is_getack(args: tuple[bytes, ...]) -> bool:
    return len(args) >= 2 and args[0].upper() == b"REPLCONF" and args[1].upper() == b"GETACK"


def is_heartbeat(args: tuple[bytes, ...]) -> bool:
    """PING and REPLCONF from the master: the link's own traffic, nothing to apply."""
    return bool(args) and args[0].upper() in (b"PING", b"REPLCONF")


def gap_reason(since: Position, info: dict[str, str]) -> str:
    """Why a node answered a continuation with a full copy, from its INFO replication taken before PSYNC:
    the history is known but the offset left its backlog, or the replication id is not in its history."""
    replid2 = info.get("master_replid2", "")
    second = int(info.get("second_repl_offset", "-1") or -1)
    if since.replid == info.get("master_replid") or (since.replid == replid2 and since.offset + 1 <= second):
        return "backlog overrun"
    return "history changed"

