"""An RDB file read without loading it into a server. From its head: db 0's key counts (RESIZEDB, exact at the fork,
when db 0 comes first) and the replication position the saving server wrote (aux repl-id/repl-offset); None when the
head does not say. From the whole file: every key's RESTORE payload, byte for byte what DUMP gives (split_keys).
Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from mmap import mmap
from typing import NamedTuple, TypeVar

import crcmod  # crcmod-plus: its C extension, about 0.2 us a key

Buffer = bytes | mmap  # a file read whole, or mapped
T = TypeVar("T")

AUX, FUNCTION2, SELECTDB, RESIZEDB, EOF = 0xFA, 0xF5, 0xFE, 0xFB, 0xFF
MAGIC_SIZE = 9


class _Short(Exception):
    """The head ends before the answer: read more, or load the file."""


class _Head:
    """A cursor over a file's first bytes, each step one of split_keys' readers below; a step past the bytes at
    hand (or an encoding they do not know) is _Short."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, MAGIC_SIZE

    def _step(self, read: Callable[[bytes, int], tuple[T, int]]) -> T:
        try:
            value, after = read(self.data, self.pos)
        except (IndexError, Unsplittable):
            raise _Short from None
        if after > len(self.data):
            raise _Short
        self.pos = after
        return value

    def byte(self) -> int:
        return self._step(lambda data, at: (data[at], at + 1))

    def length(self) -> int:
        return self._step(_length)

    def string(self) -> bytes:
        return self._step(_string)

    def skip_string(self) -> None:
        self._step(lambda data, at: (None, _past_string(data, at)))


def db0_counts(head: bytes) -> tuple[int, int] | None:
    """(keys, keys with a TTL) of db 0 from the file's first bytes; (0, 0) for a file without keys; None when
    the head does not say (another database first, an opcode this does not know, too few bytes)."""
    reader = _Head(head)
    try:
        while True:
            op = reader.byte()
            if op == AUX:
                reader.skip_string()
                reader.skip_string()
            elif op == FUNCTION2:
                reader.skip_string()
            elif op == EOF:
                return 0, 0
            elif op == SELECTDB:
                if reader.length() != 0:
                    return None
            elif op == RESIZEDB:
                return reader.length(), reader.length()
            else:
                return None
    except _Short:
        return None


def repl_position(head: bytes) -> tuple[str, int] | None:
    """(replication id, offset) a server wrote in the file's aux fields: the exact point of its history the file
    holds (a master with a backlog, or a replica, writes them on BGSAVE); None when the head does not say."""
    reader, found = _Head(head), {}
    try:
        while reader.byte() == AUX:
            key = reader.string()
            found[key] = reader.string()
    except _Short:
        return None
    replid, offset = found.get(b"repl-id", b""), found.get(b"repl-offset", b"")
    if len(replid) != 40 or not offset.isdigit():
        return None
    return replid.decode("ascii", "replace"), int(offset)


# --- every key, as DUMP would give it -----------------------------------------------------------------------------
# A value in an RDB file is the bytes rdbSaveObject wrote, and DUMP is those same bytes of the same object after its
# type byte, then the RDB version (2 bytes LE) and a CRC-64 (Jones, reflected; 8 bytes LE) of all before it. So a
# key's RESTORE payload is a slice of the file plus a footer: no server has to load the file to produce it. The
# splitter walks each value only far enough to find where it ends, and refuses (Unsplittable) what it does not know,
# so the caller can take the scratch server's way instead: a module's value, a type or opcode newer than this code.

EXPIRETIME_MS, EXPIRETIME, IDLE, FREQ = 0xFC, 0xFD, 0xF8, 0xF9
STRING, LIST, SET, ZSET, HASH, ZSET_2 = 0, 1, 2, 3, 4, 5
QUICKLIST, STREAM_1, QUICKLIST_2, STREAM_2, STREAM_3, HASH_2 = 14, 15, 18, 19, 21, 22
ONE_STRING = frozenset({9, 10, 11, 12, 13, 16, 17, 20})  # zipmap, ziplists, intset, listpacks: one blob each
STREAM_ID = 16  # bytes of a raw stream id (ms and seq, 64 bits each)
TYPE_BYTES = [bytes((kind,)) for kind in range(256)]
LZF = 0xC3  # a string's special encoding 3: compressed length, length, then the compressed bytes
# DUMP's checksum: CRC-64 with the Jones polynomial, reflected, no final xor (the servers' crc64.c)
crc64: Callable[[bytes], int] = crcmod.mkCrcFun(0x1AD93D23594C935A9, initCrc=0, rev=True, xorOut=0)


class Unsplittable(Exception):
    """A record the splitter does not know how to walk (a module's value, a newer type or opcode), or a file that
    ends inside a record: the copy loads the file into a scratch server instead."""


class KeyRecord(NamedTuple):
    """One key as a copy moves it: read from a source (DUMP) or cut from its RDB file (a tuple: a copy makes one per
    key, a frozen dataclass costs three times as much to build)."""

    db: int
    key: bytes
    payload: bytes  # RESTORE's: DUMP's bytes
    expires: float  # unix ms in our clock, 0 = none


def _length(data: Buffer, at: int) -> tuple[int, int]:
    """(length, the position after it) of a plain length (not a string's special encoding)."""
    first = data[at]
    kind = first >> 6
    if kind == 0:
        return first & 0x3F, at + 1
    if kind == 1:
        return ((first & 0x3F) << 8) | data[at + 1], at + 2
    if first == 0x80:
        return int.from_bytes(data[at + 1:at + 5], "big"), at + 5
    if first == 0x81:
        return int.from_bytes(data[at + 1:at + 9], "big"), at + 9
    raise Unsplittable(f"a length encoded as {first:#04x} at byte {at}")


def _past_string(data: Buffer, at: int) -> int:
    """The position after the string at: raw, an 8/16/32-bit integer, or LZF (compressed length, length, bytes)."""
    first = data[at]
    kind = first >> 6
    if kind == 0:
        return at + 1 + (first & 0x3F)
    if kind == 1:
        return at + 2 + (((first & 0x3F) << 8) | data[at + 1])
    if kind == 2:
        size, at = _length(data, at)
        return at + size
    special = first & 0x3F
    if special < 3:
        return at + 2 + (1 << special) - 1
    if special == 3:
        compressed, after = _length(data, at + 1)
        _, after = _length(data, after)
        return after + compressed
    raise Unsplittable(f"a string encoded as {first:#04x} at byte {at}")


def _string(data: Buffer, at: int) -> tuple[bytes, int]:
    """(the string's bytes, the position after it): a key's name, decoded as the server reads it."""
    first = data[at]
    if first < 0x40:
        end = at + 1 + first
        return bytes(data[at + 1:end]), end
    if first >> 6 != 3:
        size, start = _length(data, at)
        return bytes(data[start:start + size]), start + size
    special = first & 0x3F
    if special < 3:
        width = 1 << special
        return str(int.from_bytes(data[at + 1:at + 1 + width], "little", signed=True)).encode(), at + 1 + width
    compressed, after = _length(data, at + 1)
    size, after = _length(data, after)
    return lzf_decompress(bytes(data[after:after + compressed]), size), after + compressed


def lzf_decompress(data: bytes, size: int) -> bytes:
    """liblzf's format: a control byte below 32 starts a literal run of control+1 bytes; above, a back reference
    of (control >> 5) + 2 bytes (7: one more length byte) at offset ((control & 31) << 8 | next byte) + 1 back."""
    out = bytearray()
    at = 0
    while at < len(data):
        control = data[at]
        at += 1
        if control < 32:
            out += data[at:at + control + 1]
            at += control + 1
            continue
        length = control >> 5
        if length == 7:
            length += data[at]
            at += 1
        start = len(out) - ((control & 0x1F) << 8) - data[at] - 1
        at += 1
        if start < 0:
            raise Unsplittable("an LZF string refers before its start")
        for i in range(length + 2):  # may overlap what it writes: byte by byte
            out.append(out[start + i])
    if len(out) != size:
        raise Unsplittable(f"an LZF string of {len(out)} bytes, not the {size} its header says")
    return bytes(out)


def _past_value(data: Buffer, kind: int, at: int) -> int:
    """The position after the value of type kind that starts at at."""
    if kind == STRING or kind in ONE_STRING:
        return _past_string(data, at)
    if kind in (LIST, SET, QUICKLIST):
        count, at = _length(data, at)
        for _ in range(count):
            at = _past_string(data, at)
        return at
    if kind == QUICKLIST_2:
        count, at = _length(data, at)
        for _ in range(count):
            _, at = _length(data, at)  # the node's container (plain or packed)
            at = _past_string(data, at)
        return at
    if kind == HASH:
        count, at = _length(data, at)
        for _ in range(2 * count):
            at = _past_string(data, at)
        return at
    if kind == HASH_2:  # Valkey 9's hash with field TTLs: field, value, expiry (8 bytes, ms; -1: none)
        count, at = _length(data, at)
        for _ in range(count):
            at = _past_string(data, _past_string(data, at)) + 8
        return at
    if kind == ZSET_2:
        count, at = _length(data, at)
        for _ in range(count):
            at = _past_string(data, at) + 8  # the score: a binary double
        return at
    if kind == ZSET:
        count, at = _length(data, at)
        for _ in range(count):
            at = _past_string(data, at)
            first = data[at]
            at += 1 if first >= 253 else 1 + first  # the score as text: 253-255 are nan, +inf, -inf
        return at
    if kind in (STREAM_1, STREAM_2, STREAM_3):
        return _past_stream(data, kind, at)
    raise Unsplittable(f"a value of RDB type {kind} (a module's, or a type newer than this code)")


def _past_stream(data: Buffer, kind: int, at: int) -> int:
    """A stream: its listpacks (node id, listpack), length, last id; from type 19 on its first id, max deleted id
    and entries added; its consumer groups with their pending entries and consumers (type 21: their active time)."""
    nodes, at = _length(data, at)
    for _ in range(2 * nodes):
        at = _past_string(data, at)
    for _ in range(3 if kind == STREAM_1 else 8):
        _, at = _length(data, at)
    groups, at = _length(data, at)
    for _ in range(groups):
        at = _past_string(data, at)
        for _ in range(2 if kind == STREAM_1 else 3):  # last id (ms, seq), from type 19 on entries read
            _, at = _length(data, at)
        pending, at = _length(data, at)
        for _ in range(pending):
            _, at = _length(data, at + STREAM_ID + 8)  # id, delivery time, delivery count
        consumers, at = _length(data, at)
        for _ in range(consumers):
            at = _past_string(data, at) + (16 if kind == STREAM_3 else 8)  # seen time (type 21: and active time)
            owned, at = _length(data, at)
            at += owned * STREAM_ID
    return at


def split_keys(data: Buffer, version: int, *, page: int = 1000, shift_ms: float = 0, now_ms: float = 0,
               libraries: list[bytes] | None = None) -> Iterator[list[KeyRecord]]:
    """Every key of the RDB file data (its version: from its header), a page of one db at a time, in file order;
    expiries in our clock (the file's minus shift_ms, the source's clock ahead of ours), a key expired by now_ms left
    out. Each function library's code goes to libraries (the file holds them before any key). Raises Unsplittable
    at the first record it does not know, or when data ends inside a record."""
    footer = version.to_bytes(2, "little")
    at, db, expires, end = MAGIC_SIZE, 0, 0.0, len(data)
    batch: list[KeyRecord] = []
    try:
        while at < end:
            op = data[at]
            if op < 0xF4:  # a key: its type, name, value (a short name and a string value inline: most keys)
                first = data[at + 1]
                if first < 0x40:
                    after = at + 2 + first
                    key = data[at + 2:after]
                else:
                    key, after = _string(data, at + 1)
                if op != STRING:
                    stop = _past_value(data, op, after)
                elif (first := data[after]) < 0x40:  # up to 63 bytes
                    stop = after + 1 + first
                elif first < 0x80:  # up to 16 KiB
                    stop = after + 2 + (((first & 0x3F) << 8) | data[after + 1])
                elif first == LZF and data[after + 1] < 0x40 and data[after + 2] < 0x80:  # compressed to < 64 bytes
                    stop = after + (3 if data[after + 2] < 0x40 else 4) + data[after + 1]
                else:
                    stop = _past_string(data, after)
                if stop > end:
                    raise Unsplittable("the file ends inside a key's value")
                if not expires or expires > now_ms:
                    body = TYPE_BYTES[op] + data[after:stop] + footer
                    batch.append(KeyRecord(db, key, body + crc64(body).to_bytes(8, "little"), expires))
                    if len(batch) >= page:
                        yield batch
                        batch = []
                at, expires = stop, 0.0
            elif op == EXPIRETIME_MS:
                expires = int.from_bytes(data[at + 1:at + 9], "little") - shift_ms
                at += 9
            elif op == EXPIRETIME:
                expires = 1000 * int.from_bytes(data[at + 1:at + 5], "little") - shift_ms
                at += 5
            elif op == SELECTDB:
                if batch:  # a page holds one db's keys
                    yield batch
                    batch = []
                db, at = _length(data, at + 1)
            elif op == RESIZEDB:
                _, at = _length(data, at + 1)
                _, at = _length(data, at)
            elif op == AUX:
                at = _past_string(data, _past_string(data, at + 1))
            elif op == FUNCTION2:
                code, at = _string(data, at + 1)
                if libraries is not None:
                    libraries.append(code)
            elif op == IDLE:
                _, at = _length(data, at + 1)
            elif op == FREQ:
                at += 2
            elif op == EOF:
                break
            else:
                raise Unsplittable(f"RDB opcode {op:#04x} at byte {at}")
        else:
            raise Unsplittable("the file ends before its EOF opcode")
    except IndexError as exc:
        raise Unsplittable("the file ends inside a record") from exc
    if batch:
        yield batch
