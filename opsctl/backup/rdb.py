"""From an RDB file's head, without loading it: db 0's key counts (RESIZEDB, exact at the fork, when db 0 comes
first) and the replication position the saving server wrote (aux repl-id/repl-offset). Pure; None when the head
does not say."""

from __future__ import annotations

AUX, FUNCTION2, SELECTDB, RESIZEDB, EOF = 0xFA, 0xF5, 0xFE, 0xFB, 0xFF
MAGIC_SIZE = 9


class _Short(Exception):
    """The head ends before the answer: read more, or load the file."""


class _Head:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, MAGIC_SIZE

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Short
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, count: int) -> bytes:
        if self.pos + count > len(self.data):
            raise _Short
        self.pos += count
        return self.data[self.pos - count:self.pos]

    def length(self) -> tuple[int, bool]:
        """(length, special): a special length is a string's integer or LZF encoding."""
        first = self.byte()
        kind = first >> 6
        if kind == 0:
            return first & 0x3F, False
        if kind == 1:
            return ((first & 0x3F) << 8) | self.byte(), False
        if kind == 3:
            return first & 0x3F, True
        if first == 0x80:
            return int.from_bytes(self.take(4), "big"), False
        if first == 0x81:
            return int.from_bytes(self.take(8), "big"), False
        raise _Short

    def string(self) -> bytes:
        """A string as the server wrote it: raw, or an integer encoding given as its digits (LZF: _Short)."""
        size, special = self.length()
        if not special:
            return self.take(size)
        if size in (0, 1, 2):
            return str(int.from_bytes(self.take(1 << size), "little", signed=True)).encode()
        raise _Short

    def skip_string(self) -> None:
        size, special = self.length()
        if not special:
            self.take(size)
        elif size in (0, 1, 2):
            self.take(1 << size)  # an 8, 16 or 32 bit integer
        elif size == 3:
            compressed, _ = self.length()
            self.length()
            self.take(compressed)
        else:
            raise _Short


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
                if reader.length() != (0, False):
                    return None
            elif op == RESIZEDB:
                keys, _ = reader.length()
                expires, _ = reader.length()
                return keys, expires
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
