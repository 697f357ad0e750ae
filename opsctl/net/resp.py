"""RESP for deep pipelines: many commands packed into one buffer, and a reader (hiredis, in C) that turns a whole buffer
of replies into values. Pure: no sockets.

Keys stay bytes (they may hold any byte). Errors come back as RespError values: one failed command in a pipeline must
not hide the replies of the others. Why not redis-py: scans of millions of keys need replies parsed in bulk."""

from __future__ import annotations

from collections.abc import Sequence

import hiredis

from opsctl.observe.replies import Arg, Reply, RespError, TextReply


class _Incomplete:
    """What a reader's gets() returns while the next reply is incomplete (not False: `iter(gets, INCOMPLETE)`
    compares with ==, and the integer reply 0 equals False)."""


INCOMPLETE = _Incomplete()


def reader() -> hiredis.Reader:
    """A RESP2 reply reader: feed() it bytes, gets() returns the next reply or INCOMPLETE while none is whole."""
    # hiredis calls replyError with the message and returns its result (a value, not raised)
    return hiredis.Reader(replyError=RespError, notEnoughData=INCOMPLETE)


def encode(args: Sequence[Arg]) -> bytes:
    packed: bytes = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]  # the stub types a 1-tuple
    return packed


def encode_keyed(command: bytes, keys: Sequence[bytes], subcommand: bytes = b"") -> bytes:
    """The same one-key command for many keys (`STRLEN k1`, `STRLEN k2`, ...; with a subcommand
    `MEMORY USAGE k1`, ...), packed in one buffer."""
    if not keys:
        return b""
    words = (command, subcommand) if subcommand else (command,)
    head = b"*%d\r\n" % (len(words) + 1) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
    # everything before a key depends only on its length: one prefix per length, interleaved with the keys and
    # joined in C (a million keys a scan)
    lengths = list(map(len, keys))
    before = {n: b"%s$%d" % (head, n) for n in set(lengths)}
    parts = [b""] * (2 * len(keys))
    parts[0::2] = map(before.__getitem__, lengths)
    parts[1::2] = keys
    return b"\r\n".join(parts) + b"\r\n"


def text(reply: Reply) -> TextReply:
    """A reply with its strings decoded (UTF-8; a stray byte becomes U+FFFD), for replies opsctl reads as text:
    INFO, ROLE, CLUSTER NODES, CONFIG GET."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    if isinstance(reply, list):
        return [text(part) for part in reply]
    return reply


def replies(buf: bytes) -> list[Reply]:
    """Every complete reply in buf (tests and fixtures; pipes keep one reader per connection)."""
    parse = reader()
    parse.feed(buf)
    out: list[Reply] = []
    while (reply := parse.gets()) is not INCOMPLETE:
        out.append(reply)
    return out
