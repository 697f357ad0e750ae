"""RESP2 encoding and decoding for deep pipelines, plus the cluster hash slot of a key. Pure.

redis-py spends microseconds per reply; a scan of a million keys needs a parser that takes a whole buffer
of replies at once. Keys stay bytes: they may hold any byte, including the ones the lint looks for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

Arg: TypeAlias = "bytes | str | int"


@dataclass(frozen=True)
class RespError:
    message: str


Reply: TypeAlias = "bytes | int | list[Reply] | RespError | None"


class Incomplete(Exception):
    """The buffer ends inside a reply: read more bytes."""


def _arg(value: Arg) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def encode(args: Sequence[Arg]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        data = _arg(a)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def encode_keyed(command: bytes, keys: Iterable[bytes]) -> bytes:
    """The same one-key command for many keys (`STRLEN k1`, `STRLEN k2`, ...), packed in one buffer."""
    head = b"*2\r\n$%d\r\n%s\r\n" % (len(command), command)
    return b"".join(b"%s$%d\r\n%s\r\n" % (head, len(k), k) for k in keys)


def parse_one(buf: bytes, pos: int) -> tuple[Reply, int]:
    """The reply starting at pos and the position after it; raises Incomplete when the buffer is short.

    RESP2, plus the RESP3 types a HELLO 3 connection may send (maps come back as flat lists)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line = buf[pos:pos + 1], buf[pos + 1:end]
    if kind == b":":
        return int(line), end + 2
    if kind in (b"$", b"=", b"!"):
        size = int(line)
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            raise Incomplete
        start = end + 2 + (4 if kind == b"=" else 0)  # RESP3 verbatim strings start with "txt:"
        if kind == b"!":
            return RespError(buf[start:stop].decode("utf-8", "replace")), stop + 2
        return buf[start:stop], stop + 2
    if kind in (b"*", b"~", b">", b"%"):
        count = int(line) * (2 if kind == b"%" else 1)  # a RESP3 map comes back as a flat list
        if count < 0:
            return None, end + 2
        fast = _bulks(buf, end + 2, count) if count > 8 else None
        if fast is not None:
            return fast
        items: list[Reply] = []
        pos = end + 2
        for _ in range(count):
            item, pos = parse_one(buf, pos)
            items.append(item)
        return items, pos
    return _resp3_scalar(kind, line, end, pos)


def _resp3_scalar(kind: bytes, line: bytes, end: int, pos: int) -> tuple[Reply, int]:
    if kind == b"_":
        return None, end + 2
    if kind == b"#":
        return int(line == b"t"), end + 2
    if kind in (b",", b"("):
        return line, end + 2
    if kind == b"+":
        return line, end + 2
    if kind == b"-":
        return RespError(line.decode("utf-8", "replace")), end + 2
    raise ValueError(f"not a RESP reply at byte {pos}: {kind!r}{line[:20]!r}")


def _bulks(buf: bytes, pos: int, count: int) -> tuple[Reply, int] | None:
    """Fast path for an array of bulk strings (a SCAN page): split on CR LF and check every length.
    None when it does not apply (a nil, a nested reply, CR LF inside a key, too few bytes): parse generically."""
    parts = buf[pos:].split(b"\r\n", 2 * count)
    if len(parts) <= 2 * count:
        return None
    heads, items = parts[0:2 * count:2], parts[1:2 * count:2]
    try:
        sizes = [int(h[1:]) if h[:1] == b"$" else -1 for h in heads]
    except ValueError:
        return None
    if sizes != list(map(len, items)):
        return None
    used = sum(sizes) + sum(map(len, heads)) + 4 * count
    return list(items), pos + used


def _ints(buf: bytes, count: int) -> tuple[list[Reply], int] | None:
    """Fast path for a run of integer replies (sizes, PEXPIRETIME): one split instead of a call per reply."""
    parts = buf.split(b"\r\n", count)
    lines = parts[:count] if len(parts) > count else parts[:-1]
    if not lines or not all(line[:1] == b":" for line in lines):
        return None
    return [int(line[1:]) for line in lines], sum(map(len, lines)) + 2 * len(lines)


def parse_many(buf: bytes, count: int) -> tuple[list[Reply], int]:
    """Up to count complete replies from the start of buf, and how many bytes they took."""
    if buf[:1] == b":":
        fast = _ints(buf, count)
        if fast is not None:
            return fast
    replies: list[Reply] = []
    pos = 0
    while len(replies) < count:
        try:
            reply, after = parse_one(buf, pos)
        except Incomplete:
            break
        replies.append(reply)
        pos = after
    return replies, pos


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-XMODEM, as Redis Cluster uses it ("123456789" -> 0x31C3)."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def hash_tag(key: bytes) -> bytes:
    """The part of the key that is hashed: the first {...} with at least one byte inside, else the whole key."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def key_slot(key: bytes) -> int:
    return crc16(hash_tag(key)) % 16384
