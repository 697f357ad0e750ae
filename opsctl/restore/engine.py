"""Stream keys from a source to the target masters: SCAN + DUMP + PEXPIRETIME out, RESTORE in, deeply pipelined.

One thread and its own connections per source. A source round trip carries a page's DUMP and PEXPIRETIME and the next
page's SCAN; RESTOREs go out before earlier replies are read. Expiries travel as absolute times moved between clocks
(read with TIME): a queued key's TTL does not stretch."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from mmap import ACCESS_READ, mmap
from operator import attrgetter
from pathlib import Path

from opsctl.backup.rdb import KeyRecord, split_keys
from opsctl.base.errors import OpsctlError
from opsctl.net.connection import Connection
from opsctl.net.rawpipe import RawPipe, refused
from opsctl.net.resp import encode
from opsctl.observe.replies import Reply, RespError
from opsctl.restore.functions import by_name, carry_functions, carry_libraries
from opsctl.restore.route import Counts, Router, expiry_of, restore_batch, same_payload, shown_key

PAGE = 1000
AHEAD = 2  # pages of RESTOREs in flight on each target before the oldest page's replies are read
TTL_SLACK_MS = 2000


@dataclass
class Targets:
    """The target masters' handles (each thread opens its own pipes on them), how keys route to them, and whether
    SELECT is allowed."""

    handles: list[Connection]
    router: Router
    cluster: bool

    @property
    def names(self) -> list[str]:
        return [handle.name for handle in self.handles]

    def open(self, index: int) -> RawPipe:
        """A pipe of the caller's own to target master index (its SELECT, its RESTOREs in flight)."""
        return self.handles[index].dedicated(self.handles[index].timeout)


@dataclass
class Source:
    key: str
    label: str
    handle: Connection | None  # a live node's, or a scratch server's (Connection.on_unix); None: a file's keys
    dbs: list[int]
    sample_every: int = 1000
    samples: list[KeyRecord] = field(default_factory=list)
    kept: set[tuple[int, bytes]] = field(default_factory=set)  # samples skip-existing left as the target had them
    confirm: Callable[[], str | None] | None = None  # a referee besides the source itself: a problem, or None
    unexpiring: frozenset[int] = frozenset()  # dbs without a key with a TTL on a source no one writes: none read

    def open(self) -> RawPipe:
        """A pipe of the caller's own to the source (a copy's thread, a side comparison)."""
        if self.handle is None:
            raise OpsctlError(f"{self.label}: no server holds it to read it back",
                              "its keys were cut from its file (opsctl.backup.rdb)")
        return self.handle.dedicated(self.handle.timeout)


class TargetPipes:
    """One thread's connections to the target masters, each on the right db. Not NodePipes: each connection carries
    its SELECTed db and its clock's offset, and RESTOREs stay in flight on it across pages (opsctl.net.rawpipe)."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets
        self.pipes = [targets.open(i) for i in range(len(targets.names))]
        self.offsets = [_clock_offset(pipe) for pipe in self.pipes]
        self.db = 0

    def select(self, db: int) -> None:
        if db != self.db:
            for pipe in self.pipes:
                _ok(pipe.call("SELECT", db), pipe.label, "SELECT")
            self.db = db

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.close()


def _clock_offset(pipe: RawPipe) -> float:
    """The target's clock minus ours, in ms (off by at most half a round trip)."""
    before = time.time()
    reply = _ok(pipe.call("TIME"), pipe.label, "TIME")
    after = time.time()
    if not (isinstance(reply, list) and len(reply) == 2 and all(isinstance(p, bytes) for p in reply)):
        raise OpsctlError(f"unexpected TIME reply from {pipe.label}")
    theirs = int(reply[0]) * 1000 + int(reply[1]) / 1000  # type: ignore[arg-type]
    return theirs - (before + after) * 500


def _ok(reply: Reply, where: str, doing: str) -> Reply:
    """reply, where an error reply raises NodeRefused naming what failed where."""
    return refused(reply, f"{doing} failed on {where}")


def scan_reply(reply: Reply, label: str) -> tuple[bytes, list[bytes]]:
    _ok(reply, label, "SCAN")
    if not (isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], bytes)
            and isinstance(reply[1], list)):
        raise OpsctlError(f"unexpected SCAN reply from {label}")
    return reply[0], [k for k in reply[1] if isinstance(k, bytes)]


def pages(src: RawPipe, db: int, label: str, expiries: bool = True) -> Iterator[list[KeyRecord]]:
    """The source's keys in db, a page at a time, with payload and remaining TTL (gone or expired: left out).
    The next page's DUMPs go out before this page is handed over: the source reads them while the caller writes.
    expiries False: none is read (a db its server says holds no key with a TTL, and no one writes)."""
    scan = src.name("SCAN")
    _ok(src.call("SELECT", db), label, "SELECT")
    offset = _clock_offset(src)
    absolute = not isinstance(src.call("PEXPIRETIME", b"opsctl:probe"), RespError)  # Redis 6.2 lacks it
    pttl = src.name("PEXPIRETIME" if absolute else "PTTL") if expiries else None
    ask = _asker(src, scan, src.name("DUMP"), pttl)
    src.send(encode([scan, b"0", b"COUNT", PAGE]))
    cursor, keys = scan_reply(src.read(1)[0], label)
    more = ask(keys, cursor)
    while True:
        replies = src.read((2 if expiries else 1) * len(keys) + (1 if more else 0))
        now = time.time() * 1000
        page_keys = keys
        if more:
            cursor, keys = scan_reply(replies[-1], label)
            following = ask(keys, cursor)
        expiry = partial(expiry_of, absolute=absolute, offset_ms=offset, now_ms=now) if expiries else None
        yield _page(db, page_keys, replies, label, expiry)
        if not more:
            return
        more = following


def _asker(src: RawPipe, scan: bytes, dump: bytes, pttl: bytes | None) -> Callable[[list[bytes], bytes], bool]:
    """Sends each key's DUMP and expiry (pttl None: no expiry), then the SCAN after cursor (none once it is 0);
    says whether it did."""
    dump_head = b"*2\r\n$%d\r\n%s\r\n" % (len(dump), dump)
    pttl_head = b"" if pttl is None else b"*2\r\n$%d\r\n%s\r\n" % (len(pttl), pttl)

    def ask(keys: list[bytes], cursor: bytes) -> bool:
        more = cursor != b"0"
        if pttl is None:
            out = b"".join(b"%s$%d\r\n%s\r\n" % (dump_head, len(k), k) for k in keys)
        else:
            out = b"".join(b"%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (dump_head, len(k), k, pttl_head, len(k), k)
                           for k in keys)
        src.send(out + (encode([scan, cursor, b"COUNT", PAGE]) if more else b""))
        return more
    return ask


def _page(db: int, keys: list[bytes], replies: list[Reply], label: str,
          expiry: Callable[[Reply], float | None] | None) -> list[KeyRecord]:
    """expiry None: the replies are DUMPs only, every key without a TTL. replies may go on past the keys' (the next
    page's SCAN)."""
    count = len(keys)
    if expiry is None:
        page = [KeyRecord(db, key, payload, 0.0) for key, payload in zip(keys, replies[:count], strict=True)
                if isinstance(payload, bytes)]
        if len(page) < count:
            _refused_dump(replies[:count], label)
        return page
    page = []
    for key, payload, ttl in zip(keys, replies[0:2 * count:2], replies[1:2 * count:2], strict=True):
        expires = expiry(ttl)
        if isinstance(payload, bytes) and expires is not None:
            page.append(KeyRecord(db, key, payload, expires))
        elif isinstance(payload, RespError):
            raise OpsctlError(f"DUMP failed on {label}", payload.message)
    return page


def _refused_dump(replies: list[Reply], label: str) -> None:
    """A DUMP that answered an error (a key gone meanwhile answers nil and is left out)."""
    error = next((r for r in replies if isinstance(r, RespError)), None)
    if error is not None:
        raise OpsctlError(f"DUMP failed on {label}", error.message)


@dataclass
class _Sent:
    per_target: list[list[KeyRecord]]


def _send(tp: TargetPipes, page: Sequence[KeyRecord], replace: bool) -> _Sent:
    """RESTORE each entry on its target, with its expiry in the target's clock."""
    routed = tp.targets.router.split(page, attrgetter("key"), len(tp.pipes))
    for pipe, offset, entries in zip(tp.pipes, tp.offsets, routed, strict=True):
        if entries:
            pipe.send(restore_batch(pipe.name("RESTORE"), entries, offset, replace))
    return _Sent(routed)


def _collect(tp: TargetPipes, sent: _Sent, mode: str, counts: Counts, compare: Side,
             source: Source) -> None:
    for index, (pipe, entries) in enumerate(zip(tp.pipes, sent.per_target, strict=True)):
        if not entries:
            continue
        replies = pipe.read(len(entries))
        restored = replies.count(b"OK")  # counted in C: a copy reads a million OKs
        counts.restored += restored
        if restored == len(entries):
            continue
        busy = []
        for entry, reply in zip(entries, replies, strict=True):
            if reply == b"OK":
                continue
            if isinstance(reply, RespError) and reply.message.startswith("BUSYKEY"):
                busy.append(entry)
            else:
                message = reply.message if isinstance(reply, RespError) else repr(reply)
                raise OpsctlError(f"RESTORE of {shown_key(entry.key)!r} failed on {pipe.label}", message,
                                  restore_hint(message))
        if busy:
            _settle_busy(busy, mode, counts, compare, index, source)


def restore_hint(message: str) -> str:
    if message.startswith(("MOVED", "ASK", "CLUSTERDOWN")):
        return "the target cluster changed during the restore: re-run the same command when it is stable (it resumes)"
    if message.startswith("OOM"):
        return "the target ran out of memory: give it more maxmemory or masters, then re-run (it resumes)"
    return "re-run the same command to resume; `opsctl status -f SPEC` shows the target"


def _settle_busy(busy: list[KeyRecord], mode: str, counts: Counts, side: Side, target: int, source: Source) -> None:
    """Keys already on the target: equal to the source (a resumed run wrote them) counts as restored. Read on
    side connections: the main ones have the next page's RESTOREs in flight. A sampled key skip-existing keeps
    is left out of the value checks (source.kept)."""
    for entry, reply in zip(busy, side.dumps(target, busy), strict=True):
        if isinstance(reply, bytes) and (same_payload(reply, entry.payload) or side.equal(entry, target)):
            counts.existing += 1
        elif mode == "skip-existing":
            counts.skipped += 1
            source.kept.add((entry.db, entry.key))
        else:
            counts.conflicts += 1
            if len(counts.conflict_keys) < 5:
                counts.conflict_keys.append(shown_key(entry.key))


def _settle(tp: TargetPipes, sent: _Sent, mode: str, counts: Counts, compare: Side, source: Source,
            progress: Callable[[int], None]) -> None:
    _collect(tp, sent, mode, counts, compare, source)
    progress(sum(map(len, sent.per_target)))


def copy_source(source: Source, targets: Targets, mode: str, progress: Callable[[int], None],
                compare: Side) -> Counts:
    """Every key of source onto the targets; the counts say what happened to each."""
    src = source.open()
    try:
        read = (page for db in source.dbs for page in pages(src, db, source.label, db not in source.unexpiring))
        return copy_pages(read, partial(carry_functions, src), source, targets, mode, progress, compare)
    finally:
        src.close()


def copy_snapshot_file(rdb: Path, version: int, shift_ms: float, source: Source, targets: Targets, mode: str,
                       progress: Callable[[int], None], compare: Side,
                       screen: Callable[[Iterable[list[KeyRecord]]], Iterable[list[KeyRecord]]] = iter) -> Counts:
    """Every key of an RDB file onto the targets, its payloads cut from the file (opsctl.backup.rdb.split_keys): no
    server loads it. Unsplittable (a module's value, a newer type) before or after some keys were written: the
    caller copies it another way (RESTORE ... REPLACE writes the same keys again). screen: sees each page first
    (refuses what the caller cannot take)."""
    codes: list[bytes] = []
    with open(rdb, "rb") as handle, mmap(handle.fileno(), 0, access=ACCESS_READ) as data:
        read = split_keys(data, version, page=PAGE, shift_ms=shift_ms, now_ms=time.time() * 1000, libraries=codes)
        first = next(read, None)  # the file holds every library before its first key
        pages_read = screen(chain([first] if first else [], read))
        return copy_pages(pages_read, partial(carry_libraries, by_name(codes), source.label), source, targets,
                          mode, progress, compare)


def copy_pages(read: Iterable[list[KeyRecord]], functions: Callable[[list[RawPipe]], int], source: Source,
               targets: Targets, mode: str, progress: Callable[[int], None], compare: Side) -> Counts:
    """The keys read (pages of one db each) onto the targets, after the function libraries (functions: carries
    them onto the target pipes, returns how many the source holds)."""
    counts = Counts()
    tp = TargetPipes(targets)
    seen = 0
    pending: deque[_Sent] = deque()
    try:
        counts.libraries = functions(tp.pipes)
        for page in read:
            db = page[0].db
            if db != tp.db:
                while pending:  # a SELECT's reply must not land among RESTOREs' in flight
                    _settle(tp, pending.popleft(), mode, counts, compare, source, progress)
                tp.select(db)
            counts.scanned[db] = counts.scanned.get(db, 0) + len(page)
            if db not in source.unexpiring:
                counts.volatile += len(page) - [entry.expires for entry in page].count(0)
            # every sample_every-th key read, counting across pages
            source.samples += page[(-seen - 1) % source.sample_every::source.sample_every]
            seen += len(page)
            pending.append(_send(tp, page, mode == "replace"))
            if len(pending) > AHEAD:
                _settle(tp, pending.popleft(), mode, counts, compare, source, progress)
        while pending:
            _settle(tp, pending.popleft(), mode, counts, compare, source, progress)
    finally:
        tp.close()
    return counts


def first_entries(source: Source, count: int) -> list[KeyRecord]:
    """Up to count of the source's keys, from its first SCAN pages (hash order: a spread of its keys): samples
    for a source an earlier run copied, whose copy's samples went with it."""
    src = source.open()
    taken: list[KeyRecord] = []
    try:
        for db in source.dbs:
            for page in pages(src, db, source.label):
                taken += page[: count - len(taken)]
                if len(taken) >= count:
                    return taken
    finally:
        src.close()
    return taken


# --- comparing values ------------------------------------------------------------------------------------------

VALUE_COMMANDS: dict[bytes, tuple[str, ...]] = {
    b"string": ("GET",), b"hash": ("HGETALL",), b"list": ("LRANGE", "0", "-1"), b"set": ("SMEMBERS",),
    b"zset": ("ZRANGE", "0", "-1", "WITHSCORES"), b"stream": ("XRANGE", "-", "+"),
}
UNORDERED = (b"hash", b"set")


def value_of(pipe: RawPipe, db: int, key: bytes) -> object:
    """A key's value in a form that compares equal across servers and encodings (hash/set order ignored)."""
    _ok(pipe.call("SELECT", db), pipe.label, "SELECT")
    kind = pipe.call("TYPE", key)
    command = VALUE_COMMANDS.get(kind if isinstance(kind, bytes) else b"")
    if command is None:
        return (kind, pipe.call("DUMP", key))
    reply = pipe.call(command[0], key, *command[1:])
    if kind == b"hash" and isinstance(reply, list):
        return (kind, sorted(zip(reply[::2], reply[1::2], strict=True)))
    if kind in UNORDERED and isinstance(reply, list):
        return (kind, sorted(reply))  # type: ignore[type-var]
    return (kind, reply)


def compare_page(tp: TargetPipes, page: Sequence[KeyRecord], compare: Side, kept: bool = False) -> list[str]:
    """Each entry's key on its target: there (unless its TTL ran out), the same value, about the same TTL.
    kept: any of them may be a key skip-existing left as the target had it, so only presence is checked."""
    routed = tp.targets.router.split(page, attrgetter("key"), len(tp.pipes))
    problems = []
    for index, (pipe, entries) in enumerate(zip(tp.pipes, routed, strict=True)):
        if not entries:
            continue
        dump, pttl = pipe.name("DUMP"), pipe.name("PTTL")
        pipe.send(b"".join(encode([dump, e.key]) + encode([pttl, e.key]) for e in entries))
        replies = pipe.read(2 * len(entries))
        now = time.time() * 1000
        for i, entry in enumerate(entries):
            equal = partial(compare.equal, entry, index)
            problem = _entry_problem(entry, replies[2 * i], replies[2 * i + 1], now, equal)
            if problem and not (kept and replies[2 * i] is not None):
                problems.append(f"{pipe.label}: {shown_key(entry.key)!r}: {problem}")
    return problems


def _entry_problem(entry: KeyRecord, payload: Reply, pttl: Reply, now: float, equal: Callable[[], bool]) -> str | None:
    left = entry.expires - now if entry.expires else None
    if payload is None:
        return None if left is not None and left < TTL_SLACK_MS else "missing on the target"
    if not isinstance(payload, bytes) or not (same_payload(payload, entry.payload) or equal()):
        return "value differs from the source"
    if left is None:
        return None if pttl == -1 else f"has a TTL ({pttl!r} ms) the source key does not have"
    if not isinstance(pttl, int) or pttl < 0 or abs(pttl - left) > TTL_SLACK_MS:
        return f"TTL {pttl!r} ms, expected about {left:.0f} ms"
    return None


class Side:
    """Side connections of one source's thread, opened on first use: DUMPs of keys found on a target, and the
    slow, exact comparison (both values read in an order-free form: a big hash or set serializes in hash-table
    order, which differs from server to server)."""

    def __init__(self, open_source: Callable[[], RawPipe], open_target: Callable[[int], RawPipe]) -> None:
        self.open_source, self.open_target = open_source, open_target
        self.src: RawPipe | None = None
        self.pipes: dict[int, RawPipe] = {}

    def target(self, index: int) -> RawPipe:
        if index not in self.pipes:
            self.pipes[index] = self.open_target(index)
        return self.pipes[index]

    def dumps(self, index: int, entries: Sequence[KeyRecord]) -> list[Reply]:
        """DUMP of each entry's key on target index; the entries come from one page, so from one db."""
        pipe = self.target(index)
        _ok(pipe.call("SELECT", entries[0].db), pipe.label, "SELECT")
        pipe.send(b"".join(encode([pipe.name("DUMP"), e.key]) for e in entries))
        return pipe.read(len(entries))

    def equal(self, entry: KeyRecord, index: int) -> bool:
        if self.src is None:
            self.src = self.open_source()
        return value_of(self.src, entry.db, entry.key) == value_of(self.target(index), entry.db, entry.key)

    def close(self) -> None:
        for pipe in [*self.pipes.values(), *([self.src] if self.src else [])]:
            pipe.close()
