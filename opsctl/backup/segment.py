"""One segment of a shard's archived stream: file format, object name, chaining, the cut at a time. Pure.

A magic line, a JSON header line, then per command `<end offset> <arrival µs> <size>\\n` and its RESP; the name
carries the offsets and the file's sha256, so a changed or cut segment is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import frozen
from opsctl.base.record import DataMismatch, Range, Versioned, stored_time
from opsctl.stream.framing import MAX_OFFSET, Entry, StreamProtocolError, frame, is_heartbeat

MAGIC = b"OPSCTL-SEGMENT 1\n"
SUFFIX = ".seg"
_NAME = re.compile(r"^([0-9]{20})-([0-9]{20})-([0-9a-f]{64})\.seg$")
_RECORD = re.compile(rb"^([0-9]{1,20}) ([0-9]{1,20}) ([0-9]{1,10})$")
DAMAGED = "the archive is damaged or was edited: restore to an earlier time, or from another archive"


@dataclass(frozen=True)
class SegmentName:
    start: int  # the replication offset before its first command
    end: int  # after its last
    sha256: str  # of the whole file

    @property
    def text(self) -> str:
        return f"{self.start:020d}-{self.end:020d}-{self.sha256}{SUFFIX}"


Offset = Annotated[int, Range(0, MAX_OFFSET)]  # a replication offset, or a count of commands


@frozen
class Header(Versioned):
    """first/last: arrival (time.time() when the archiver read them) of its first and last command; closed: when
    the archiver closed it (nothing read before then is missing from it or its predecessors); resumed: the first
    segment of an archiver that (re)attached, whose commands may have been written while none ran. Its format's
    version is the magic line's; read back by its types."""

    shard: Offset
    replid: str
    start: Offset
    end: Offset
    first: float
    last: float
    closed: float
    entries: Offset
    resumed: bool


def parse_name(name: str) -> SegmentName | None:
    """The segment a file name (its last path part) names, or None for anything else."""
    match = _NAME.match(name.rpartition("/")[2])
    if match is None:
        return None
    return SegmentName(int(match.group(1)), int(match.group(2)), match.group(3))


def _resp(args: Sequence[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _record(entry: Entry) -> bytes:
    command = _resp(entry.args)
    return b"%d %d %d\n%s" % (entry.end, round(entry.arrived * 1e6), len(command), command)


def encode_segment(shard: int, replid: str, start: int, entries: Sequence[Entry], closed: float,
                   resumed: bool) -> tuple[SegmentName, bytes]:
    """A segment of entries (at least one) that follow offset start."""
    header = Header(shard, replid, start, entries[-1].end, entries[0].arrived, entries[-1].arrived, closed,
                    len(entries), resumed)
    body = b"".join(_record(e) for e in entries)
    data = MAGIC + json.dumps(header.to_json(), separators=(",", ":")).encode() + b"\n" + body
    return SegmentName(start, header.end, hashlib.sha256(data).hexdigest()), data


def decode_segment(name: SegmentName, data: bytes, where: str) -> tuple[Header, list[Entry]]:
    """The header and commands of a segment, checked against its name: checksum, offsets, count, chaining of each
    command's end offset. A SegmentProblem naming `where` otherwise."""
    if hashlib.sha256(data).hexdigest() != name.sha256:
        raise SegmentProblem(where, "its sha256 differs from the one in its name (changed or cut short)")
    if not data.startswith(MAGIC):
        raise SegmentProblem(where, "is not an opsctl stream segment")
    line_end = data.find(b"\n", len(MAGIC))
    if line_end < 0:
        raise SegmentProblem(where, "has no header line")
    header = _header(data[len(MAGIC):line_end], where)
    if (header.start, header.end) != (name.start, name.end):
        raise SegmentProblem(where, f"says offsets {header.start}..{header.end}, its name {name.start}..{name.end}")
    entries = _entries(data, line_end + 1, header, where)
    if len(entries) != header.entries or not entries or entries[-1].end != header.end:
        raise SegmentProblem(where, f"holds {len(entries)} commands ending at {entries[-1].end if entries else '-'}; "
                                    f"its header says {header.entries} ending at {header.end}")
    return header, entries


def _header(raw: bytes, where: str) -> Header:
    try:
        header = Header.from_json(json.loads(raw))
    except DataMismatch as exc:  # the field and what it holds instead, never its value
        raise SegmentProblem(where, f"has a header that is not one: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise SegmentProblem(where, f"has an unreadable header ({exc})") from None
    if header.end <= header.start:
        raise SegmentProblem(where, "has a header with impossible offsets")
    now = time.time()
    if any(stored_time(t, now) is None for t in (header.first, header.last, header.closed)):
        raise SegmentProblem(where, "has a header whose times are not times from 1970 to now")
    return header


def _entries(data: bytes, at: int, header: Header, where: str) -> list[Entry]:
    entries: list[Entry] = []
    offset, now = header.start, time.time()
    while at < len(data):
        eol = data.find(b"\n", at)
        match = _RECORD.match(data[at:eol]) if eol > 0 else None
        if match is None:
            raise SegmentProblem(where, f"has a damaged record at byte {at}")
        size = int(match.group(3))
        try:
            framed, used = frame(data[eol + 1:eol + 1 + size], 0)
        except (StreamProtocolError, ValueError):
            raise SegmentProblem(where, f"has a damaged command at byte {eol + 1}") from None
        if len(framed) != 1 or used != size:
            raise SegmentProblem(where, f"has a damaged or cut command at byte {eol + 1}")
        end = int(match.group(1))
        if end <= offset:
            raise SegmentProblem(where, f"command {len(entries) + 1} ends at {end}, not after {offset}")
        arrived = stored_time(int(match.group(2)) / 1e6, now)
        if arrived is None or end > MAX_OFFSET:
            raise SegmentProblem(where, f"command {len(entries) + 1} has an impossible time or offset")
        entries.append(Entry(framed[0][0], end, arrived))
        offset, at = end, eol + 1 + size
    return entries


class SegmentProblem(OpsctlError):
    """A segment that cannot be trusted, named."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}", hint=DAMAGED)


# --- chains and cuts ---------------------------------------------------------------------------------------------


def chain(start: int, names: Sequence[SegmentName], where: str) -> list[SegmentName]:
    """The segments that follow offset start without a hole, in order; a hole or an overlap is an OpsctlError
    naming the offsets missing (a segment lost or deleted: the stream after it cannot be replayed)."""
    ordered = sorted(set(names), key=lambda n: (n.start, n.end))
    out: list[SegmentName] = []
    at = start
    for name in ordered:
        if name.end <= at:
            continue  # before the base: written by a run that took this base again
        if name.start != at:
            raise SegmentProblem(where, f"the stream has a hole: offsets {at}..{name.start} are in no segment")
        out.append(name)
        at = name.end
    return out


def cut(entries: Sequence[Entry], until: float) -> int:
    """How many of entries to apply for a restore to time `until`: those read by then, never ending inside a
    MULTI ... EXEC (a transaction is applied whole or not at all)."""
    keep, depth = 0, 0
    for i, entry in enumerate(entries):
        if entry.arrived > until:
            break
        word = entry.args[0].upper() if entry.args else b""
        depth = 1 if word == b"MULTI" else 0 if word in (b"EXEC", b"DISCARD") else depth
        if depth == 0:
            keep = i + 1
    return keep


def applied(entries: Sequence[Entry]) -> list[tuple[bytes, ...]]:
    """The commands a replay runs: the link's own traffic (PING, REPLCONF) left out."""
    return [e.args for e in entries if not is_heartbeat(e.args)]
